"""The admission guard: limits, the bounded wait, refusals, and slots freed on every path."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Sequence

import pytest

from app.errors import error_body, error_headers, error_status
from pool.admission import AdmissionGuard, KeyLimitExceeded, Lease
from pool.errors import Overloaded


@dataclass(frozen=True, slots=True, eq=False)
class W:
    """A worker stand-in: all the guard reads is ``name`` and ``capacity``."""

    name: str
    capacity: int = 64


@dataclass(frozen=True, slots=True, eq=False)
class Bare:
    """A worker from before ``capacity`` existed."""

    name: str


async def first(workers: Sequence[W]) -> W:
    return workers[0]


class Recorder:
    """A ``choose`` that remembers what it was offered and takes the first."""

    def __init__(self) -> None:
        self.offered: list[list[str]] = []

    async def __call__(self, workers: Sequence[W]) -> W:
        self.offered.append([w.name for w in workers])
        return workers[0]


def guard(*, global_limit: int | None = None, per_key_limit: int | None = None,
          max_wait: float = 0.0, retry_after: float = 1.0) -> AdmissionGuard:
    return AdmissionGuard(global_limit=global_limit, per_key_limit=per_key_limit,
                          max_wait=max_wait, retry_after=retry_after)


async def until_waiting(g: AdmissionGuard, n: int) -> None:
    """Let the loop run until ``n`` requests are queued (no sleeps, no clock)."""
    for _ in range(1000):
        if g.stats()["waiting"] == n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"expected {n} waiting, have {g.stats()['waiting']}")


def assert_idle(g: AdmissionGuard) -> None:
    s = g.stats()
    assert (s["in_flight"], s["by_key"], s["by_worker"], s["waiting"]) == (0, {}, {}, 0)


# --- limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("limits", "workers", "admitted", "reason"), [
    ({"global_limit": 3}, [W("a", 10)], 3, "global"),
    ({"per_key_limit": 2}, [W("a", 10)], 2, "key"),
    ({}, [W("a", 1), W("b", 2)], 3, "worker"),
    ({"global_limit": 5, "per_key_limit": 4}, [W("a", 3)], 3, "worker"),
    ({}, [], 0, "worker"),
])
async def test_admits_up_to_the_tightest_limit_then_refuses_at_once(limits, workers, admitted,
                                                                     reason):
    g = guard(**limits)
    leases = [await g.acquire(key="k", workers=workers, choose=first) for _ in range(admitted)]
    assert g.stats()["in_flight"] == admitted
    assert g.stats()["by_key"] == ({"k": admitted} if admitted else {})
    with pytest.raises(Overloaded):
        await g.acquire(key="k", workers=workers, choose=first)
    assert g.stats()["rejected"] == {"global": 0, "worker": 0, "key": 0} | {reason: 1}
    assert g.stats()["admitted"] == admitted
    for lease in leases:
        lease.release()
    assert_idle(g)


async def test_choose_is_offered_only_workers_with_room():
    """... and is not asked when only one has room (nothing to choose)."""
    a, b, c = W("a", 1), W("b", 2), W("c", 1)
    g, choose = guard(), Recorder()
    leases = [await g.acquire(key="k", workers=[a, b, c], choose=choose) for _ in range(4)]
    assert choose.offered == [["a", "b", "c"], ["b", "c"], ["b", "c"]]
    assert [lease.worker.name for lease in leases] == ["a", "b", "b", "c"]
    assert {n: g.in_flight(n) for n in "abc"} == {"a": 1, "b": 2, "c": 1}
    leases[1].release()
    lease = await g.acquire(key="k", workers=[a, b, c], choose=choose)
    assert lease.worker is b and len(choose.offered) == 3


async def test_the_chosen_worker_takes_the_slot():
    a, b = W("a", 2), W("b", 2)

    async def last(workers):
        return workers[-1]

    g = guard()
    lease = await g.acquire(key="k", workers=[a, b], choose=last)
    assert lease.worker is b
    assert (g.in_flight("a"), g.in_flight("b")) == (0, 1)


async def test_a_worker_without_capacity_defaults_to_64():
    g, worker = guard(), Bare("old")
    leases = [await g.acquire(key="k", workers=[worker], choose=first) for _ in range(64)]
    with pytest.raises(Overloaded):
        await g.acquire(key="k", workers=[worker], choose=first)
    assert g.in_flight("old") == 64
    for lease in leases:
        lease.release()
    assert_idle(g)


async def test_a_worker_filled_while_choose_awaits_falls_back_to_the_held_one():
    a, b = W("a", 1), W("b", 1)
    go = asyncio.Event()

    async def slow_b(workers):
        await go.wait()
        return b

    async def pick_b(workers):
        assert [w.name for w in workers] == ["b"]  # "a" is held by the slow request
        return b

    g = guard()
    slow = asyncio.create_task(g.acquire(key="k", workers=[a, b], choose=slow_b))
    await asyncio.sleep(0)
    fast = await g.acquire(key="k", workers=[a, b], choose=pick_b)
    go.set()
    assert (fast.worker, (await slow).worker) == (b, a)
    assert (g.in_flight("a"), g.in_flight("b")) == (1, 1)


# --- waiting ---------------------------------------------------------------------------------


async def test_waiters_are_admitted_in_order_one_per_release():
    g = guard(global_limit=1, max_wait=60)
    worker = W("a")
    holder = await g.acquire(key="k", workers=[worker], choose=first)
    order: list[int] = []

    async def wait_turn(i: int) -> Lease:
        lease = await g.acquire(key=f"k{i}", workers=[worker], choose=first)
        order.append(i)
        return lease

    tasks = [asyncio.create_task(wait_turn(i)) for i in range(3)]
    await until_waiting(g, 3)
    current = holder
    for i in range(3):
        current.release()
        current = await tasks[i]
        await asyncio.sleep(0)
        assert order == list(range(i + 1))  # exactly one admitted per release
        assert g.stats()["waiting"] == 2 - i
    current.release()
    assert_idle(g)
    assert g.stats()["wait_count"] == 3


async def test_a_newcomer_does_not_overtake_the_queue():
    g = guard(global_limit=1, max_wait=60)
    worker = W("a")
    holder = await g.acquire(key="k", workers=[worker], choose=first)
    queued = asyncio.create_task(g.acquire(key="q", workers=[worker], choose=first))
    await until_waiting(g, 1)
    holder.release()  # the slot is granted to ``queued`` before it even runs
    newcomer = asyncio.create_task(g.acquire(key="n", workers=[worker], choose=first))
    lease = await queued
    await until_waiting(g, 1)
    assert not newcomer.done()
    lease.release()
    (await newcomer).release()
    assert_idle(g)


@pytest.mark.parametrize(("limits", "held_key", "expected"), [
    ({"global_limit": 1}, "other", (Overloaded, "overloaded", 503, "global")),
    ({"per_key_limit": 1}, "team", (KeyLimitExceeded, "rate_limit", 429, "key")),
])
async def test_the_deadline_refuses_with_retry_after(limits, held_key, expected):
    cls, kind, status, reason = expected
    g = guard(max_wait=0.05, retry_after=2.5, **limits)
    worker = W("a")
    await g.acquire(key=held_key, workers=[worker], choose=first)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Overloaded) as caught:
        await g.acquire(key="team", workers=[worker], choose=first)
    assert loop.time() - started >= 0.05
    exc = caught.value
    assert (type(exc), exc.kind, exc.status, exc.retry_after) == (cls, kind, status, 3)
    assert g.stats()["rejected"][reason] == 1
    assert g.stats()["waiting"] == 0
    assert g.stats()["wait_count"] == 1 and g.stats()["wait_seconds"] >= 0.05


@pytest.mark.parametrize(("limits", "openai", "anthropic"), [
    ({"global_limit": 1}, (429, "rate_limit_error", "rate_limit_exceeded"),
     (529, "overloaded_error")),
    ({"per_key_limit": 1}, (429, "rate_limit_error", "rate_limit_exceeded"),
     (429, "rate_limit_error")),
])
async def test_refusals_map_to_each_dialect(limits, openai, anthropic):
    g = guard(**limits)
    await g.acquire(key="k", workers=[W("a")], choose=first)
    with pytest.raises(Overloaded) as caught:
        await g.acquire(key="k", workers=[W("a")], choose=first)
    exc = caught.value
    body = error_body(exc, "openai")["error"]
    assert (error_status(exc, "openai"), body["type"], body["code"]) == openai
    assert (error_status(exc, "anthropic"),
            error_body(exc, "anthropic")["error"]["type"]) == anthropic
    assert error_headers(exc) == {"retry-after": "1"}


async def test_one_team_at_its_limit_does_not_block_another():
    g = guard(global_limit=10, per_key_limit=2, max_wait=60)
    worker = W("a")
    team_a = [await g.acquire(key="A", workers=[worker], choose=first) for _ in range(2)]
    a_waiting = asyncio.create_task(g.acquire(key="A", workers=[worker], choose=first))
    await until_waiting(g, 1)
    team_b = [await g.acquire(key="B", workers=[worker], choose=first) for _ in range(2)]
    assert g.stats()["by_key"] == {"A": 2, "B": 2}
    assert not a_waiting.done()
    team_b[0].release()  # B's slot is not A's to take
    await asyncio.sleep(0)
    assert not a_waiting.done()
    team_a[0].release()
    third = await a_waiting
    assert g.stats()["by_key"] == {"A": 2, "B": 1}
    for lease in (third, team_a[1], team_b[1]):
        lease.release()
    assert_idle(g)


async def test_a_waiter_blocked_by_its_key_lets_the_next_one_through():
    g = guard(global_limit=2, per_key_limit=1, max_wait=60)
    worker = W("a")
    a = await g.acquire(key="A", workers=[worker], choose=first)
    c = await g.acquire(key="C", workers=[worker], choose=first)
    a2 = asyncio.create_task(g.acquire(key="A", workers=[worker], choose=first))
    b = asyncio.create_task(g.acquire(key="B", workers=[worker], choose=first))
    await until_waiting(g, 2)
    c.release()
    b_lease = await b
    await until_waiting(g, 1)
    assert not a2.done()
    a.release()
    (await a2).release()
    b_lease.release()
    assert_idle(g)


async def test_waiters_for_other_workers_are_not_blocked_by_a_full_one():
    g = guard(max_wait=60)
    busy, idle = W("busy", 1), W("idle", 1)
    held = await g.acquire(key="k", workers=[busy], choose=first)
    on_busy = asyncio.create_task(g.acquire(key="k", workers=[busy], choose=first))
    await until_waiting(g, 1)
    other = await g.acquire(key="k", workers=[idle], choose=first)
    assert other.worker is idle and not on_busy.done()
    held.release()
    assert (await on_busy).worker is busy


# --- release on every path -------------------------------------------------------------------


async def test_cancelling_a_waiter_leaks_nothing_and_strands_no_one():
    g = guard(global_limit=1, max_wait=60)
    worker = W("a")
    holder = await g.acquire(key="k", workers=[worker], choose=first)
    tasks = [asyncio.create_task(g.acquire(key="k", workers=[worker], choose=first))
             for _ in range(3)]
    await until_waiting(g, 3)
    tasks[1].cancel()
    await until_waiting(g, 2)
    holder.release()
    (await tasks[0]).release()
    (await tasks[2]).release()
    assert tasks[1].cancelled()
    assert_idle(g)


async def test_a_waiter_cancelled_after_its_grant_passes_the_slot_on():
    g = guard(global_limit=1, max_wait=60)
    worker = W("a")
    holder = await g.acquire(key="k", workers=[worker], choose=first)
    granted = asyncio.create_task(g.acquire(key="k", workers=[worker], choose=first))
    behind = asyncio.create_task(g.acquire(key="k", workers=[worker], choose=first))
    await until_waiting(g, 2)
    holder.release()  # grants ``granted`` its slot synchronously...
    granted.cancel()  # ...which is cancelled before it runs
    lease = await behind
    assert granted.cancelled()
    lease.release()
    assert_idle(g)


@pytest.mark.parametrize("failure", ["raise", "cancel"])
async def test_a_failing_choose_gives_every_slot_back(failure):
    g = guard(global_limit=1, max_wait=60)
    workers = [W("a"), W("b")]  # two with room once released: choose is asked
    stuck = asyncio.Event()

    async def broken(workers):
        if failure == "raise":
            raise RuntimeError("routing failed")
        await stuck.wait()
        return workers[0]

    holder = await g.acquire(key="k", workers=workers, choose=first)
    failing = asyncio.create_task(g.acquire(key="k", workers=workers, choose=broken))
    behind = asyncio.create_task(g.acquire(key="k", workers=workers, choose=first))
    await until_waiting(g, 2)
    holder.release()
    if failure == "cancel":
        await until_waiting(g, 1)
        failing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await failing
    else:
        with pytest.raises(RuntimeError):
            await failing
    (await behind).release()
    assert_idle(g)


async def test_release_is_idempotent():
    g = guard(global_limit=2)
    worker = W("a")
    lease = await g.acquire(key="k", workers=[worker], choose=first)
    other = await g.acquire(key="k", workers=[worker], choose=first)
    lease.release()
    lease.release()
    assert lease.released
    assert g.stats()["in_flight"] == 1 and g.in_flight("a") == 1
    with other:
        pass
    other.release()
    assert_idle(g)


# --- under load ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
async def test_a_thousand_random_requests_leave_nothing_behind(seed):
    rng = random.Random(seed)
    workers = [W(f"w{i}", rng.randint(1, 4)) for i in range(4)]
    g = guard(global_limit=8, per_key_limit=3, max_wait=[0.0, 0.002, 0.02][seed % 3])
    keys = ["A", "B", "C", "D"]
    violations: list[str] = []
    cancelled_in_acquire: list[int] = []
    acquiring: set[asyncio.Task] = set()

    def check() -> None:
        s = g.stats()
        if s["in_flight"] > 8 or any(n > 3 for n in s["by_key"].values()):
            violations.append(f"limits {s}")
        if any(s["by_worker"].get(w.name, 0) > w.capacity for w in workers):
            violations.append(f"capacity {s}")

    async def choose(offered):
        check()
        if rng.random() < 0.2:
            await asyncio.sleep(0)
        return rng.choice(offered)

    async def one() -> str:
        await asyncio.sleep(rng.random() * 0.3)
        eligible = rng.sample(workers, rng.randint(1, len(workers)))
        me = asyncio.current_task()
        acquiring.add(me)
        try:
            lease = await g.acquire(key=rng.choice(keys), workers=eligible, choose=choose)
        except Overloaded:
            return "rejected"
        except asyncio.CancelledError:
            cancelled_in_acquire.append(1)
            raise
        finally:
            acquiring.discard(me)
        try:
            check()
            await asyncio.sleep(rng.random() * 0.003)
            if rng.random() < 0.1:
                raise RuntimeError("worker failed")
            return "served"
        except RuntimeError:
            return "failed"
        finally:
            lease.release()

    tasks = [asyncio.create_task(one()) for _ in range(1000)]
    for _ in range(150):
        await asyncio.sleep(rng.random() * 0.004)
        # half aimed at requests inside acquire (queued, or in choose), half anywhere
        pool = sorted(acquiring, key=tasks.index) if rng.random() < 0.5 and acquiring else tasks
        rng.choice(pool).cancel()
    done, pending = await asyncio.wait(tasks, timeout=30)
    assert not pending, "some requests never finished"
    outcomes = [t.result() if not t.cancelled() else "cancelled" for t in done]
    assert violations == []
    assert_idle(g)
    s = g.stats()
    assert {"served", "failed", "rejected", "cancelled"} <= set(outcomes)  # every path taken
    assert s["admitted"] >= outcomes.count("served") + outcomes.count("failed")
    assert sum(s["rejected"].values()) == outcomes.count("rejected")
    if seed % 3:
        assert s["wait_count"] > 0 and cancelled_in_acquire


@pytest.mark.parametrize("max_wait", [0.0, 0.02])
async def test_twice_the_capacity_the_surplus_is_refused_quickly(max_wait):
    workers = [W("a", 4), W("b", 4)]
    g = guard(max_wait=max_wait)
    loop = asyncio.get_running_loop()
    finish = asyncio.Event()
    refused_after: list[float] = []

    async def one() -> None:
        started = loop.time()
        try:
            lease = await g.acquire(key="k", workers=workers, choose=first)
        except Overloaded:
            refused_after.append(loop.time() - started)
            return
        with lease:
            await finish.wait()

    tasks = [asyncio.create_task(one()) for _ in range(16)]
    deadline = loop.time() + 5
    while len(refused_after) < 8 and loop.time() < deadline:
        await asyncio.sleep(0.005)
    assert len(refused_after) == 8
    assert all(t >= max_wait for t in refused_after)
    assert max(refused_after) < max_wait + 0.1
    assert g.stats()["in_flight"] == 8 and g.stats()["rejected"]["worker"] == 8
    finish.set()
    await asyncio.gather(*tasks)
    assert_idle(g)


async def test_moving_off_the_held_worker_wakes_a_waiter_for_it():
    a, b = W("a", 1), W("b", 1)
    go = asyncio.Event()

    async def slow_b(workers):
        await go.wait()
        return b

    g = guard(max_wait=60)
    routed = asyncio.create_task(g.acquire(key="k", workers=[a, b], choose=slow_b))
    await asyncio.sleep(0)
    assert g.in_flight("a") == 1  # held while choose runs
    only_a = asyncio.create_task(g.acquire(key="k", workers=[a], choose=first))
    await until_waiting(g, 1)
    go.set()
    assert ((await routed).worker, (await only_a).worker) == (b, a)


async def test_a_waiter_cancelled_at_the_head_is_skipped_by_the_next_release():
    g = guard(global_limit=1, max_wait=60)
    worker = W("a")
    holder = await g.acquire(key="k", workers=[worker], choose=first)
    head = asyncio.create_task(g.acquire(key="k", workers=[worker], choose=first))
    behind = asyncio.create_task(g.acquire(key="k", workers=[worker], choose=first))
    await until_waiting(g, 2)
    head.cancel()
    holder.release()  # in the same tick: the head's task has not yet run its cleanup
    (await behind).release()
    assert head.cancelled()
    assert_idle(g)


# --- wake-up cost ----------------------------------------------------------------------------


class Counting:
    """A worker stand-in that counts how often the guard looks at its capacity."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self._capacity = capacity
        self.looks = 0

    @property
    def capacity(self) -> int:
        self.looks += 1
        return self._capacity


async def test_a_release_does_not_rescan_waiters_it_cannot_serve():
    # 1,000 requests queue for a full worker ``a``; 1,000 requests come and go on
    # ``b``. Scanning every waiter on every release would look at ``a`` a million times.
    a, b = Counting("a", 1), Counting("b", 1)
    g = guard(max_wait=60)
    holder = await g.acquire(key="k", workers=[a], choose=first)
    queued = [asyncio.create_task(g.acquire(key="k", workers=[a], choose=first))
              for _ in range(1000)]
    await until_waiting(g, 1000)
    a.looks = 0
    for _ in range(1000):
        (await g.acquire(key="other", workers=[b], choose=first)).release()
    assert a.looks < 100
    holder.release()
    for task in queued:  # and each of them is still served, in order, one per release
        (await task).release()
    assert a.looks < 10 * 1000
    assert_idle(g)


async def test_a_waiter_for_a_drained_worker_waits_for_another():
    # the snapshot of eligible workers is from before queueing: a worker drained
    # meanwhile must not be granted (pool.worker.WorkerState is read at grant time)
    from pool.worker import WorkerState

    class Stateful:
        def __init__(self, name: str) -> None:
            self.name, self.capacity, self.state = name, 1, WorkerState.READY

    p0, p1 = Stateful("p0"), Stateful("p1")
    g = guard(max_wait=60)
    first_p0 = await g.acquire(key="k", workers=[p0], choose=first)
    first_p1 = await g.acquire(key="k", workers=[p1], choose=first)
    queued = asyncio.create_task(g.acquire(key="k", workers=[p0, p1], choose=first))
    await until_waiting(g, 1)
    p0.state = WorkerState.DRAINING
    first_p0.release()
    await asyncio.sleep(0)
    assert not queued.done() and g.stats()["waiting"] == 1
    first_p1.release()
    lease = await queued
    assert lease.worker is p1
    lease.release()
    assert_idle(g)


async def test_a_waiter_is_served_when_its_worker_becomes_ready_again():
    # no slot is released when a drained or restarting worker becomes ready: the
    # guard looks again on its own instead of letting the waiter run out its wait
    from pool.worker import WorkerState

    class Stateful:
        def __init__(self, name: str) -> None:
            self.name, self.capacity, self.state = name, 1, WorkerState.STARTING

    p0 = Stateful("p0")
    g = guard(max_wait=60)
    queued = asyncio.create_task(g.acquire(key="k", workers=[p0], choose=first))
    await until_waiting(g, 1)
    await asyncio.sleep(0.3)
    assert not queued.done()
    p0.state = WorkerState.READY
    lease = await asyncio.wait_for(queued, 10)
    assert lease.worker is p0
    lease.release()
    assert_idle(g)
