"""The admission guard's queue of waiting requests, with O(1) amortised wake-ups.

Waiters with the same key and the same eligible workers are interchangeable:
when the oldest of them cannot be granted, none of them can. So waiters are
kept in *groups* (a FIFO per key and worker set), and a wake-up only looks at
the oldest waiter of each group it considers, in arrival order (a heap on the
head's arrival number).

A group whose head is refused for a reason that only a release can lift is
*parked* on that reason: on its key (the key's limit is full) or on each of
its workers (all full or not ready). A release of ``(key, worker)`` moves the
groups parked on that key and on that worker back into the heap; the others
are not looked at. A group refused by the global limit stays in the heap: the
next release of any slot may serve it. Each waiter is granted, expired or
cancelled once, and each park/unpark is paid for by the release that caused
it, so the work per release is O(1) amortised in the number of waiters
(plus a log of the number of groups for the heap).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
from typing import Callable, Sequence

from .worker import Worker

__all__ = ["Waiter", "WaitQueue", "GLOBAL", "KEY", "WORKERS", "UNREADY"]

# why a head could not be granted; UNREADY: a worker with room is not ready (drained,
# restarting): no release may come to lift that, so such groups are also looked at
# again on a timer (see AdmissionGuard)
GLOBAL, KEY, WORKERS, UNREADY = "global", "key", "workers", "unready"

_COMPACT_AT = 32  # dead waiters in a group before it is rebuilt without them


class Waiter:
    __slots__ = ("seq", "key", "workers", "future", "hold", "timer", "group", "gone")

    def __init__(self, seq: int, key: str, workers: Sequence[Worker],
                 future: asyncio.Future[None]) -> None:
        self.seq = seq
        self.key = key
        self.workers = workers
        self.future = future
        self.hold: Worker | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.group: _Group | None = None
        self.gone = False  # expired or cancelled while queued


class _Group:
    __slots__ = ("ident", "key", "workers", "waiters", "live", "dead", "queued", "token")

    def __init__(self, ident: tuple, key: str, workers: Sequence[Worker]) -> None:
        self.ident = ident
        self.key = key
        self.workers = workers
        self.waiters: collections.deque[Waiter] = collections.deque()
        self.live = 0
        self.dead = 0
        self.queued = False  # in the heap (else parked, or empty)
        self.token = 0  # bumped on every park/unpark: older parking entries are stale

    def head(self) -> Waiter | None:
        waiters = self.waiters
        while waiters and waiters[0].gone:
            waiters.popleft()
            self.dead -= 1
        return waiters[0] if waiters else None


# reserve(key, workers) -> the held worker, or the reason it could not be held
Reserve = Callable[[str, Sequence[Worker]], "Worker | str"]


class WaitQueue:
    """Waiting requests, granted in arrival order among those that can proceed."""

    def __init__(self) -> None:
        self._groups: dict[tuple, _Group] = {}
        self._heap: list[tuple[int, int, _Group]] = []
        self._by_key: dict[str, list[tuple[_Group, int]]] = {}
        self._by_worker: dict[int, list[tuple[_Group, int]]] = {}
        self._unready: list[tuple[_Group, int]] = []
        self._seq = itertools.count()
        self._tie = itertools.count()
        self.waiting = 0

    def __bool__(self) -> bool:
        return self.waiting > 0

    def add(self, key: str, workers: Sequence[Worker], future: asyncio.Future[None],
            reason: str) -> Waiter:
        """Queue a request that was just refused for ``reason``."""
        ident = (key, tuple(map(id, workers)))
        group = self._groups.get(ident)
        waiter = Waiter(next(self._seq), key, workers, future)
        if group is None:
            group = self._groups[ident] = _Group(ident, key, workers)
            group.waiters.append(waiter)
            group.live = 1
            self._place(group, waiter.seq, reason)
        else:  # an older waiter of the group heads it and is queued or parked already
            group.waiters.append(waiter)
            group.live += 1
        waiter.group = group
        self.waiting += 1
        return waiter

    def forget(self, waiter: Waiter) -> None:
        """``waiter`` left the queue without a grant (expired or cancelled)."""
        if waiter.gone or waiter.hold is not None:
            return
        waiter.gone = True
        self.waiting -= 1
        group = waiter.group
        assert group is not None
        group.live -= 1
        group.dead += 1
        if not group.live:
            self._drop(group)
        elif group.dead > _COMPACT_AT and group.dead > group.live:
            group.waiters = collections.deque(w for w in group.waiters if not w.gone)
            group.dead = 0

    def released(self, key: str | None, worker: Worker | None) -> None:
        """A slot of ``key`` and/or on ``worker`` came free: unpark who was waiting for it."""
        if not self._by_key and not self._by_worker:
            return  # nobody parked (the common case): no lookups
        for parked in (self._by_key.pop(key, None) if key is not None else None,
                       self._by_worker.pop(id(worker), None) if worker is not None else None):
            if parked:
                self._unpark(parked)

    @property
    def unready(self) -> bool:
        """Whether some group waits for a worker to become ready."""
        return bool(self._unready)

    def unpark_unready(self) -> None:
        """Put the groups waiting for a worker to become ready back in the heap."""
        parked, self._unready = self._unready, []
        self._unpark(parked)

    def unpark_all(self) -> None:
        """Put every parked group back in the heap (O(groups): for rare events)."""
        parked = [*self._by_key.values(), *self._by_worker.values(), self._unready]
        self._by_key, self._by_worker, self._unready = {}, {}, []
        for entries in parked:
            self._unpark(entries)

    def grant(self, reserve: Reserve) -> None:
        """Grant slots to the oldest heads that can go, until the global limit is full."""
        heap = self._heap
        while heap:
            seq, _, group = heap[0]
            head = group.head()
            if head is None or not group.live:
                heapq.heappop(heap)
                group.queued = False
                continue
            if head.future.done():  # cancelled: its task has not run its cleanup yet
                self.forget(head)
                continue
            if head.seq != seq:  # the old head left: re-sort on the new one
                heapq.heapreplace(heap, (head.seq, next(self._tie), group))
                continue
            got = reserve(group.key, group.workers)
            if got == GLOBAL:
                return  # nobody can go until a slot is released
            if isinstance(got, str):
                heapq.heappop(heap)
                group.queued = False
                self._park(group, got)
                continue
            group.waiters.popleft()
            group.live -= 1
            self.waiting -= 1
            head.hold = got
            if head.timer is not None:
                head.timer.cancel()
            head.future.set_result(None)
            nxt = group.head()
            if nxt is None or not group.live:
                heapq.heappop(heap)
                group.queued = False
                self._drop(group)
            else:
                heapq.heapreplace(heap, (nxt.seq, next(self._tie), group))

    # --- placement -------------------------------------------------------------------

    def _unpark(self, entries: list[tuple[_Group, int]]) -> None:
        for group, token in entries:
            if group.token == token and not group.queued and group.live:
                head = group.head()
                if head is not None:
                    self._push(group, head.seq)

    def _place(self, group: _Group, seq: int, reason: str) -> None:
        if reason == GLOBAL:
            self._push(group, seq)
        else:
            self._park(group, reason)

    def _push(self, group: _Group, seq: int) -> None:
        group.queued = True
        group.token += 1
        heapq.heappush(self._heap, (seq, next(self._tie), group))

    def _park(self, group: _Group, reason: str) -> None:
        group.token += 1
        entry = (group, group.token)
        if reason == KEY:
            _append(self._by_key, group.key, entry)
        else:
            if reason == UNREADY:
                self._unready.append(entry)
            for worker in group.workers:
                _append(self._by_worker, id(worker), entry)

    def _drop(self, group: _Group) -> None:
        group.token += 1  # parking entries go stale; a heap entry is skipped when empty
        if self._groups.get(group.ident) is group:
            del self._groups[group.ident]


def _append(parked: dict, where: object, entry: tuple[_Group, int]) -> None:
    """Park ``entry``; a list that only grows (a worker that never frees a slot,
    e.g. a drained one) sheds its stale entries each time it doubles."""
    entries = parked.setdefault(where, [])
    entries.append(entry)
    n = len(entries)
    if n >= 64 and not n & (n - 1):
        entries[:] = [(g, t) for g, t in entries if g.token == t]
