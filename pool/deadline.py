"""``with Deadline(seconds):`` — ``asyncio.timeout`` for the request path.

The same contract as ``async with asyncio.timeout(seconds)`` around awaits in
a task: once ``seconds`` have passed the task is cancelled and the block
raises :class:`TimeoutError`; a cancellation from anyone else stays a
cancellation. It costs one timer handle and a plain (synchronous) context
manager: about a fifth of ``asyncio.timeout``'s state machine, which matters
on every upstream call (see bench/).
"""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["Deadline"]


class Deadline:
    __slots__ = ("_delay", "_task", "_handle", "_cancelling", "expired")

    def __init__(self, delay: float) -> None:
        self._delay = delay
        self.expired = False

    def __enter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadline must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._handle = task.get_loop().call_later(self._delay, self._expire)
        return self

    def _expire(self) -> None:
        self.expired = True
        self._task.cancel()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._handle.cancel()
        if self.expired and self._task.uncancel() <= self._cancelling \
                and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
