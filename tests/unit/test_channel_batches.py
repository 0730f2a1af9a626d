"""A process worker's call hands over what the child sent so far as one batch."""

from __future__ import annotations

import asyncio

import pytest

from pool.channel import WINDOW, Call
from pool.errors import UpstreamError
from pool.model import Start, TextDelta
from pool.worker import flatten


async def test_next_batch_takes_all_that_arrived_and_credits_the_window() -> None:
    credits: list[tuple[int, int]] = []
    call = Call(7, asyncio.get_running_loop(), lambda rid, n: credits.append((rid, n)))
    events = [Start(), *(TextDelta(str(i)) for i in range(WINDOW // 2))]
    for event in events:
        call.push(event)
    assert await call.next_batch() == events
    assert credits == [(7, WINDOW // 2 + 1)]  # what was taken goes back to the child

    waiter = asyncio.ensure_future(call.next_batch())
    await asyncio.sleep(0)
    assert not waiter.done()  # nothing queued: it waits for the next event
    call.push(TextDelta("late"))
    assert await waiter == [TextDelta("late")]
    call.finish()
    assert await call.next_batch() is None


async def test_next_batch_raises_the_workers_error() -> None:
    call = Call(1, asyncio.get_running_loop(), lambda rid, n: None)
    call.push(Start())
    call.finish(UpstreamError("refused", status=400))
    assert await call.next_batch() == [Start()]
    with pytest.raises(UpstreamError):
        await call.next_batch()


async def test_flatten_gives_the_events_one_by_one_and_closes_the_batches() -> None:
    closed = []

    async def batches():
        try:
            yield [Start(), TextDelta("a")]
            yield [TextDelta("b")]
            yield [TextDelta("never read")]
        finally:
            closed.append(True)

    events = flatten(batches())
    assert [await events.__anext__() for _ in range(3)] == [Start(), TextDelta("a"),
                                                           TextDelta("b")]
    await events.aclose()
    assert closed == [True]
