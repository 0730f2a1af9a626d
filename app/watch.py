"""Which non-stream clients are still there: one timer per event loop.

A non-stream request waits for its whole answer before it sends a byte, so
nothing tells it that its client left; a task reading ``receive`` does (the
server reports ``http.disconnect``). Most answers come long before anyone
would leave, so the watching task starts only for requests still waiting
after ``after`` seconds. Rather than a timer per request (a handle made and
cancelled on every request), requests join a :class:`Watches` board, and one
timer per loop sweeps it every ``after / 2`` seconds while it is not empty:
a request costs a dict insert and delete, and its client is watched from
between ``after`` and ``1.5 * after`` seconds on.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Awaitable, Callable

__all__ = ["Watched", "Watches", "board"]

Receive = Callable[[], Awaitable[dict[str, Any]]]


class Watched:
    """One request on the board: its task, and whether its client left."""

    __slots__ = ("task", "receive", "since", "watcher", "gone")

    def __init__(self, task: asyncio.Task[Any], receive: Receive, since: float) -> None:
        self.task = task
        self.receive = receive
        self.since = since
        self.watcher: asyncio.Future[None] | None = None
        self.gone = False

    async def watch(self) -> None:
        receive = self.receive
        while True:
            if (await receive())["type"] == "http.disconnect":
                self.gone = True
                self.task.cancel()
                return


class Watches:
    """The requests of one loop that are waiting for their answer."""

    __slots__ = ("loop", "after", "pending", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, after: float) -> None:
        self.loop = loop
        self.after = after
        self.pending: dict[Watched, None] = {}  # insertion-ordered: oldest first
        self._timer: asyncio.TimerHandle | None = None

    def join(self, task: asyncio.Task[Any], receive: Receive) -> Watched:
        entry = Watched(task, receive, self.loop.time())
        self.pending[entry] = None
        if self._timer is None:
            self._timer = self.loop.call_later(self.after / 2, self._sweep)
        return entry

    def leave(self, entry: Watched) -> None:
        if entry.watcher is not None:  # swept off the board: its watcher runs
            entry.watcher.cancel()
        else:
            del self.pending[entry]

    def _sweep(self) -> None:
        self._timer = None
        pending = self.pending
        due = self.loop.time() - self.after
        for entry in list(pending):
            if entry.since > due:
                break  # the rest joined later still
            del pending[entry]
            entry.watcher = asyncio.ensure_future(entry.watch())
        if pending:
            self._timer = self.loop.call_later(self.after / 2, self._sweep)


_BOARDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, Watches]] = (
    weakref.WeakKeyDictionary())


def board(loop: asyncio.AbstractEventLoop, after: float) -> Watches:
    """The board of ``loop`` for requests watched after ``after`` seconds."""
    boards = _BOARDS.get(loop)
    if boards is None:
        boards = _BOARDS[loop] = {}
    found = boards.get(after)
    if found is None:
        found = boards[after] = Watches(loop, after)
    return found
