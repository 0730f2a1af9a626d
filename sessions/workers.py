"""Remote workers registered at run time (``POST /internal/workers``): name →
the registration, a JSON-able mapping of its settings (an environment
variable's *name* for the key, never a secret).

Every replica keeps its pool in step with this store, so where the store is
shared (Redis) a worker registered through one replica is served by all.
:class:`MemoryWorkerRegistrations` is the single-replica store,
:class:`RedisWorkerRegistrations` the shared one (one hash, one call each).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import orjson

from .redis_link import PREFIX, RedisDown, RedisLink, StoreUnavailable

__all__ = ["WorkerRegistrations", "MemoryWorkerRegistrations", "RedisWorkerRegistrations",
           "RegistrationsLost"]

_KEY = PREFIX + "workers"  # a hash: worker name -> its registration as JSON
# set with the first registration and never removed: an empty hash WITH it means every
# worker was deleted; an empty hash without it, that Redis lost its data (restarted empty)
_MARK = PREFIX + "workers:kept"


class RegistrationsLost(Exception):
    """The store lost its registrations (not deleted: Redis came back empty)."""

Registration = Mapping[str, Any]


class WorkerRegistrations(Protocol):
    """Where registrations live. ``shared``: other replicas see changes (poll ``all``)."""

    shared: bool

    async def add(self, name: str, registration: Registration) -> bool:
        """Store ``registration`` under ``name``; False (and nothing stored) if taken."""
        ...

    async def remove(self, name: str) -> bool:
        """Forget ``name``; False if it was not registered."""
        ...

    async def all(self) -> dict[str, dict[str, Any]]:
        """Every registration, by name; :class:`RegistrationsLost` if the store lost them."""
        ...

    async def restore(self, registrations: Mapping[str, Registration]) -> None:
        """Put back what a lost store had (the names nobody registered since)."""
        ...


class MemoryWorkerRegistrations:
    """Registrations of this process only."""

    shared = False

    def __init__(self) -> None:
        self._items: dict[str, dict[str, Any]] = {}

    async def add(self, name: str, registration: Registration) -> bool:
        if name in self._items:
            return False
        self._items[name] = dict(registration)
        return True

    async def remove(self, name: str) -> bool:
        return self._items.pop(name, None) is not None

    async def all(self) -> dict[str, dict[str, Any]]:
        return {name: dict(reg) for name, reg in self._items.items()}

    async def restore(self, registrations: Mapping[str, Registration]) -> None:
        for name, registration in registrations.items():
            self._items.setdefault(name, dict(registration))


class RedisWorkerRegistrations:
    """A Redis hash shared by the replicas. Changes need Redis (they must reach
    every replica): while it is down they are refused with a 503
    (:class:`StoreUnavailable`); ``all`` raises :class:`RedisDown` and the
    replicas keep the workers they have until it answers again."""

    shared = True

    def __init__(self, link: RedisLink) -> None:
        self._link = link

    async def add(self, name: str, registration: Registration) -> bool:
        client, data = self._link.client, orjson.dumps(dict(registration))

        async def add() -> bool:
            async with client.pipeline(transaction=True) as pipe:
                added, _ = await pipe.hsetnx(_KEY, name, data).set(_MARK, 1).execute()
            return bool(added)

        return await self._change(add)

    async def remove(self, name: str) -> bool:
        client = self._link.client
        return bool(await self._change(lambda: client.hdel(_KEY, name)))

    async def all(self) -> dict[str, dict[str, Any]]:
        client = self._link.client

        async def read() -> tuple[dict[Any, bytes], int]:
            async with client.pipeline(transaction=False) as pipe:
                raw, kept = await pipe.hgetall(_KEY).exists(_MARK).execute()
            return raw, kept

        raw, kept = await self._link.call(read)
        if not raw and not kept:
            raise RegistrationsLost("no worker registrations and no mark: Redis restarted empty")
        return {(k.decode() if isinstance(k, bytes) else k): orjson.loads(v)
                for k, v in raw.items()}

    async def restore(self, registrations: Mapping[str, Registration]) -> None:
        client = self._link.client

        async def put_back() -> None:
            async with client.pipeline(transaction=True) as pipe:
                for name, registration in registrations.items():
                    pipe.hsetnx(_KEY, name, orjson.dumps(dict(registration)))
                await pipe.set(_MARK, 1).execute()

        if registrations:
            await self._link.call(put_back)

    async def _change(self, make: Any) -> Any:
        try:
            return await self._link.call(make)
        except RedisDown:
            raise StoreUnavailable("Worker registrations are shared through Redis, which is "
                                   "out of reach; try again shortly.") from None
