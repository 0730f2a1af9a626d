"""pool.deadline.Deadline keeps asyncio.timeout's contract."""

from __future__ import annotations

import asyncio

import pytest

from pool.deadline import Deadline


def test_expiry_raises_timeout_error():
    async def main() -> bool:
        with pytest.raises(TimeoutError):
            with Deadline(0.01) as deadline:
                await asyncio.sleep(5)
        await asyncio.sleep(0)  # no stray cancellation is left on the task
        return deadline.expired

    assert asyncio.run(main()) is True


def test_a_block_that_ends_in_time_leaves_no_timer():
    async def main() -> bool:
        with Deadline(0.02) as deadline:
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)  # past the deadline: nothing fires
        return deadline.expired

    assert asyncio.run(main()) is False


def test_a_cancellation_from_outside_stays_a_cancellation():
    async def main() -> None:
        async def guarded() -> None:
            with Deadline(10):
                await asyncio.sleep(5)

        task = asyncio.ensure_future(guarded())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_an_outer_timeout_is_not_taken_for_its_own():
    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                with Deadline(10) as inner:
                    await asyncio.sleep(5)
        assert not inner.expired

    asyncio.run(main())


def test_outside_a_task_it_refuses():
    with pytest.raises(RuntimeError):
        with Deadline(1):
            pass
