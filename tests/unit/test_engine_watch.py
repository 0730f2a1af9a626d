"""EngineWatch (pool/local/health.py): progress, not per-sequence silence,
decides that an engine is wedged; its health check is cached and bounded."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest

from pool.local.engine import EngineError, Step
from pool.local.health import EngineWatch


class FakeEngine:
    name = "fake"

    def __init__(self) -> None:
        self.checks = 0
        self.hang = False

    async def healthy(self) -> bool:
        self.checks += 1
        if self.hang:
            await asyncio.Event().wait()
        return True


async def drain(watch: EngineWatch, steps: AsyncIterator[Step]) -> list[int]:
    out = []
    while (step := await watch.next_step(steps)) is not None:
        out.append(step.token_id)
    return out


async def test_a_sequence_queued_behind_busy_ones_is_not_a_stall() -> None:
    watch = EngineWatch(FakeEngine(), read_timeout=0.4, check_timeout=1.0)
    busy_done = asyncio.Event()

    async def busy() -> AsyncIterator[Step]:
        for i in range(10):  # 1 s of steady progress, longer than read_timeout
            await asyncio.sleep(0.1)
            yield Step(i)
        busy_done.set()

    async def queued() -> AsyncIterator[Step]:
        await busy_done.wait()  # waits for a slot the whole time
        yield Step(99)

    try:
        got = await asyncio.gather(drain(watch, busy()), drain(watch, queued()))
        assert got == [list(range(10)), [99]]
        assert watch.wedged is None and await watch.unhealthy() is None
    finally:
        await watch.aclose()


async def test_an_engine_that_produces_nothing_is_wedged() -> None:
    watch = EngineWatch(FakeEngine(), read_timeout=0.3, check_timeout=1.0)

    async def silent() -> AsyncIterator[Step]:
        await asyncio.Event().wait()
        yield Step(0)

    try:
        with pytest.raises(EngineError) as info:
            async with asyncio.timeout(5):
                await drain(watch, silent())
        assert info.value.status == 504 and "produced no token" in info.value.message
        why = await watch.unhealthy()
        assert why is not None and "produced no token" in why
    finally:
        await watch.aclose()


async def test_the_engines_own_timeout_is_not_taken_for_a_stall() -> None:
    watch = EngineWatch(FakeEngine(), read_timeout=30, check_timeout=1.0)

    async def times_out() -> AsyncIterator[Step]:
        raise TimeoutError("the engine's own")
        yield Step(0)

    try:
        with pytest.raises(TimeoutError, match="the engine's own"):
            await drain(watch, times_out())
        assert watch.wedged is None
    finally:
        await watch.aclose()


async def test_health_check_is_cached_and_bounded() -> None:
    engine = FakeEngine()
    watch = EngineWatch(engine, read_timeout=30, check_timeout=0.2, cache_for=60)
    try:
        assert await asyncio.gather(*(watch.unhealthy() for _ in range(5))) == [None] * 5
        assert engine.checks == 1  # one check for many pings
        engine.hang = True
        assert await watch.unhealthy() is None and engine.checks == 1  # still cached
        watch.cache_for = 0
        async with asyncio.timeout(5):
            why = await watch.unhealthy()
        assert why is not None and "did not answer its health check within 0.2 s" in why
    finally:
        await watch.aclose()
