"""What every driver's ``send`` does around its own turn loop."""

from __future__ import annotations

from typing import AsyncIterator, Awaitable, Callable

from .events import TERMINAL, CliEvent

__all__ = ["guarded"]


async def guarded(steps: AsyncIterator[CliEvent], *, on_terminal: Callable[[CliEvent], None],
                  on_abandon: Callable[[], Awaitable[None]]) -> AsyncIterator[CliEvent]:
    """Pass ``steps`` on; report the terminal event to ``on_terminal``, and
    call ``on_abandon`` when the consumer stops before it (a client that left)."""
    finished = False
    try:
        async for event in steps:
            if isinstance(event, TERMINAL):
                finished = True
                on_terminal(event)
            yield event
    finally:
        if not finished:
            await on_abandon()
