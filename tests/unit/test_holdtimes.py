"""Retry-After from the queue: the hold-time average and the refusals built on it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Sequence

import pytest

from pool.admission import AdmissionGuard, KeyLimitExceeded
from pool.errors import Overloaded
from pool.holdtimes import ALPHA, MAX_RETRY, MIN_RETRY, HoldTimes


@dataclass(frozen=True, slots=True, eq=False)
class W:
    name: str
    capacity: int = 1


async def first(workers: Sequence[W]) -> W:
    return workers[0]


def test_nothing_measured_falls_back_to_the_configured_value():
    assert HoldTimes(fallback=1.0).retry_after([("w", 1)], ahead=5) == 1
    assert HoldTimes(fallback=7.2).retry_after([(None, 4)], ahead=0) == 8


def test_the_average_weighs_the_newest_hold_by_alpha():
    holds = HoldTimes()
    holds.observe("w", 10.0)
    assert holds.mean("w") == 10.0 and holds.mean() == 10.0
    holds.observe("w", 0.0)
    assert holds.mean("w") == pytest.approx(10.0 * (1 - ALPHA))
    assert holds.mean("never-seen") == holds.mean()  # an unmeasured worker: the overall average


def test_estimate_counts_the_queue_ahead_and_the_capacity_and_is_clamped():
    holds = HoldTimes()
    holds.observe("slow", 4.0)
    holds.observe("fast", 0.5)
    assert holds.mean("slow") == 4.0  # per worker, not mixed with the other one
    assert holds.retry_after([("slow", 1)], ahead=0) == 4
    assert holds.retry_after([("slow", 1)], ahead=2) == 12
    assert holds.retry_after([("slow", 4)], ahead=0) == 1  # 4 slots turn over in 1 s
    # slow frees 0.25 slot/s, fast 2/s: 3 waiting + this one take 4 / 2.25 s
    assert holds.retry_after([("slow", 1), ("fast", 1)], ahead=3) == 2
    assert holds.retry_after([("slow", 1)], ahead=10_000) == MAX_RETRY
    holds.observe("tiny", 0.0)
    assert holds.retry_after([("tiny", 8)], ahead=0) == MIN_RETRY


def test_a_release_records_how_long_the_slot_was_held():
    async def go() -> float | None:
        g = AdmissionGuard(global_limit=None, per_key_limit=None, max_wait=0)
        lease = await g.acquire(key="k", workers=[W("w")], choose=first)
        await asyncio.sleep(0.05)
        lease.release()
        lease.release()  # once only
        assert g.hold_times.observed == 1
        assert "w" in g.stats()["hold_seconds"]
        return g.hold_times.mean("w")

    held = asyncio.run(go())
    assert held is not None and 0.04 <= held < 5


@pytest.mark.parametrize("limits", ["worker", "global", "key"])
def test_each_refusal_says_when_its_limit_frees_a_slot(limits):
    async def go() -> Overloaded:
        g = AdmissionGuard(global_limit=1 if limits == "global" else None,
                           per_key_limit=1 if limits == "key" else None, max_wait=0)
        capacity = 1 if limits == "worker" else 8
        worker = W("w", capacity)
        g.hold_times.observe("w", 6.0)  # as if one 6 s request had finished
        lease = await g.acquire(key="k", workers=[worker], choose=first)
        try:
            with pytest.raises(Overloaded) as exc:
                await g.acquire(key="k", workers=[worker], choose=first)
            return exc.value
        finally:
            lease.release()

    refusal = asyncio.run(go())
    assert refusal.retry_after == 6
    assert isinstance(refusal, KeyLimitExceeded) == (limits == "key")


def test_a_queued_request_that_times_out_counts_those_still_queued_behind_which_it_returns():
    async def go() -> list[float | None]:
        g = AdmissionGuard(global_limit=None, per_key_limit=None, max_wait=0.05)
        worker = W("w", 1)
        g.hold_times.observe("w", 3.0)
        lease = await g.acquire(key="k", workers=[worker], choose=first)
        try:
            results = await asyncio.gather(
                *(g.acquire(key="k", workers=[worker], choose=first) for _ in range(3)),
                return_exceptions=True)
        finally:
            lease.release()
        assert all(isinstance(r, Overloaded) for r in results), results
        return sorted(r.retry_after for r in results)  # type: ignore[union-attr]

    # they expire in arrival order, leaving 2, then 1, then 0 queued
    assert asyncio.run(go()) == [3, 6, 9]
