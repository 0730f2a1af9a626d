"""Per-request timers without a timer per request.

Every upstream call has a deadline, every waiting non-stream client a moment
from which it is watched. A timer handle made and cancelled per request costs
more than the rest of the bookkeeping; but deadlines of one length are met in
the order they were set. So entries join a :class:`Board` (one per event loop
and length): an insertion-ordered dict, and one timer per board that, while
the board is not empty, looks every ``every`` seconds at its oldest entries
and fires those that are ``after`` seconds old. An entry is fired between
``after`` and ``after + every`` seconds after it joined, or leaves unfired.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Callable, Generic, TypeVar

__all__ = ["Board", "Entry", "board"]


class Entry:
    """What a board holds; subclasses add their own fields (with ``__slots__``)."""

    __slots__ = ("since",)


E = TypeVar("E", bound=Entry)


class Board(Generic[E]):
    __slots__ = ("loop", "after", "every", "pending", "_fire", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, after: float, every: float,
                 fire: Callable[[E], None]) -> None:
        self.loop = loop
        self.after = after
        self.every = every
        self.pending: dict[E, None] = {}  # insertion-ordered: oldest first
        self._fire = fire
        self._timer: asyncio.TimerHandle | None = None

    def join(self, entry: E) -> None:
        entry.since = self.loop.time()
        self.pending[entry] = None
        if self._timer is None:
            self._timer = self.loop.call_later(self.every, self._sweep)

    def leave(self, entry: E) -> bool:
        """Take ``entry`` off the board; ``False`` if it was fired (or never joined)."""
        return self.pending.pop(entry, False) is None

    def _sweep(self) -> None:
        self._timer = None
        pending = self.pending
        due = self.loop.time() - self.after
        fired = []
        for entry in pending:
            if entry.since > due:
                break  # the rest joined later still
            fired.append(entry)
        for entry in fired:
            del pending[entry]
            self._fire(entry)
        if pending:
            self._timer = self.loop.call_later(self.every, self._sweep)


_BOARDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, Board]] = (
    weakref.WeakKeyDictionary())


def _no_loop() -> None:
    return None


# the loop of the last call and its boards: a weak reference's call, not the weak
# dictionary's lookup (which makes a weak reference each time), on every request
_last: tuple[Callable[[], Any], dict[tuple, Board]] = (_no_loop, {})


def board(loop: asyncio.AbstractEventLoop, after: float, fire: Callable[[E], None],
          every: float | None = None) -> Board[E]:
    """The board of ``loop`` whose entries ``fire`` once ``after`` seconds old
    (looked at every ``every`` seconds: a tenth of ``after``, at most one)."""
    global _last
    seen, boards = _last
    if seen() is not loop:  # another loop than last time (tests run many): look it up
        boards = _BOARDS.get(loop)
        if boards is None:
            boards = _BOARDS[loop] = {}
        _last = (weakref.ref(loop), boards)
    key = (after, fire)
    found = boards.get(key)
    if found is None:
        if every is None:
            every = min(after / 10, 1.0)
        found = boards[key] = Board(loop, after, every, fire)
    return found
