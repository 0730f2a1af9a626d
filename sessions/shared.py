"""Small shared state between replicas: named locks (one login per account at
a time) and the set of workers an operator drained.

Each has a memory version (one process: the default) and a Redis version
(every replica behind one ``server.redis_url``).

Locks: ``async with locks.hold(f"login:{worker}", ttl=600, wait=30): ...``.
The Redis lock's ``ttl`` must outlast what it guards: when it expires the
lock is free for another replica, and releasing it late raises (the caller
learns its work overran). While Redis is down a Redis lock falls back to a
process-local lock, so it still excludes within this replica — and says so
in the log; across replicas nothing can be promised without Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Protocol

import structlog
from redis.exceptions import LockError, RedisError

from .redis_link import RedisDown, RedisLink

__all__ = ["Locks", "MemoryLocks", "RedisLocks", "LockTimeout", "DrainedSet",
           "MemoryDrainedSet", "RedisDrainedSet"]

log = structlog.get_logger("poolgate.shared")



class LockTimeout(TimeoutError):
    """The lock stayed held by someone else for longer than ``wait``."""


class Locks(Protocol):
    def hold(self, name: str, *, ttl: float, wait: float | None = None
             ) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold lock ``name`` (at most ``ttl`` seconds where that is enforced),
        waiting up to ``wait`` seconds (``None``: forever) for it, else :class:`LockTimeout`."""
        ...


class MemoryLocks:
    """One ``asyncio.Lock`` per name, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, name: str, *, ttl: float, wait: float | None = None
                   ) -> AsyncIterator[None]:
        lock, users = self._locks.get(name, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[name] = (lock, users + 1)
        try:
            try:
                async with asyncio.timeout(wait):
                    await lock.acquire()
            except TimeoutError:
                raise LockTimeout(f"lock {name!r} still held after {wait} s") from None
            try:
                yield
            finally:
                lock.release()
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)

    def held(self, name: str) -> bool:
        entry = self._locks.get(name)
        return entry is not None and entry[0].locked()


class RedisLocks:
    """``redis.asyncio`` locks (``SET NX PX`` with a token), one per name, across replicas."""

    def __init__(self, link: RedisLink, *, poll: float = 0.05) -> None:
        self._link = link
        self._prefix = link.prefix + "lock:"
        self._poll = poll
        self.local = MemoryLocks()

    @contextlib.asynccontextmanager
    async def hold(self, name: str, *, ttl: float, wait: float | None = None
                   ) -> AsyncIterator[None]:
        if not self._link.up:
            log.warning("locks.local_fallback", lock=name)
            async with self.local.hold(name, ttl=ttl, wait=wait):
                yield
            return
        lock = self._link.client.lock(self._prefix + name, timeout=ttl, sleep=self._poll,
                                      blocking_timeout=wait)
        try:
            acquired = await lock.acquire()
        except (RedisError, OSError) as exc:
            self._link.mark_down(exc)
            raise RedisDown(type(exc).__name__) from exc
        if not acquired:
            raise LockTimeout(f"lock {name!r} still held after {wait} s")
        try:
            yield
        finally:
            try:
                await lock.release()
            except LockError:
                log.warning("locks.expired_while_held", lock=name, ttl=ttl)
                raise
            except (RedisError, OSError) as exc:
                # the lock's time to live frees it for the others
                self._link.mark_down(exc)


class DrainedSet(Protocol):
    """The names of the workers an operator drained, shared by the replicas."""

    async def add(self, name: str) -> None: ...

    async def discard(self, name: str) -> None: ...

    async def members(self) -> set[str]: ...


class MemoryDrainedSet:
    def __init__(self) -> None:
        self._names: set[str] = set()

    async def add(self, name: str) -> None:
        self._names.add(name)

    async def discard(self, name: str) -> None:
        self._names.discard(name)

    async def members(self) -> set[str]:
        return set(self._names)


class RedisDrainedSet:
    """A Redis set; replicas poll it (``SMEMBERS``, with the link's health
    probe). Raises :class:`RedisDown` when Redis is out of reach."""

    def __init__(self, link: RedisLink) -> None:
        self._link = link
        self._key = link.prefix + "drained"

    async def add(self, name: str) -> None:
        client = self._link.client
        await self._link.call(lambda: client.sadd(self._key, name))

    async def discard(self, name: str) -> None:
        client = self._link.client
        await self._link.call(lambda: client.srem(self._key, name))

    async def members(self) -> set[str]:
        client = self._link.client
        raw = await self._link.call(lambda: client.smembers(self._key))
        return {m.decode() if isinstance(m, bytes) else m for m in raw}
