"""Admission: how many requests may be in flight, and who waits for a slot.

Three limits apply at once: a global one, one per API key (so one team cannot
starve the others) and one per worker (``worker.capacity``). A request that
finds them all open is admitted at once; otherwise it queues for at most
``max_wait`` seconds and is then refused with :class:`~pool.errors.Overloaded`
carrying a ``retry_after`` estimated from the queue (see :mod:`pool.holdtimes`).

A slot is *granted* synchronously, under the event loop's single thread: the
global and key counts are taken and one free worker is *held*, so nothing can
slip in between a release and the waiter it wakes. The caller's ``choose``
then picks among the free workers and the hold moves to its choice. Waiters
are served in arrival order among those that can proceed: a waiter blocked by
its own key's limit, or by its model's workers, does not block the ones
behind it, while a full global limit stops the scan.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Sequence

from .errors import Overloaded
from .holdtimes import HoldTimes
from .waitqueue import GLOBAL, KEY, UNREADY, WORKERS, WaitQueue, Waiter
from .worker import Worker, WorkerState

__all__ = ["AdmissionGuard", "Lease", "KeyLimitExceeded", "DEFAULT_CAPACITY"]

DEFAULT_CAPACITY = 64
RECHECK = 0.25  # seconds between looks at workers that were not ready for a waiter

Choose = Callable[[Sequence[Worker]], Awaitable[Worker]]


class KeyLimitExceeded(Overloaded):
    """An API key has its full share in flight: 429 ``rate_limit_exceeded`` in
    both dialects (the client should slow down; the gateway is not overloaded)."""

    status = 429
    kind = "rate_limit"


def _capacity(worker: Worker) -> int:
    return getattr(worker, "capacity", DEFAULT_CAPACITY)


def _ready(worker: Worker) -> bool:
    # Checked at grant time, not only when the request arrived: a worker drained
    # (or gone unhealthy) while a request queued must not be granted to it.
    return getattr(worker, "state", WorkerState.READY) is WorkerState.READY


class Lease:
    """One admitted request on ``worker``; ``release()`` frees its slot, once."""

    __slots__ = ("worker", "key", "waited", "granted", "shared_slot", "_guard")

    def __init__(self, guard: AdmissionGuard | None, worker: Worker, key: str,
                 waited: float) -> None:
        self._guard = guard
        self.worker = worker
        self.key = key
        self.waited = waited  # seconds spent queued before admission (0.0 when admitted at once)
        self.granted = time.monotonic()
        self.shared_slot = False  # the caller also holds a slot counted across replicas

    @property
    def released(self) -> bool:
        return self._guard is None

    def release(self) -> None:
        guard = self._guard
        if guard is not None:
            self._guard = None
            guard._give_back(self.key, self.worker)
            guard.hold_times.observe(self.worker.name, time.monotonic() - self.granted)
            guard._wake()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class AdmissionGuard:
    """Global, per-key and per-worker limits on requests in flight, with a
    bounded FIFO wait and a fast refusal once the wait is over."""

    def __init__(self, *, global_limit: int | None, per_key_limit: int | None,
                 max_wait: float, retry_after: float = 1.0) -> None:
        self._global_limit = global_limit
        self._key_limit = per_key_limit
        self._key_limits: dict[str, int | None] = {}  # per-key overrides of per_key_limit
        self._max_wait = max_wait
        # what refusals say before any slot was released (nothing measured yet)
        self.hold_times = HoldTimes(fallback=retry_after)
        self._total = 0
        self._by_key: dict[str, int] = {}
        self._by_worker: dict[str, int] = {}
        self._queue = WaitQueue()
        self._recheck: asyncio.TimerHandle | None = None
        self._admitted = 0
        self._rejected = {"global": 0, "worker": 0, "key": 0}
        self._wait_count = 0
        self._wait_seconds = 0.0

    # --- the request path ---------------------------------------------------------------

    async def acquire(self, *, key: str, workers: Sequence[Worker], choose: Choose) -> Lease:
        """Admit one request of ``key`` on one of ``workers`` (the eligible ones),
        waiting up to ``max_wait``; raise :class:`Overloaded` (global or worker
        shortage) or :class:`KeyLimitExceeded` (the key's own limit) after that."""
        waited = 0.0
        # Every change that frees capacity grants queued requests first, so a newcomer
        # that finds a slot here takes none that a queued request could use.
        hold = self._reserve(key, workers)
        if isinstance(hold, str):
            hold, waited = await self._wait(key, workers, hold)
        try:
            free = self._free_for(workers, hold)
            chosen = free[0] if len(free) == 1 else await choose(free)  # one: nothing to choose
            name = chosen.name
            if name != hold.name:
                counts = self._by_worker
                if counts.get(name, 0) < _capacity(chosen) and _ready(chosen):
                    counts[name] = counts.get(name, 0) + 1
                    self._drop_worker(hold.name)
                    self._queue.released(None, hold)
                else:
                    # it filled up (or was drained) while ``choose`` was awaiting:
                    # keep the worker we held
                    chosen = hold
        except BaseException:
            self._give_back(key, hold)
            self._wake()
            raise
        if chosen is not hold:
            self._wake()  # the held worker's slot is free again
        self._admitted += 1
        return Lease(self, chosen, key, waited)

    def refresh(self) -> None:
        """A worker became ready again (resumed, restarted): let the waiters
        that were parked on busy or unready workers look again."""
        self._queue.unpark_all()
        self._wake()

    def set_key_limit(self, key: str, limit: int | None) -> None:
        """Give ``key`` its own in-flight limit (``None``: the default one again)."""
        if limit is None:
            self._key_limits.pop(key, None)
        else:
            self._key_limits[key] = limit
        self._queue.released(key, None)  # a raised limit lets the key's waiters look again
        self._wake()

    def _limit_of(self, key: str) -> int | None:
        return self._key_limits.get(key, self._key_limit)

    def in_flight(self, worker_name: str) -> int:
        return self._by_worker.get(worker_name, 0)

    def stats(self) -> dict:
        """Gauges and counters to export: ``in_flight`` (global), ``by_key``,
        ``by_worker``, ``waiting``, ``admitted``, ``rejected`` by reason
        (``global``, ``worker``, ``key``), and ``wait_count``/``wait_seconds``:
        how many requests queued and the total seconds they spent queued."""
        return {
            "in_flight": self._total,
            "by_key": dict(self._by_key),
            "by_worker": dict(self._by_worker),
            "waiting": self._queue.waiting,
            "admitted": self._admitted,
            "rejected": dict(self._rejected),
            "wait_count": self._wait_count,
            "wait_seconds": self._wait_seconds,
            "hold_seconds": self.hold_times.snapshot(),
        }

    # --- slots ---------------------------------------------------------------------------

    def _reserve(self, key: str, workers: Sequence[Worker]) -> Worker | str:
        """Take the global and key slots and hold a free, ready worker; or take
        nothing and say which limit refused (``GLOBAL``, ``KEY``, ``WORKERS``, or
        ``UNREADY``: a worker with room is not ready)."""
        if self._global_limit is not None and self._total >= self._global_limit:
            return GLOBAL
        by_key = self._by_key
        held_by_key = by_key.get(key, 0)
        key_limit = self._key_limits.get(key, self._key_limit)
        if key_limit is not None and held_by_key >= key_limit:
            return KEY
        counts = self._by_worker
        unready = False
        for worker in workers:
            name = worker.name
            n = counts.get(name, 0)
            if n < _capacity(worker):
                if not _ready(worker):
                    unready = True
                    continue
                counts[name] = n + 1
                by_key[key] = held_by_key + 1
                self._total += 1
                return worker
        return UNREADY if unready else WORKERS

    def _give_back(self, key: str, worker: Worker) -> None:
        self._total -= 1
        n = self._by_key[key] - 1
        if n:
            self._by_key[key] = n
        else:
            del self._by_key[key]
        self._drop_worker(worker.name)
        self._queue.released(key, worker)

    def _drop_worker(self, name: str) -> None:
        n = self._by_worker[name] - 1
        if n:
            self._by_worker[name] = n
        else:
            del self._by_worker[name]

    def _free_for(self, workers: Sequence[Worker], hold: Worker) -> Sequence[Worker]:
        """The workers with room, counting ``hold`` as free (its slot is ours)."""
        counts = self._by_worker
        for worker in workers:
            if worker is not hold and (counts.get(worker.name, 0) >= _capacity(worker)
                                       or not _ready(worker)):
                break
        else:
            return workers  # all free: no copy on the hot path
        return [w for w in workers
                if w is hold or (counts.get(w.name, 0) < _capacity(w) and _ready(w))]

    # --- waiting -------------------------------------------------------------------------

    async def _wait(self, key: str, workers: Sequence[Worker],
                    reason: str) -> tuple[Worker, float]:
        # with no eligible worker there is nothing to wait for: readiness does not wake the queue
        if self._max_wait <= 0 or not workers:
            raise self._reject(key, workers)
        loop = asyncio.get_running_loop()
        waiter = self._queue.add(key, workers, loop.create_future(), reason)
        self._watch_unready()
        started = loop.time()
        waiter.timer = loop.call_at(started + self._max_wait, self._expire, waiter)
        try:
            # the expiry timer's result: how many were still queued when this one gave up
            queued_then = await waiter.future
        except BaseException:
            waiter.timer.cancel()
            self._queue.forget(waiter)
            if waiter.hold is not None:  # granted, then cancelled before it could run
                self._give_back(key, waiter.hold)
                self._wake()
            raise
        finally:
            self._wait_count += 1
            self._wait_seconds += loop.time() - started
        if waiter.hold is None:
            raise self._reject(key, workers, ahead=queued_then)
        return waiter.hold, loop.time() - started

    def _expire(self, waiter: Waiter) -> None:
        if waiter.hold is None and not waiter.future.done():
            self._queue.forget(waiter)
            # those still queued now are ahead of this client when it comes back
            waiter.future.set_result(self._queue.waiting)  # type: ignore[arg-type]

    def _wake(self) -> None:
        """Grant slots to waiters in arrival order, skipping those that still
        cannot go (see :mod:`pool.waitqueue`: O(1) amortised per release)."""
        if self._queue.waiting:
            self._queue.grant(self._reserve)
            self._watch_unready()

    def _watch_unready(self) -> None:
        """While requests wait for a worker to become ready (resumed, restarted:
        nothing we are told of), look again every ``RECHECK`` seconds."""
        if self._recheck is None and self._queue.unready:
            self._recheck = asyncio.get_running_loop().call_later(RECHECK, self._look_again)

    def _look_again(self) -> None:
        self._recheck = None
        self._queue.unpark_unready()
        self._wake()

    def _reject(self, key: str, workers: Sequence[Worker],
                ahead: int | None = None) -> Overloaded:
        """The refusal, with a ``retry_after`` from the hold times of the limit
        that refused (see :mod:`pool.holdtimes`): its slots free up at
        ``capacity / mean hold`` a second, and a client that comes back queues
        behind ``ahead`` requests (default: all those queued now)."""
        key_limit = self._limit_of(key)
        estimate = self.hold_times.retry_after
        if key_limit is not None and self._by_key.get(key, 0) >= key_limit:
            self._rejected["key"] += 1
            # the key's own slots turn over like everyone's; its queue is its own
            return KeyLimitExceeded(
                f"This API key already has {key_limit} requests in flight; "
                "retry when one finishes.",
                code="rate_limit_exceeded", retry_after=estimate([(None, key_limit)], 0))
        if ahead is None:
            ahead = self._queue.waiting
        if self._global_limit is not None and self._total >= self._global_limit:
            self._rejected["global"] += 1
            return Overloaded("The gateway is at capacity; retry shortly.",
                              retry_after=estimate([(None, self._global_limit)], ahead))
        self._rejected["worker"] += 1
        message = ("Every worker serving this model is busy; retry shortly." if workers
                   else "No worker serving this model is ready; retry shortly.")
        slots = [(w.name, _capacity(w)) for w in workers]
        return Overloaded(message, retry_after=estimate(slots, ahead))
