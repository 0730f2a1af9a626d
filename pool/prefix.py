"""Which worker served which prompt prefixes lately: an approximate prefix tree.

An engine with a prefix cache (vLLM, SGLang, llama.cpp) answers a prompt
faster when it computed the same beginning recently. The router cannot see
those caches, so it keeps its own approximation of them, as vLLM's
production-stack router and SGLang's cache-aware router do:

* the prompt is *rendered* to text that grows only at its end as a
  conversation grows (system, tools, then each message with its role), so a
  later turn's rendering starts with the earlier turn's;
* the rendering is cut into fixed blocks of ``block_chars`` characters and
  each full block is hashed together with the hash before it (a *hashed
  block chain*): the i-th hash stands for the whole prefix up to block i, so
  a set of hashes is a tree of prefixes and one dict lookup per block walks it;
* per worker, the hashes it was sent are kept in LRU order with the time they
  were last used, at most ``max_blocks`` of them (bounded memory), and
  forgotten after ``max_age`` seconds (an engine's cache does not keep them
  for ever either).

:meth:`PrefixIndex.longest` answers which of the given workers hold the
longest prefix of a chain. A prompt's blocks are touched last block first, so
its earliest blocks — those more prompts share — are the last to be evicted.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from hashlib import blake2b
from typing import Callable, Iterable, Sequence

from .model import ChatRequest, ImagePart, ReasoningPart, TextPart, ToolCallPart, ToolResultPart

__all__ = ["PrefixIndex", "render_prompt", "block_chain"]


def render_prompt(request: ChatRequest) -> str:
    """The request's prompt as text that only grows at its end turn by turn."""
    if request.prompt_ids is not None:
        return "\x1eids\x1f" + ",".join(map(str, request.prompt_ids))
    if request.prompt is not None:
        return "\x1eprompt\x1f" + request.prompt
    out: list[str] = []
    system = [m for m in request.messages if m.role in ("system", "developer")]
    # system messages first, wherever a client put them: templates hoist them too
    for message in system:
        out.append(f"\x1e{message.role}\x1f")
        _render_parts(message.parts, out)
    for tool in request.tools:
        out.append(f"\x1etool\x1f{tool.name}\x1f{tool.description or ''}\x1f{tool.parameters!r}")
    for message in request.messages:
        if message.role in ("system", "developer"):
            continue
        out.append(f"\x1e{message.role}\x1f")
        _render_parts(message.parts, out)
    return "".join(out)


def _render_parts(parts: Iterable[object], out: list[str]) -> None:
    for part in parts:
        if isinstance(part, TextPart):
            out.append(part.text)
        elif isinstance(part, ToolCallPart):
            out.append(f"\x1dcall\x1f{part.name}\x1f{part.arguments}")
        elif isinstance(part, ToolResultPart):
            out.append("\x1dresult\x1f")
            _render_parts(part.content, out)
        elif isinstance(part, ImagePart):
            out.append(f"\x1dimage\x1f{part.url or ''}{len(part.data or '')}")
        elif isinstance(part, ReasoningPart):
            out.append("\x1dthinking\x1f" + part.text)


def block_chain(text: str, block_chars: int) -> list[bytes]:
    """One 8-byte hash per full block of ``text``, each over the previous hash
    and the block: equal hashes at position i mean equal prefixes up to i."""
    chain: list[bytes] = []
    previous = b""
    for start in range(0, len(text) - block_chars + 1, block_chars):
        block = text[start:start + block_chars].encode("utf-8", "surrogatepass")
        previous = blake2b(previous + block, digest_size=8).digest()
        chain.append(previous)
    return chain


class PrefixIndex:
    """Per worker, the block hashes of the prompts it was sent lately."""

    def __init__(self, *, max_blocks: int, max_age: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max_blocks = max_blocks
        self._max_age = max_age
        self._clock = clock
        self._workers: dict[str, OrderedDict[bytes, float]] = {}
        self.evicted = 0

    def insert(self, worker: str, chain: Sequence[bytes]) -> None:
        """``worker`` was sent a prompt with ``chain``."""
        if not chain:
            return
        blocks = self._workers.setdefault(worker, OrderedDict())
        now = self._clock()
        for digest in reversed(chain):  # the first blocks end up most recent
            blocks[digest] = now
            blocks.move_to_end(digest)
        self._evict(blocks, now)

    def longest(self, chain: Sequence[bytes], workers: Iterable[str]) -> tuple[int, list[str]]:
        """``(blocks, holders)``: how many leading blocks of ``chain`` the best of
        ``workers`` holds, and which of them hold that many (``(0, [])``: none)."""
        oldest = self._clock() - self._max_age
        alive = [(name, self._workers[name]) for name in workers if name in self._workers]
        depth = 0
        holders: list[str] = []
        for digest in chain:
            still = [(name, blocks) for name, blocks in alive
                     if blocks.get(digest, -1.0) >= oldest]
            if not still:
                break
            alive = still
            depth += 1
            holders = [name for name, _ in still]
        return depth, holders

    def forget(self, worker: str) -> None:
        """``worker`` lost its cache (restarted) or left."""
        self._workers.pop(worker, None)

    def sizes(self) -> dict[str, int]:
        """Blocks held per worker (each about 150 bytes)."""
        return {name: len(blocks) for name, blocks in self._workers.items()}

    def _evict(self, blocks: OrderedDict[bytes, float], now: float) -> None:
        oldest = now - self._max_age
        while blocks:
            digest, used = next(iter(blocks.items()))
            if len(blocks) <= self._max_blocks and used >= oldest:
                break
            del blocks[digest]
            self.evicted += 1
