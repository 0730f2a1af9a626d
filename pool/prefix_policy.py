"""The ``prefix_cache`` routing policy: send a prompt where its beginning is cached.

For ``local`` and ``remote`` model workers (engines with a prefix cache):

1. an *explicit* session (a header, ``previous_response_id``, a body
   ``session_id``, a ``prompt_cache_key``) goes through session affinity as
   under ``session_affinity``: the client said these requests belong together;
2. otherwise the worker holding the longest prefix of the rendered prompt
   (:class:`~pool.prefix.PrefixIndex`), if that prefix is at least
   ``min_match`` characters: a ``prefix_hit`` (ties: the least loaded);
3. unless load says otherwise: when that worker holds more than
   ``imbalance_abs`` requests more than the least loaded one and more than
   ``imbalance_rel`` times as many, the least loaded takes it (a
   ``load_move``; the same thresholds as affinity's);
4. no prefix long enough (a ``prefix_miss``): the worker remembering the
   fewest blocks (SGLang's "smallest tree": a new prompt evicts nobody's),
   then the least loaded (ties broken by hashing the prompt's first block), and
   the load test of 3 applies to that choice too.

Whatever was chosen — also when admission left only one free worker and no
policy ran — the gateway reports it with :meth:`PrefixCacheAware.placed`, and
the prompt's blocks are recorded for that worker; a worker seen restarted
(its ``restarts`` grew) starts with nothing remembered. ``cli`` workers keep no
prefix cache we could use: a model served by them is routed by affinity alone.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .model import ChatRequest
from .prefix import PrefixIndex, block_chain, render_prompt
from .routing import LeastInFlight, SessionAffinity, lighter
from .worker import Worker

__all__ = ["PrefixCacheAware"]


class PrefixCacheAware:
    def __init__(self, affinity: SessionAffinity, fallback: LeastInFlight, *,
                 in_flight: Callable[[str], int], block_chars: int = 128,
                 min_match: int = 256, max_blocks: int = 20_000, max_age: float = 600.0,
                 imbalance_abs: int = 2, imbalance_rel: float = 1.5) -> None:
        self._affinity = affinity
        self._fallback = fallback
        self._in_flight = in_flight
        self._block = block_chars
        self._min_blocks = max(1, -(-min_match // block_chars))
        self._imbalance = (imbalance_abs, imbalance_rel)
        self.index = PrefixIndex(max_blocks=max_blocks, max_age=max_age)
        # the request choose() just hashed, and its chain (held, not its id: ids are reused)
        self._last: tuple[ChatRequest | None, list[bytes]] = (None, [])
        self._restarts: dict[str, int] = {}  # worker -> restarts when last seen
        self._hits = self._misses = self._load_moves = self._sessions = 0
        self._matched_chars = 0

    async def choose(self, request: ChatRequest, session: str | None,
                     workers: Sequence[Worker]) -> Worker:
        if (session is not None and not self._affinity.implicit(session)) or any(
                _is_cli(w) for w in workers):
            self._sessions += 1
            return await self._affinity.choose(request, session, workers)
        self._forget_restarted(workers)
        chain = self._chain(request)
        depth, holders = self.index.longest(chain, [w.name for w in workers])
        if depth < self._min_blocks:
            self._misses += 1
            best = self._roomiest(chain, workers)
        else:
            held = [w for w in workers if w.name in holders]
            best = min(held, key=lambda w: self._in_flight(w.name))
            self._matched_chars += depth * self._block
        moved = lighter(best, workers, self._in_flight, *self._imbalance)
        if moved is not None:
            self._load_moves += 1
            return moved
        if depth >= self._min_blocks:
            self._hits += 1
        return best

    async def held_by(self, request: ChatRequest, session: str | None) -> str | None:
        """As affinity's: sessions, explicit and of cli workers, are bound there."""
        return await self._affinity.held_by(request, session)

    def _forget_restarted(self, workers: Sequence[Worker]) -> None:
        """A restarted worker's engine starts with an empty cache: forget what it held."""
        seen = self._restarts
        for worker in workers:
            restarts = getattr(worker, "restarts", 0)
            if seen.setdefault(worker.name, restarts) != restarts:
                seen[worker.name] = restarts
                self.index.forget(worker.name)

    def _roomiest(self, chain: list[bytes], workers: Sequence[Worker]) -> Worker:
        """For a prompt nobody holds: the worker remembering the fewest blocks
        (SGLang's "smallest tree": the most cache to spare, and a new prompt
        does not evict another's), then the least loaded; ties by the prompt's
        first block, so equal prompts agree."""
        sizes = self.index.sizes()
        fewest = min(sizes.get(w.name, 0) for w in workers)
        roomy = [w for w in workers if sizes.get(w.name, 0) == fewest]
        return self._fallback.pick(chain[0].hex() if chain else None, roomy)

    def placed(self, request: ChatRequest, worker: Worker) -> None:
        """``request`` went to ``worker``: its prompt's blocks are now (likely) cached there."""
        if not _is_cli(worker):
            self.index.insert(worker.name, self._chain(request))
        self._last = (None, [])

    def _chain(self, request: ChatRequest) -> list[bytes]:
        # choose() and placed() see the same request object back to back: hash it once
        last, chain = self._last
        if last is not request:
            chain = block_chain(render_prompt(request), self._block)
            self._last = (request, chain)
        return chain

    def stats(self) -> dict[str, int]:
        return {"prefix_hits": self._hits, "prefix_misses": self._misses,
                "load_moves": self._load_moves, "sessions": self._sessions}

    def prefix_stats(self) -> dict[str, object]:
        """For metrics: characters matched in total, blocks held per worker, evictions."""
        return {"matched_chars": self._matched_chars, "blocks": self.index.sizes(),
                "evicted": self.index.evicted}



def _is_cli(worker: Worker) -> bool:
    return getattr(worker, "kind", None) == "cli"
