"""Notice a client's ``http.disconnect`` without a task of its own.

An open stream must stop its upstream request as soon as its client leaves,
and only ``receive()`` tells: it returns ``http.disconnect`` then. Awaiting it
in a helper task costs, for every open stream, a ``Task``, its copy of the
context, its entry in asyncio's task registry and the frame of the watching
coroutine (≈ 0.6 KiB; tens of MiB with tens of thousands of streams open).
:class:`DisconnectWatch` drives the ``receive()`` coroutine itself instead,
as a task would: it sends into it, and when it waits on a future, resumes it
from that future's done callback. Nothing else changes: the server's
``receive()`` runs as it did, and the client leaving is noticed as soon as
the server reports it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Coroutine

import structlog

__all__ = ["DisconnectWatch"]

log = structlog.get_logger("poolgate.stream")

Receive = Callable[[], Awaitable[dict[str, Any]]]


class DisconnectWatch:
    """Calls ``on_gone()`` once ``receive()`` returns ``http.disconnect`` (other
    messages are read and dropped); ``close()`` stops watching."""

    __slots__ = ("_receive", "_on_gone", "_coro", "_loop")

    def __init__(self, receive: Receive, on_gone: Callable[[], None],
                 loop: asyncio.AbstractEventLoop) -> None:
        self._receive: Receive | None = receive
        self._on_gone = on_gone
        self._coro: Coroutine[Any, Any, dict[str, Any]] | None = None
        self._loop = loop
        self._step()

    def _step(self, _done: Any = None) -> None:
        while self._receive is not None:  # not closed
            coro = self._coro
            if coro is None:
                coro = self._coro = self._receive()  # type: ignore[assignment]
            try:
                waiting = coro.send(None)  # type: ignore[union-attr]
            except StopIteration as returned:
                self._coro = None
                if returned.value["type"] == "http.disconnect":
                    self._receive = None
                    self._on_gone()
                    return
                continue  # not a disconnect: receive again
            except BaseException:  # noqa: BLE001 - as a watching task would end with it
                self._coro = self._receive = None
                log.debug("stream.receive_failed", exc_info=True)
                return
            if getattr(waiting, "_asyncio_future_blocking", None):
                waiting._asyncio_future_blocking = False  # as a task does, it waits for it
                waiting.add_done_callback(self._step)
            elif waiting is None:  # a bare yield: go on at the next loop turn
                self._loop.call_soon(self._step)
            else:
                self.close()
                log.debug("stream.receive_yielded", value=type(waiting).__name__)
            return

    def close(self) -> None:
        """Stop watching: the pending ``receive()`` is closed (its ``finally``
        blocks run, as when a task awaiting it is cancelled)."""
        coro = self._coro
        self._coro = self._receive = None
        if coro is not None:
            coro.close()
