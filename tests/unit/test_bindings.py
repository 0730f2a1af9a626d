"""Affinity binding stores: get/set/delete, sliding expiry, bounds.

The behaviour tests take a store factory, so a Redis store can join the same
suite later.
"""

from __future__ import annotations

from typing import Callable

import pytest

from pool.routing import BindingStore
from sessions.bindings import MemoryBindingStore


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


StoreFactory = Callable[[FakeClock, float], BindingStore]
FACTORIES: dict[str, StoreFactory] = {
    "memory": lambda clock, ttl: MemoryBindingStore(ttl=ttl, clock=clock),
}


@pytest.fixture(params=list(FACTORIES))
def make(request: pytest.FixtureRequest) -> StoreFactory:
    return FACTORIES[request.param]


async def test_set_get_replace_delete(make: StoreFactory) -> None:
    store = make(FakeClock(), 60)
    assert await store.get("s") is None
    await store.set("s", "w1")
    assert await store.get("s") == "w1"
    await store.set("s", "w2")
    assert await store.get("s") == "w2"
    await store.delete("s")
    assert await store.get("s") is None
    await store.delete("never-there")  # no error


async def test_binding_expires_after_ttl_without_use(make: StoreFactory) -> None:
    clock = FakeClock()
    store = make(clock, 60)
    await store.set("s", "w1")
    clock.now += 59.9
    assert await store.get("s") == "w1"
    clock.now += 60.0
    assert await store.get("s") is None


async def test_every_hit_restarts_the_ttl(make: StoreFactory) -> None:
    clock = FakeClock()
    store = make(clock, 60)
    await store.set("s", "w1")
    for _ in range(10):  # 500 s in all, never idle for 60
        clock.now += 50
        assert await store.get("s") == "w1"
    clock.now += 61
    assert await store.get("s") is None


async def test_per_binding_ttl_overrides_the_default(make: StoreFactory) -> None:
    clock = FakeClock()
    store = make(clock, 60)
    await store.set("short", "w1", ttl=5)
    await store.set("long", "w1", ttl=600)
    clock.now += 100
    assert await store.get("short") is None
    assert await store.get("long") == "w1"
    clock.now += 590  # the hit restarted the binding's own 600 s
    assert await store.get("long") == "w1"


# --- the memory store's own guarantees -----------------------------------------------------

async def test_memory_store_is_bounded_and_evicts_least_recently_used() -> None:
    store = MemoryBindingStore(ttl=60, max_items=3, clock=FakeClock())
    for key in "abc":
        await store.set(key, "w")
    assert await store.get("a") == "w"  # "a" is now the most recently used
    await store.set("d", "w")
    assert len(store) == 3
    assert await store.get("b") is None
    assert [await store.get(k) for k in "acd"] == ["w", "w", "w"]
    for i in range(1000):
        await store.set(f"k{i}", "w")
    assert len(store) == 3 and store.stats()["evicted"] == 1 + 1000


async def test_memory_store_drops_expired_bindings_on_write() -> None:
    clock = FakeClock()
    store = MemoryBindingStore(ttl=10, clock=clock)
    for i in range(8):
        await store.set(f"old{i}", "w")
    clock.now += 11
    await store.set("new1", "w")
    await store.set("new2", "w")
    assert len(store) == 2  # no one read the old ones; writes cleared them
    assert store.stats()["expired"] == 8


async def test_memory_store_stats_count_hits_misses_and_sets() -> None:
    clock = FakeClock()
    store = MemoryBindingStore(ttl=10, clock=clock)
    await store.set("s", "w")
    await store.get("s")
    await store.get("unknown")
    clock.now += 10
    await store.get("s")
    assert store.stats() == {"items": 0, "hits": 1, "misses": 2, "expired": 1, "evicted": 0,
                             "sets": 1}


@pytest.mark.parametrize("kwargs", [{"ttl": 0}, {"ttl": -1}, {"max_items": 0}])
def test_memory_store_rejects_nonsense_bounds(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        MemoryBindingStore(**kwargs)  # type: ignore[arg-type]


def test_memory_store_defaults() -> None:
    store = MemoryBindingStore()
    assert (store.ttl, store.max_items) == (3600, 100_000)
