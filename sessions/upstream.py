"""Upstream session index of cli workers: conversation hash → the worker
whose CLI holds that conversation (see :mod:`pool.cli.index`).

:class:`MemoryUpstreamSessions` keeps it in this process, bounded by count
(least recently used first) and by age (since written). A Redis store joins
behind the same interface with scale-out.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Callable

from pool.cli.index import SessionIndex

__all__ = ["SessionIndex", "MemoryUpstreamSessions"]


class MemoryUpstreamSessions:
    def __init__(self, max_entries: int = 10_000, max_age: float = 6 * 3600,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1 or max_age <= 0:
            raise ValueError("max_entries must be at least 1 and max_age positive")
        self.max_entries = max_entries
        self.max_age = max_age
        self._clock = clock
        self._items: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._counts = {"hits": 0, "misses": 0, "writes": 0, "drops": 0, "expired": 0,
                        "evicted": 0}

    async def get(self, key: str) -> str | None:
        item = self._items.get(key)
        if item is not None and self._clock() - item[1] > self.max_age:
            del self._items[key]
            self._counts["expired"] += 1
            item = None
        if item is None:
            self._counts["misses"] += 1
            return None
        self._items.move_to_end(key)
        self._counts["hits"] += 1
        return item[0]

    async def put(self, key: str, worker: str) -> None:
        self._items[key] = (worker, self._clock())
        self._items.move_to_end(key)
        self._counts["writes"] += 1
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)
            self._counts["evicted"] += 1

    async def drop(self, key: str) -> None:
        if self._items.pop(key, None) is not None:
            self._counts["drops"] += 1

    async def drop_worker(self, worker: str) -> None:
        stale = [k for k, (w, _t) in self._items.items() if w == worker]
        for key in stale:
            del self._items[key]
        self._counts["drops"] += len(stale)

    def stats(self) -> dict[str, Any]:
        return {"entries": len(self._items), **self._counts}


_check: type[SessionIndex] = MemoryUpstreamSessions  # structural conformance, checked by mypy
