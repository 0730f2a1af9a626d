"""The seam between poolgate's chat layer and an inference engine.

An engine works in token ids only. Everything above ids (chat template,
incremental detokenisation, stop strings, tool-call parsing, events) lives in
:mod:`pool.local.chat`, once for every engine, so all engines behave alike.

Engines run inside the worker child process (never the gateway). Their
blocking work runs in threads: the child's event loop must stay free to answer
the gateway's pings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Protocol, Sequence

from ..errors import (BadRequest, EngineFailed, EngineUnavailable, GatewayError, Overloaded,
                      UpstreamTimeout, UpstreamUnavailable)

__all__ = ["GenParams", "Step", "Tokenizer", "Engine", "EngineError"]


class EngineError(Exception):
    """The engine cannot serve a request.

    ``status`` says whose fault it is: a 4xx is the client's (bad parameter,
    context overflow; ``param`` names the parameter), a 5xx the engine's
    (503: not loaded or its server gone, 502: its server broke off, 504: it
    went silent, 500: generation failed). :meth:`gateway_error` maps it."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status

    def gateway_error(self, param: str | None = None) -> GatewayError:
        """The error the client sees; ``param`` names the client's parameter
        when the engine refused the input without saying which. A 5xx is the
        worker's failure: the gateway retries it elsewhere and cools it down."""
        status = self.status
        if status == 429:
            return Overloaded(self.message, retry_after=1)
        if 400 <= status < 500:
            return BadRequest(self.message, param=self.param or param)
        if status == 503:
            return EngineUnavailable(self.message)
        if status == 504:
            return UpstreamTimeout(self.message)
        if status == 502:
            return UpstreamUnavailable(self.message)
        return EngineFailed(self.message)


@dataclass(frozen=True, slots=True)
class GenParams:
    """Sampling for one sequence. ``temperature == 0`` means greedy.

    ``top_logprobs`` is how many alternatives to report per step (0: none);
    ``logprobs`` whether to report the chosen token's logprob at all. Engines
    stop by themselves only at ``max_tokens`` or a token in ``stop_ids``;
    stop *strings* are the chat layer's job (it closes the iterator)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stop_ids: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Step:
    """One generated token. ``logprob`` is log p(token) under the model's raw
    (temperature-1, unfiltered) distribution, when asked for; ``top`` the best
    alternatives as ``(token_id, logprob)``, best first. ``piece`` is the
    token's bytes when the engine knows them (else the tokenizer's).
    ``cached_prompt``: on the first step, how many prompt tokens the engine
    took from its prefix cache, when it says (llama.cpp does)."""

    token_id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
    piece: bytes | None = None
    cached_prompt: int | None = None


class Tokenizer(Protocol):
    """The model's own tokenizer and chat template."""

    #: ids that end a turn (``<|im_end|>``, ``<|endoftext|>``...)
    eos_ids: frozenset[int]

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` with special tokens parsed (a rendered chat prompt
        contains them) and no BOS added unless the model always wants one."""
        ...

    def encode_text(self, text: str) -> list[int]:
        """Ids of ``text`` with special-token texts as plain text (client text)."""
        ...

    #: the texts of the special tokens (``<|im_start|>``...), which client text must not produce
    special_texts: frozenset[str]

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (a piece of UTF-8, maybe partial)."""
        ...

    def render_chat(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                    add_generation_prompt: bool = True) -> str:
        """The prompt text for OpenAI-shaped ``messages`` (``role``, ``content``,
        ``tool_calls`` with ``function.arguments`` a JSON string, ``tool`` role
        with ``tool_call_id``) and OpenAI-shaped ``tools``."""
        ...


class Engine(Protocol):
    """One loaded model."""

    name: str            # "transformers", "llamacpp", "vllm", "sglang"
    tokenizer: Tokenizer
    context_length: int  # prompt + completion tokens one sequence may hold

    async def start(self) -> None:
        """Load the model (in a thread or a subprocess); return when it can generate."""
        ...

    def generate(self, prompt_ids: list[int], params: GenParams) -> AsyncIterator[Step]:
        """Steps as the tokens come. Ends after a stop id (included as the last
        step) or ``max_tokens`` steps. Closing the iterator early (``aclose``)
        must stop the engine's work for this sequence promptly."""
        ...

    async def healthy(self) -> bool:
        """Whether the engine can serve (its server answers, its scheduler
        thread runs); cheap. The worker asks at its pings, bounded in time."""
        ...

    async def aclose(self) -> None:
        """Free the model (stop threads, end engine subprocesses)."""
        ...
