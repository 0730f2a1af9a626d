"""Remote workers registered at run time (``POST /internal/workers``): name →
the registration, a JSON-able mapping of its settings (an environment
variable's *name* for the key, never a secret).

Every replica keeps its pool in step with this store, so where the store is
shared (Redis) a worker registered through one replica is served by all.
:class:`MemoryWorkerRegistrations` is the single-replica store,
:class:`RedisWorkerRegistrations` the shared one (one hash, one call each).

Whoever can write to Redis could otherwise add a worker to every replica's
pool (its URL gets the health probe and client prompts), so each record in
Redis is signed: an HMAC-SHA256 over the deployment's key prefix, the name
and the registration's bytes, with a key that is not in Redis
(:func:`signing_key`: derived from the admin token, which every replica of a
deployment has). A record without a valid signature is ignored (logged once),
and a registration under its name replaces it.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Mapping, Protocol

import orjson
import structlog

from .redis_link import RedisDown, RedisLink, StoreUnavailable

__all__ = ["WorkerRegistrations", "MemoryWorkerRegistrations", "RedisWorkerRegistrations",
           "RegistrationsLost", "signing_key"]

log = structlog.get_logger("poolgate.workers")

_SIG_HEX = 64  # a record in Redis: the signature in hex, ".", the registration as JSON

# KEYS: the hash, the mark; ARGV: name, what the field held ('' = nothing), the record
_PUT_IF_UNCHANGED = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if (held or '') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('SET', KEYS[2], 1)
return 1
"""


def signing_key(secret: str | None) -> bytes | None:
    """The key that signs registrations, derived from a secret every replica of one
    deployment holds and Redis never sees (the admin token); ``None`` without one
    (then no registration is made here, and every record found in Redis is foreign)."""
    if not secret:
        return None
    return hmac.new(secret.encode(), b"poolgate worker registrations v1", hashlib.sha256).digest()


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

    def __init__(self, link: RedisLink, key: bytes | None) -> None:
        self._link = link
        self._sign_key = key
        self._put = link.client.register_script(_PUT_IF_UNCHANGED)
        self._ignored: dict[Any, bytes] = {}  # the foreign records seen (and logged) last poll
        self._key = link.prefix + "workers"  # a hash: worker name -> its registration as JSON
        # set with the first registration and never removed: an empty hash WITH it means every
        # worker was deleted; an empty hash without it, that Redis lost its data (restarted empty)
        self._mark = link.prefix + "workers:kept"

    async def add(self, name: str, registration: Registration) -> bool:
        client, data = self._link.client, self._record(name, registration)

        async def add() -> bool:
            for _ in range(3):  # a foreign record is replaced, a signed one kept
                held = await client.hget(self._key, name)
                if held is not None and self._verified(name, held) is not None:
                    return False
                # set it only if the field still holds what was just read (nothing, or foreign)
                if await self._put(keys=[self._key, self._mark], args=[name, held or b"", data]):
                    if held is not None:
                        log.warning("workers.foreign_registration_replaced", worker=name)
                    return True
            return False

        return await self._change(add)

    async def remove(self, name: str) -> bool:
        client = self._link.client
        return bool(await self._change(lambda: client.hdel(self._key, name)))

    async def all(self) -> dict[str, dict[str, Any]]:
        client = self._link.client

        async def read() -> tuple[dict[Any, bytes], int]:
            async with client.pipeline(transaction=False) as pipe:
                raw, kept = await pipe.hgetall(self._key).exists(self._mark).execute()
            return raw, kept

        raw, kept = await self._link.call(read)
        if not raw and not kept:
            raise RegistrationsLost("no worker registrations and no mark: Redis restarted empty")
        found: dict[str, dict[str, Any]] = {}
        ignored: dict[Any, bytes] = {}
        for key, record in raw.items():
            name = key.decode(errors="replace") if isinstance(key, bytes) else key
            registration = self._verified(name, record)
            if registration is not None:
                found[name] = registration
                continue
            if self._ignored.get(key) != record:  # logged once per record, not every poll
                log.warning("workers.unsigned_registration_ignored", worker=name)
            ignored[key] = record
        self._ignored = ignored
        return found

    async def restore(self, registrations: Mapping[str, Registration]) -> None:
        client = self._link.client

        async def put_back() -> None:
            async with client.pipeline(transaction=True) as pipe:
                for name, registration in registrations.items():
                    pipe.hsetnx(self._key, name, self._record(name, registration))
                await pipe.set(self._mark, 1).execute()

        if registrations:
            await self._link.call(put_back)

    def _signature(self, name: str, data: bytes) -> bytes:
        assert self._sign_key is not None
        message = b"\n".join((self._link.prefix.encode(), name.encode(), data))
        return hmac.new(self._sign_key, message, hashlib.sha256).hexdigest().encode()

    def _record(self, name: str, registration: Registration) -> bytes:
        if self._sign_key is None:  # the routes refuse first: no admin token, no admin API
            raise StoreUnavailable("Worker registrations need the admin token (their signing key).")
        data = orjson.dumps(dict(registration))
        return self._signature(name, data) + b"." + data

    def _verified(self, name: str, record: bytes) -> dict[str, Any] | None:
        """The registration ``record`` holds if this deployment signed it, else None."""
        if self._sign_key is None or not isinstance(record, bytes):
            return None
        signature, dot, data = record[:_SIG_HEX], record[_SIG_HEX:_SIG_HEX + 1], record[_SIG_HEX + 1:]
        if dot != b"." or not hmac.compare_digest(signature, self._signature(name, data)):
            return None
        try:
            registration = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        return registration if isinstance(registration, dict) else None

    async def _change(self, make: Any) -> Any:
        try:
            return await self._link.call(make)
        except RedisDown:
            raise StoreUnavailable("Worker registrations are shared through Redis, which is "
                                   "out of reach; try again shortly.") from None
