"""The idle timeout of one upstream answer, with one timer for the whole answer.

``asyncio.timeout`` around every body read costs a timer handle, a context
object and a task lookup per read: for a paced stream that waits for every
chunk, that is a visible part of the gateway's CPU per stream. An
:class:`IdleWatch` keeps one timer per answer instead; each read only notes
when it began waiting. When a wait reaches the limit, the watch fails the
response's stream reader, so the pending read raises :class:`IdleTimeout`.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["IdleWatch", "IdleTimeout"]


class IdleTimeout(Exception):
    """A read waited longer than the idle timeout."""


class IdleWatch:
    """``begin()`` before a read that waits, ``end()`` after it; ``close()`` once."""

    __slots__ = ("_loop", "_limit", "_content", "_since", "_handle")

    def __init__(self, limit: float, content: Any) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limit = limit
        self._content = content  # the aiohttp StreamReader of the response body
        self._since: float | None = None  # when the pending read began waiting
        self._handle: asyncio.TimerHandle | None = None  # set by the first wait

    def begin(self) -> None:
        loop = self._loop
        if loop is None:
            self._loop = loop = asyncio.get_running_loop()
        self._since = since = loop.time()
        if self._handle is None:
            self._handle = loop.call_at(since + self._limit, self._check)

    def end(self) -> None:
        self._since = None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def _check(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        since = self._since
        if since is not None and now - since >= self._limit:
            self._content.set_exception(IdleTimeout())
            return
        due = (since if since is not None else now) + self._limit
        self._handle = self._loop.call_at(due, self._check)
