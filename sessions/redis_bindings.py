"""Affinity bindings and the cli session index in Redis, shared by replicas.

Both keep a local memory store beside Redis: every binding this replica reads
or writes is mirrored there (a dict operation), and while Redis is down the
local store answers alone. Routing then continues by rendezvous hashing and
by what this replica had seen: every replica hashes a new session to the same
worker, so most sessions stay put through an outage. When Redis returns, the
shared bindings win again.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from .bindings import MemoryBindingStore
from .redis_link import RedisDown, RedisLink
from .upstream import MemoryUpstreamSessions

__all__ = ["RedisBindingStore", "RedisUpstreamSessions", "cli_index_keys"]


# KEYS[1] binding; ARGV expected ('' = unbound), worker, ttl (ms)
_CLAIM = """
local cur = redis.call('GET', KEYS[1])
if cur == false then cur = '' end
if cur ~= '' and cur ~= ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return cur
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return ARGV[2]
"""

# The cli session index: an entry per conversation (SET PX: its own time to
# live), and per worker a sorted set of its entries' key names scored by when
# each expires, so that every member goes with its entry (reaped on each put)
# and the set lives as long as its newest member. Redis's clock (TIME) scores.

# KEYS[1] entry, KEYS[2] the worker's sorted set; ARGV worker, ttl (ms)
_CLI_PUT = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), KEYS[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
"""

# KEYS[1] the worker's sorted set; ARGV worker
_DROP_WORKER = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local n = 0
for _, key in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    n = n + 1
  end
end
redis.call('DEL', KEYS[1])
return n
"""


def cli_index_keys(replica: str, prefix: str) -> tuple[str, str]:
    """The key name prefixes of a replica's cli session index: of its entries
    (``+ <conversation hash>``) and of its workers' sorted sets (``+ <worker>``).
    Per replica: cli workers are processes of one replica, and their names
    repeat on every replica of a deployment."""
    return f"{prefix}cli:{replica}:", f"{prefix}cliw:{replica}:"


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class RedisBindingStore:
    """:class:`~pool.routing.BindingStore` in Redis: ``GETEX`` (sliding), ``SET EX``,
    ``DEL`` and a compare-and-set script; one round trip each.

    A binding this replica read or wrote less than ``fresh`` seconds ago is
    answered from the local mirror without a round trip: a busy session costs
    one Redis read per ``fresh`` seconds, its time to live still slides (by
    that read), and a rebinding by another replica is seen within ``fresh``
    seconds (affinity is a hint for warm caches: a late move costs nothing else).
    """

    def __init__(self, link: RedisLink, *, ttl: float = 3600, max_items: int = 100_000,
                 fresh: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._link = link
        self._bind = link.prefix + "bind:"
        self.local = MemoryBindingStore(ttl=ttl, max_items=max_items)
        self._claim = link.client.register_script(_CLAIM)
        self._fallbacks = 0
        self._fresh = min(fresh, ttl / 4)  # the reads that slide the time to live come often enough
        self._clock = clock
        self._confirmed: dict[str, float] = {}  # key -> when Redis last said so
        self._max_confirmed = max_items
        self._local_hits = 0

    def _confirm(self, key: str) -> None:
        confirmed = self._confirmed
        if len(confirmed) >= self._max_confirmed and key not in confirmed:
            confirmed.clear()  # a cache of a cache: start over rather than track order
        confirmed[key] = self._clock()

    async def get(self, key: str) -> str | None:
        seen = self._confirmed.get(key)
        if seen is not None and self._clock() - seen < self._fresh and self._link.up:
            worker = await self.local.get(key)
            if worker is not None:
                self._local_hits += 1
                return worker
        client = self._link.client
        try:
            worker = _text(await self._link.call(
                lambda: client.getex(self._bind + key, px=int(self.ttl * 1000))))
        except RedisDown:
            self._fallbacks += 1
            return await self.local.get(key)
        if worker is None:
            await self.local.delete(key)
            self._confirmed.pop(key, None)
        else:
            await self.local.set(key, worker)
            self._confirm(key)
        return worker

    async def set(self, key: str, worker: str, ttl: float | None = None) -> None:
        ttl = self.ttl if ttl is None else ttl
        await self.local.set(key, worker, ttl)
        client = self._link.client
        try:
            await self._link.call(lambda: client.set(self._bind + key, worker, px=int(ttl * 1000)))
        except RedisDown:
            self._fallbacks += 1
        else:
            self._confirm(key)

    async def delete(self, key: str) -> None:
        await self.local.delete(key)
        self._confirmed.pop(key, None)
        client = self._link.client
        try:
            await self._link.call(lambda: client.delete(self._bind + key))
        except RedisDown:
            self._fallbacks += 1

    async def claim(self, key: str, expected: str | None, worker: str,
                    ttl: float | None = None) -> str:
        ttl = self.ttl if ttl is None else ttl
        try:
            held = _text(await self._link.call(lambda: self._claim(
                keys=[self._bind + key], args=[expected or "", worker, int(ttl * 1000)])))
        except RedisDown:
            self._fallbacks += 1
            return await self.local.claim(key, expected, worker, ttl)
        assert held is not None
        await self.local.set(key, held, ttl)
        self._confirm(key)
        return held

    def stats(self) -> dict[str, int]:
        return {**self.local.stats(), "redis_fallbacks": self._fallbacks,
                "fresh_local_hits": self._local_hits}


class RedisUpstreamSessions:
    """:class:`~pool.cli.index.SessionIndex` in Redis, one per replica
    (:func:`cli_index_keys`): ``cli:<replica>:<hash>`` → worker, each entry
    with its own time to live of ``max_age`` (the count bound is Redis's
    ``maxmemory``), plus a sorted set per worker, by expiry, so its entries can
    be dropped at once."""

    def __init__(self, link: RedisLink, *, replica: str,
                 max_entries: int = 10_000, max_age: float = 6 * 3600) -> None:
        self._link = link
        self._ttl_ms = int(max_age * 1000)
        self._entry, self._worker = cli_index_keys(replica, link.prefix)
        self.local = MemoryUpstreamSessions(max_entries=max_entries, max_age=max_age)
        self._put = link.client.register_script(_CLI_PUT)
        self._drop_worker = link.client.register_script(_DROP_WORKER)
        self._fallbacks = 0

    async def get(self, key: str) -> str | None:
        client = self._link.client
        try:
            return _text(await self._link.call(lambda: client.get(self._entry + key)))
        except RedisDown:
            self._fallbacks += 1
            return await self.local.get(key)

    async def put(self, key: str, worker: str) -> None:
        await self.local.put(key, worker)

        try:
            await self._link.call(lambda: self._put(
                keys=[self._entry + key, self._worker + worker], args=[worker, self._ttl_ms]))
        except RedisDown:
            self._fallbacks += 1

    async def drop(self, key: str) -> None:
        await self.local.drop(key)
        client = self._link.client
        try:
            await self._link.call(lambda: client.delete(self._entry + key))
        except RedisDown:
            self._fallbacks += 1

    async def drop_worker(self, worker: str) -> None:
        await self.local.drop_worker(worker)
        try:
            await self._link.call(lambda: self._drop_worker(keys=[self._worker + worker],
                                                            args=[worker]))
        except RedisDown:
            self._fallbacks += 1

    def stats(self) -> dict[str, Any]:
        return {**self.local.stats(), "redis_fallbacks": self._fallbacks}
