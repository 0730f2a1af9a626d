"""The memory versions of the shared state: named locks and the drained set."""

from __future__ import annotations

import asyncio

import pytest

from sessions.shared import LockTimeout, MemoryDrainedSet, MemoryLocks


async def test_one_holder_per_name_and_names_are_independent() -> None:
    locks = MemoryLocks()
    inside: list[str] = []
    most = 0

    async def login(name: str, n: int) -> None:
        nonlocal most
        async with locks.hold(name, ttl=5):
            inside.append(name)
            most = max(most, inside.count(name))
            await asyncio.sleep(0.01)
            inside.remove(name)

    await asyncio.gather(*(login(f"login:w{n % 2}", n) for n in range(8)))
    assert most == 1
    assert locks._locks == {}  # nobody holds or waits: nothing kept


async def test_wait_bounds_the_wait_and_leaks_nothing() -> None:
    locks = MemoryLocks()
    async with locks.hold("login:w1", ttl=5):
        assert locks.held("login:w1")
        with pytest.raises(LockTimeout):
            async with locks.hold("login:w1", ttl=5, wait=0.05):
                pass
    assert not locks.held("login:w1") and locks._locks == {}


async def test_a_failure_inside_releases_the_lock() -> None:
    locks = MemoryLocks()
    with pytest.raises(RuntimeError):
        async with locks.hold("x", ttl=5):
            raise RuntimeError("login failed")
    async with locks.hold("x", ttl=5, wait=0.05):
        pass


async def test_drained_set() -> None:
    drained = MemoryDrainedSet()
    await drained.add("w1")
    await drained.add("w2")
    await drained.discard("w1")
    await drained.discard("nope")
    assert await drained.members() == {"w2"}
