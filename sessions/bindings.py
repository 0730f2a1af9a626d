"""Affinity bindings: session key → worker name, each with a time to live.

:class:`~pool.routing.BindingStore` is the interface (defined in ``pool`` so
the router needs nothing from here); :class:`MemoryBindingStore` keeps the
bindings in this process. A Redis store joins behind the same interface:
``get`` as ``GETEX key EX ttl`` (the sliding read), ``set`` as
``SET key worker EX ttl``, ``delete`` as ``DEL``, ``claim`` (compare and
set) as a script (``sessions.redis_stores``).

Expiry is sliding: every hit restarts a binding's time to live, so a session
in use is never moved by expiry, and an idle one is forgotten ``ttl`` seconds
after its last request. The memory store is bounded: past ``max_items`` the
least recently used binding goes first (with a sliding time to live that is
also the one nearest expiry).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

from pool.routing import BindingStore

__all__ = ["BindingStore", "MemoryBindingStore"]

# Expired bindings nobody asks for again are dropped from the old end on each
# write, a few at a time, so a burst of writes pays a bounded amount.
_PURGE_PER_SET = 4


class _Binding:
    # Mutable on purpose: a hit moves ``expires`` in place instead of
    # allocating a new record on every request.
    __slots__ = ("worker", "expires", "ttl")

    def __init__(self, worker: str, expires: float, ttl: float) -> None:
        self.worker = worker
        self.expires = expires
        self.ttl = ttl


class MemoryBindingStore:
    """Bindings in a dict, least recently used first; ``clock`` is monotonic seconds."""

    def __init__(self, ttl: float = 3600, max_items: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ttl <= 0 or max_items < 1:
            raise ValueError("ttl must be positive and max_items at least 1")
        self.ttl = ttl
        self.max_items = max_items
        self._clock = clock
        self._items: OrderedDict[str, _Binding] = OrderedDict()
        self._hits = self._misses = self._expired = self._evicted = self._sets = 0

    async def get(self, key: str) -> str | None:
        """The bound worker, or ``None`` (unknown or expired); a hit restarts the time to live."""
        binding = self._items.get(key)
        if binding is None:
            self._misses += 1
            return None
        now = self._clock()
        if binding.expires <= now:
            del self._items[key]
            self._expired += 1
            self._misses += 1
            return None
        binding.expires = now + binding.ttl
        self._items.move_to_end(key)
        self._hits += 1
        return binding.worker

    async def set(self, key: str, worker: str, ttl: float | None = None) -> None:
        """Bind ``key`` to ``worker`` for ``ttl`` seconds (the store's default when ``None``)."""
        ttl = self.ttl if ttl is None else ttl
        now = self._clock()
        items = self._items
        binding = items.get(key)
        if binding is None:
            items[key] = _Binding(worker, now + ttl, ttl)
        else:
            binding.worker, binding.expires, binding.ttl = worker, now + ttl, ttl
            items.move_to_end(key)
        self._sets += 1
        self._purge(now)
        while len(items) > self.max_items:
            items.popitem(last=False)
            self._evicted += 1

    async def delete(self, key: str) -> None:
        self._items.pop(key, None)

    async def claim(self, key: str, expected: str | None, worker: str,
                    ttl: float | None = None) -> str:
        """Bind ``key`` to ``worker`` if it is bound to ``expected`` (``None``:
        unbound or expired); the binding held afterwards."""
        binding = self._items.get(key)
        current = binding.worker if binding is not None and binding.expires > self._clock() else None
        if current is not None and current != expected:
            return current
        await self.set(key, worker, ttl)
        return worker

    def _purge(self, now: float) -> None:
        items = self._items
        for _ in range(_PURGE_PER_SET):
            if not items:
                return
            key, binding = next(iter(items.items()))
            if binding.expires > now:
                return
            del items[key]
            self._expired += 1

    def __len__(self) -> int:
        return len(self._items)

    def stats(self) -> dict[str, int]:
        return {"items": len(self._items), "hits": self._hits, "misses": self._misses,
                "expired": self._expired, "evicted": self._evicted, "sets": self._sets}
