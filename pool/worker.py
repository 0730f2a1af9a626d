"""The seam every worker kind implements: ``local``, ``cli`` and ``remote``."""

from __future__ import annotations

import enum
from typing import AsyncIterator, Mapping, Protocol, runtime_checkable

from .model import ChatRequest, Event

__all__ = ["Worker", "WorkerState", "Capabilities", "flatten"]


class WorkerState(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    LOGGING_IN = "logging_in"
    UNHEALTHY = "unhealthy"
    DRAINING = "draining"
    STOPPED = "stopped"


class Capabilities:
    """What a worker can honour; requests asking for more are refused with a
    400 naming the parameter instead of being silently degraded."""

    __slots__ = ("images", "logprobs", "max_n", "tools", "token_ids")

    def __init__(self, *, images: bool = True, logprobs: bool = True, max_n: int = 1,
                 tools: bool = True, token_ids: bool = False) -> None:
        self.images = images
        self.logprobs = logprobs
        self.max_n = max_n
        self.tools = tools
        self.token_ids = token_ids


@runtime_checkable
class Worker(Protocol):
    """A backend that turns a :class:`ChatRequest` into a stream of events.

    ``stream`` yields :class:`~pool.model.Start` first, once the backend has
    accepted the request; failures raise :class:`~pool.errors.GatewayError`
    subclasses (before or after the first event). Closing the iterator early
    (client gone) must cancel the backend's work.
    """

    name: str
    kind: str
    models: tuple[str, ...]
    aliases: Mapping[str, str]
    capabilities: Capabilities
    state: WorkerState

    def stream(self, request: ChatRequest) -> AsyncIterator[Event]: ...

    async def start(self) -> None: ...

    async def health(self) -> bool: ...

    async def aclose(self) -> None: ...


async def flatten(batches: AsyncIterator[list[Event]]) -> AsyncIterator[Event]:
    """The events of a worker's ``stream_batches``, one by one (closing this
    closes ``batches``, and so the worker's request)."""
    try:
        async for batch in batches:
            for event in batch:
                yield event
    finally:
        aclose = getattr(batches, "aclose", None)
        if aclose is not None:
            await aclose()
