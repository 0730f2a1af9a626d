"""Workers joining and leaving a running pool, and the registrations store."""

from __future__ import annotations

import pytest

from pool.errors import NotFound
from pool.pool import Pool
from sessions.workers import MemoryWorkerRegistrations
from tests.unit.test_core import StubWorker, _req


def test_a_joining_worker_is_routed_to_and_listed():
    a = StubWorker("a", ("m1",), {"claude-*": "m1"})
    pool = Pool([a])
    b = StubWorker("b", ("m2",), {"fast": "m2", "gpt-*": "m2"})
    with pytest.raises(NotFound):
        pool.resolve("gpt-4o")  # looked up (and memoised as unknown) before b joins
    pool.add(b)
    assert pool.resolve("fast") == "m2" and pool.resolve("gpt-4o") == "m2"
    assert pool.pick(_req("fast"))[0] is b
    assert [e.id for e in pool.models()] == ["m1", "m2", "fast"]
    assert pool.in_flight == {"a": 0, "b": 0} and pool.ready_models() == {"m1": True, "m2": True}


@pytest.mark.parametrize(("name", "models", "aliases", "why"), [
    ("a", ("other",), {}, "already in the pool"),
    ("c", ("fast",), {}, "already means 'm1'"),          # a model named like a's alias
    ("c", ("m9",), {"m1": "m9"}, "already means 'm1'"),  # an alias named like a's model
])
def test_a_worker_that_would_change_a_meaning_cannot_join(name, models, aliases, why):
    pool = Pool([StubWorker("a", ("m1",), {"fast": "m1"})])
    with pytest.raises(ValueError, match=why):
        pool.add(StubWorker(name, models, aliases))
    assert [w.name for w in pool.workers] == ["a"] and pool.resolve("fast") == "m1"


def test_a_second_server_of_a_model_may_join_and_leave():
    a, b = StubWorker("a", ("m",), {"x": "m"}), StubWorker("b", ("m",), {"x": "m"})
    pool = Pool([a])
    pool.add(b)
    assert [w.name for w in pool._serving["m"]] == ["a", "b"]
    pool.acquire(b)
    with pytest.raises(RuntimeError, match="in flight"):
        pool.remove("b")  # the caller must drain first: no request loses its worker
    pool.release(b)
    assert pool.remove("b") is b
    assert pool.workers == (a,) and "b" not in pool.in_flight and pool.resolve("x") == "m"
    pool.remove("a")
    with pytest.raises(NotFound):
        pool.resolve("m")
    with pytest.raises(NotFound):
        pool.remove("a")


async def test_memory_registrations_refuse_a_taken_name():
    store = MemoryWorkerRegistrations()
    assert await store.add("w", {"url": "http://a/v1"})
    assert not await store.add("w", {"url": "http://b/v1"})
    listed = await store.all()
    assert listed == {"w": {"url": "http://a/v1"}}
    listed["w"]["url"] = "changed"  # a copy: the store is not changed through it
    assert (await store.all())["w"]["url"] == "http://a/v1"
    assert await store.remove("w") and not await store.remove("w")
    assert await store.all() == {} and store.shared is False
