"""A ``remote`` worker's configuration (:class:`RemoteSpec`) and the shape of
its sans-IO stream parsers (:class:`StreamParser`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping, Protocol

from pool.model import Event

from .policy import PassPolicy

__all__ = ["RemoteSpec", "StreamParser"]


@dataclass(frozen=True, slots=True)
class RemoteSpec:
    """One upstream, as configured. ``url``: OpenAI base URL including ``/v1``
    (as the openai SDK takes it); Anthropic and Gemini root without ``/v1``
    (``/v1beta``)."""

    name: str
    dialect: Literal["openai", "anthropic", "gemini"]
    url: str
    api_key: str | None = field(default=None, repr=False)
    models: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)
    connect_timeout: float = 10.0
    first_byte_timeout: float = 300.0
    idle_timeout: float = 300.0
    max_connections: int = 0
    max_in_flight: int = 256            # the admission guard's per-worker capacity
    headers: Mapping[str, str] = field(default_factory=dict)
    policy: PassPolicy = field(default_factory=PassPolicy)  # what a pass-through may carry
    # every request (chat, count_tokens, the health probe) goes through this
    # http:// egress proxy when set; it may carry credentials
    proxy: str | None = field(default=None, repr=False)
    # streamed responses made lean (pool.remote.lean); off when its start-up
    # self-test (pool.remote.lean_check) failed on this aiohttp
    lean: bool = True


class StreamParser(Protocol):
    done: bool

    def feed(self, data: str) -> tuple[Event, ...] | list[Event]: ...
