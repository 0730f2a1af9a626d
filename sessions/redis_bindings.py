"""Affinity bindings and the cli session index in Redis, shared by replicas.

Both keep a local memory store beside Redis: every binding this replica reads
or writes is mirrored there (a dict operation), and while Redis is down the
local store answers alone. Routing then continues by rendezvous hashing and
by what this replica had seen: every replica hashes a new session to the same
worker, so most sessions stay put through an outage. When Redis returns, the
shared bindings win again.
"""

from __future__ import annotations

from typing import Any

from .bindings import MemoryBindingStore
from .redis_link import PREFIX, RedisDown, RedisLink
from .upstream import MemoryUpstreamSessions

__all__ = ["RedisBindingStore", "RedisUpstreamSessions"]

_BIND = PREFIX + "bind:"
_CLI = PREFIX + "cli:"
_CLI_WORKER = PREFIX + "cliw:"

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

# KEYS[1] the worker's set of index keys; ARGV worker
_DROP_WORKER = """
local n = 0
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    n = n + 1
  end
end
redis.call('DEL', KEYS[1])
return n
"""


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class RedisBindingStore:
    """:class:`~pool.routing.BindingStore` in Redis: ``GETEX`` (sliding), ``SET EX``,
    ``DEL`` and a compare-and-set script; one round trip each."""

    def __init__(self, link: RedisLink, *, ttl: float = 3600, max_items: int = 100_000) -> None:
        self.ttl = ttl
        self._link = link
        self.local = MemoryBindingStore(ttl=ttl, max_items=max_items)
        self._claim = link.client.register_script(_CLAIM)
        self._fallbacks = 0

    async def get(self, key: str) -> str | None:
        client = self._link.client
        try:
            worker = _text(await self._link.call(
                lambda: client.getex(_BIND + key, px=int(self.ttl * 1000))))
        except RedisDown:
            self._fallbacks += 1
            return await self.local.get(key)
        if worker is None:
            await self.local.delete(key)
        else:
            await self.local.set(key, worker)
        return worker

    async def set(self, key: str, worker: str, ttl: float | None = None) -> None:
        ttl = self.ttl if ttl is None else ttl
        await self.local.set(key, worker, ttl)
        client = self._link.client
        try:
            await self._link.call(lambda: client.set(_BIND + key, worker, px=int(ttl * 1000)))
        except RedisDown:
            self._fallbacks += 1

    async def delete(self, key: str) -> None:
        await self.local.delete(key)
        client = self._link.client
        try:
            await self._link.call(lambda: client.delete(_BIND + key))
        except RedisDown:
            self._fallbacks += 1

    async def claim(self, key: str, expected: str | None, worker: str,
                    ttl: float | None = None) -> str:
        ttl = self.ttl if ttl is None else ttl
        try:
            held = _text(await self._link.call(lambda: self._claim(
                keys=[_BIND + key], args=[expected or "", worker, int(ttl * 1000)])))
        except RedisDown:
            self._fallbacks += 1
            return await self.local.claim(key, expected, worker, ttl)
        assert held is not None
        await self.local.set(key, held, ttl)
        return held

    def stats(self) -> dict[str, int]:
        return {**self.local.stats(), "redis_fallbacks": self._fallbacks}


class RedisUpstreamSessions:
    """:class:`~pool.cli.index.SessionIndex` in Redis: ``cli:<hash>`` → worker
    with a time to live of ``max_age`` (the count bound is Redis's
    ``maxmemory``), plus a set per worker so its entries can be dropped at once."""

    def __init__(self, link: RedisLink, *, max_entries: int = 10_000,
                 max_age: float = 6 * 3600) -> None:
        self._link = link
        self._ttl_ms = int(max_age * 1000)
        self.local = MemoryUpstreamSessions(max_entries=max_entries, max_age=max_age)
        self._drop_worker = link.client.register_script(_DROP_WORKER)
        self._fallbacks = 0

    async def get(self, key: str) -> str | None:
        client = self._link.client
        try:
            return _text(await self._link.call(lambda: client.get(_CLI + key)))
        except RedisDown:
            self._fallbacks += 1
            return await self.local.get(key)

    async def put(self, key: str, worker: str) -> None:
        await self.local.put(key, worker)

        async def write() -> None:
            pipe = self._link.client.pipeline(transaction=False)
            pipe.set(_CLI + key, worker, px=self._ttl_ms)
            pipe.sadd(_CLI_WORKER + worker, _CLI + key)
            pipe.pexpire(_CLI_WORKER + worker, self._ttl_ms)
            await pipe.execute()
        try:
            await self._link.call(write)
        except RedisDown:
            self._fallbacks += 1

    async def drop(self, key: str) -> None:
        await self.local.drop(key)
        client = self._link.client
        try:
            await self._link.call(lambda: client.delete(_CLI + key))
        except RedisDown:
            self._fallbacks += 1

    async def drop_worker(self, worker: str) -> None:
        await self.local.drop_worker(worker)
        try:
            await self._link.call(lambda: self._drop_worker(keys=[_CLI_WORKER + worker],
                                                            args=[worker]))
        except RedisDown:
            self._fallbacks += 1

    def stats(self) -> dict[str, Any]:
        return {**self.local.stats(), "redis_fallbacks": self._fallbacks}
