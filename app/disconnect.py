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

Where ``receive()`` cannot be driven so (it needs a task of its own: an
anyio cancel scope or an ``asyncio.timeout`` in a server or middleware, or it
yields to something that is no asyncio future), the watch falls back to a
helper task awaiting ``receive()``, and logs ``stream.watch_fallback`` (a
warning, once per event loop); later watches on that loop start with the
task. Departed clients are noticed either way.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Awaitable, Callable, Coroutine

import structlog

__all__ = ["DisconnectWatch"]

log = structlog.get_logger("poolgate.stream")

Receive = Callable[[], Awaitable[dict[str, Any]]]

# loops whose receive() could not be driven without a task: watched by tasks
_TASK_ONLY: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, bool] = \
    weakref.WeakKeyDictionary()


class DisconnectWatch:
    """Calls ``on_gone()`` once ``receive()`` returns ``http.disconnect`` (other
    messages are read and dropped); ``close()`` stops watching."""

    __slots__ = ("_receive", "_on_gone", "_coro", "_loop", "_task")

    def __init__(self, receive: Receive, on_gone: Callable[[], None],
                 loop: asyncio.AbstractEventLoop) -> None:
        self._receive: Receive | None = receive
        self._on_gone = on_gone
        self._coro: Coroutine[Any, Any, dict[str, Any]] | None = None
        self._loop = loop
        self._task: asyncio.Task[None] | None = None
        if loop in _TASK_ONLY:
            self._task = loop.create_task(self._watch())
        else:
            # first driven at the next loop turn, outside the caller's task:
            # a receive() that needs a task fails at once (before it took a
            # message), not later in a cancel scope bound to the request's task
            loop.call_soon(self._step)

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
            except asyncio.CancelledError:  # as a watching task would end with it
                self._coro = self._receive = None
                return
            except Exception as exc:  # noqa: BLE001 - it may need a task: one watches
                self._coro = None
                self._fall_back(type(exc).__name__)
                return
            if getattr(waiting, "_asyncio_future_blocking", None):
                waiting._asyncio_future_blocking = False  # as a task does, it waits for it
                waiting.add_done_callback(self._step)
            elif waiting is None:  # a bare yield: go on at the next loop turn
                self._loop.call_soon(self._step)
            else:  # not an asyncio future: only a task can wait for it
                self._coro = None
                coro.close()  # type: ignore[union-attr]
                self._fall_back(f"yielded {type(waiting).__name__}")
            return

    def _fall_back(self, reason: str) -> None:
        """``receive()`` cannot be driven without a task: a task awaits it."""
        loop = self._loop
        if loop not in _TASK_ONLY:
            _TASK_ONLY[loop] = True
            log.warning("stream.watch_fallback", reason=reason,
                        detail="receive() needs a task: open streams are watched by one each")
        self._task = loop.create_task(self._watch())

    async def _watch(self) -> None:
        try:
            while (receive := self._receive) is not None:
                if (await receive())["type"] == "http.disconnect":
                    if self._receive is not None:  # not closed meanwhile
                        self._receive = None
                        self._on_gone()
                    return
        except Exception as exc:  # noqa: BLE001 - nothing to watch with any more
            self._receive = None
            log.warning("stream.watch_failed", error_type=type(exc).__name__)

    def close(self) -> None:
        """Stop watching: the pending ``receive()`` is closed (its ``finally``
        blocks run, as when a task awaiting it is cancelled)."""
        coro, task = self._coro, self._task
        self._coro = self._receive = self._task = None
        if coro is not None:
            coro.close()
        if task is not None and task is not asyncio.current_task():
            task.cancel()
