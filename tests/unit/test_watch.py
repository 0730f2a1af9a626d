"""until_disconnect and its per-loop board (app.watch)."""

from __future__ import annotations

import asyncio

import pytest

from app.streaming import ClientGone, until_disconnect
from app.watch import _start
from pool.board import board


def _client() -> tuple[asyncio.Queue, object]:
    messages: asyncio.Queue = asyncio.Queue()

    async def receive() -> dict:
        return await messages.get()

    return messages, receive


def test_a_quick_answer_starts_no_watcher_and_leaves_the_board_empty():
    async def main() -> None:
        messages, receive = _client()
        answers = await asyncio.gather(*(until_disconnect(receive, asyncio.sleep(0, i),
                                                          watch_after=0.05) for i in range(5)))
        assert answers == [0, 1, 2, 3, 4]
        watches = board(asyncio.get_running_loop(), 0.05, _start)
        assert not watches.pending
        await asyncio.sleep(0.1)  # the sweep finds nothing, and stops
        assert messages.empty() and watches._timer is None

    asyncio.run(main())


def test_a_client_that_leaves_cancels_the_work():
    async def main() -> None:
        messages, receive = _client()
        cancelled = asyncio.Event()

        async def slow() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        loop = asyncio.get_running_loop()
        loop.call_later(0.02, messages.put_nowait, {"type": "http.disconnect"})
        started = loop.time()
        with pytest.raises(ClientGone):
            await until_disconnect(receive, slow(), watch_after=0.1)
        assert cancelled.is_set()
        assert 0.1 <= loop.time() - started < 1.0  # watched from 0.1 s on, not before

    asyncio.run(main())


def test_a_slow_answer_that_comes_stops_its_watcher():
    async def main() -> None:
        messages, receive = _client()
        assert await until_disconnect(receive, asyncio.sleep(0.15, "late"),
                                      watch_after=0.05) == "late"
        await asyncio.sleep(0)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert all(t.done() or t.cancelling() for t in others)

    asyncio.run(main())


def test_a_cancellation_from_elsewhere_is_not_taken_for_a_disconnect():
    async def main() -> None:
        _, receive = _client()
        task = asyncio.ensure_future(until_disconnect(receive, asyncio.sleep(10),
                                                      watch_after=0.01))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
