"""The idle timeout of one upstream answer, without a timer of its own.

``asyncio.timeout`` around every body read costs a timer handle, a context
object and a task lookup per read; even one timer per answer costs a timer
handle and a libuv timer (≈ 0.5 KiB) for as long as the answer streams, which
adds up with thousands of slow streams open. An :class:`IdleWatch` instead
joins its loop's board for this timeout (see :mod:`pool.board`) while a read
waits, and leaves it when the read returns: a dict insert and delete per
waiting read. A wait that reaches the limit (up to a tenth of it, at most a
second, late: the board's sweep) fails the response's stream reader, so the
pending read raises :class:`IdleTimeout`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pool.board import Board, Entry, board

__all__ = ["IdleWatch", "IdleTimeout"]


class IdleTimeout(Exception):
    """A read waited longer than the idle timeout."""


class IdleWatch(Entry):
    """``begin()`` before a read that waits, ``end()`` after it; ``close()`` once."""

    __slots__ = ("_limit", "_content", "_board")

    def __init__(self, limit: float, content: Any) -> None:
        self._limit = limit
        self._content = content  # the aiohttp StreamReader of the response body
        self._board: Board[IdleWatch] | None = None  # found by the first wait

    def begin(self) -> None:
        found = self._board
        if found is None:
            found = self._board = board(asyncio.get_running_loop(), self._limit, _expire)
        found.join(self)

    def end(self) -> None:
        self._board.leave(self)  # type: ignore[union-attr]  (begin() came first)

    def close(self) -> None:
        if self._board is not None:
            self._board.leave(self)


def _expire(watch: IdleWatch) -> None:
    watch._content.set_exception(IdleTimeout())
