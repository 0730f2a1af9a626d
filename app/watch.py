"""Which non-stream clients are still there, without a timer per request.

A non-stream request waits for its whole answer before it sends a byte, so
nothing tells it that its client left; a task reading ``receive`` does (the
server reports ``http.disconnect``). Most answers come long before anyone
would leave, so the watching task starts only for requests still waiting
after ``after`` seconds: requests join a board of the loop (see
:mod:`pool.board`), swept every ``after / 2`` seconds while it is not empty,
so a request costs a dict insert and delete, and its client is watched from
between ``after`` and ``1.5 * after`` seconds on.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from pool.board import Entry, board

__all__ = ["Watched", "watch"]

Receive = Callable[[], Awaitable[dict[str, Any]]]


class Watched(Entry):
    """One waiting request: its task, and whether its client left."""

    __slots__ = ("task", "receive", "watcher", "gone", "_board")

    def __init__(self, task: asyncio.Task[Any], receive: Receive) -> None:
        self.task = task
        self.receive = receive
        self.watcher: asyncio.Future[None] | None = None
        self.gone = False

    def leave(self) -> None:
        if not self._board.leave(self) and self.watcher is not None:
            self.watcher.cancel()  # swept off the board: its watcher runs

    async def _watch(self) -> None:
        receive = self.receive
        while True:
            if (await receive())["type"] == "http.disconnect":
                self.gone = True
                self.task.cancel()
                return


def _start(entry: Watched) -> None:
    entry.watcher = asyncio.ensure_future(entry._watch())


def watch(task: asyncio.Task[Any], receive: Receive, after: float) -> Watched:
    """Put ``task`` on its loop's board: its client is watched once it has
    waited ``after`` seconds, until ``leave()``."""
    entry = Watched(task, receive)
    entry._board = board(task.get_loop(), after, _start, every=after / 2)
    entry._board.join(entry)
    return entry

