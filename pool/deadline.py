"""``with Deadline(seconds):`` — ``asyncio.timeout`` for the request path.

The same contract as ``async with asyncio.timeout(seconds)`` around awaits in
a task: once ``seconds`` have passed the task is cancelled and the block
raises :class:`TimeoutError`; a cancellation from anyone else stays a
cancellation. Deadlines of one length share a board (see :mod:`pool.board`)
instead of each making a timer handle: the deadline is met up to a tenth of
its length (at most a second) late, and it costs a dict insert and delete.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from .board import Entry, board

__all__ = ["Deadline"]


class Deadline(Entry):
    __slots__ = ("_delay", "_task", "_board", "_cancelling", "expired")

    def __init__(self, delay: float) -> None:
        self._delay = delay
        self.expired = False

    def __enter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadline must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._board = board(task.get_loop(), self._delay, _expire)
        self._board.join(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._board.leave(self)
        if self.expired and self._task.uncancel() <= self._cancelling \
                and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


def _expire(deadline: Deadline) -> None:
    deadline.expired = True
    deadline._task.cancel()
