"""The stores the gateway shares with other replicas, chosen by
``server.redis_url`` (memory when unset), and the loop that keeps this
replica in step: the Redis health probe, and the workers drained through
any replica.

Drains: an operator's drain or resume is applied here at once and written to
the shared set; every replica polls the set with the health probe (every
``probe_interval``) and drains or resumes its own workers of those names.
A change made while Redis is down is kept and written when it returns, and
after an outage each replica writes its drains again (Redis may come back
empty); a resume made elsewhere while this replica could not reach Redis is
then undone here, the safe direction for a drain. A cli worker's drain or
resume from the shared set goes through its account's state machine, as an
operator's does (deferred to the next sync while the account refuses it).
"""

from __future__ import annotations

import inspect
import re
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

import structlog

from auth.limits import MemoryLimits
from pool.errors import Conflict
from sessions.bindings import MemoryBindingStore
from sessions.redis_bindings import RedisBindingStore, RedisUpstreamSessions
from sessions.redis_limits import RedisLimits
from sessions.redis_link import RedisDown, RedisLink
from sessions.redis_slots import RedisSlots
from sessions.redis_responses import RedisResponseStore
from sessions.responses import MemoryResponseStore
from sessions.signatures import MemorySignatureBook, RedisSignatureBook
from sessions.shared import (DrainedSet, Locks, MemoryDrainedSet, MemoryLocks, RedisDrainedSet,
                             RedisLocks)
from sessions.upstream import MemoryUpstreamSessions
from sessions.workers import (MemoryWorkerRegistrations, RedisWorkerRegistrations,
                              WorkerRegistrations, signing_key)

__all__ = ["Stores", "build_stores", "Drains", "default_replica_id"]

log = structlog.get_logger("poolgate.replicas")


@dataclass(slots=True)
class Stores:
    responses: Any
    bindings: Any
    cli_sessions: Any
    limits: Any
    locks: Locks
    drained: DrainedSet
    workers: WorkerRegistrations  # remote workers registered at run time
    link: RedisLink | None = None
    slots: RedisSlots | None = None  # keys' in-flight slots across replicas (Redis only)
    signatures: Any = None  # which account signed which reasoning (pool/signatures.py)


def build_stores(settings: Any) -> Stores:
    """Memory stores, or Redis ones (each with its fallback) when ``server.redis_url`` is set."""
    server, store, routing, cli = (settings.server, settings.responses, settings.routing,
                                   settings.cli_sessions)
    if not server.redis_url:
        return Stores(
            responses=MemoryResponseStore(max_items=store.max_items, max_bytes=store.max_bytes,
                                          max_age=store.max_age_seconds),
            bindings=MemoryBindingStore(ttl=routing.binding_ttl, max_items=routing.max_bindings),
            cli_sessions=MemoryUpstreamSessions(max_entries=cli.max_entries,
                                                max_age=cli.max_age_seconds),
            limits=MemoryLimits(), locks=MemoryLocks(), drained=MemoryDrainedSet(),
            workers=MemoryWorkerRegistrations(),
            signatures=MemorySignatureBook(max_entries=routing.max_signatures,
                                           ttl=routing.signature_ttl))
    link = RedisLink(server.redis_url, timeout=server.redis_timeout, prefix=server.redis_prefix)
    replica = server.replica_id or default_replica_id()
    limits = RedisLimits(link, MemoryLimits())
    return Stores(
        responses=RedisResponseStore(link, max_items=store.max_items, max_bytes=store.max_bytes,
                                     max_age=store.max_age_seconds),
        bindings=RedisBindingStore(link, ttl=routing.binding_ttl, max_items=routing.max_bindings),
        cli_sessions=RedisUpstreamSessions(link, replica=replica, max_entries=cli.max_entries,
                                           max_age=cli.max_age_seconds),
        limits=limits, locks=RedisLocks(link), drained=RedisDrainedSet(link),
        workers=RedisWorkerRegistrations(link, signing_key(_secret(server.admin_token))),
        link=link, slots=RedisSlots(link, limits.replica),
        signatures=RedisSignatureBook(link, max_entries=routing.max_signatures,
                                      ttl=routing.signature_ttl))


def _secret(value: Any) -> str | None:
    return value.get_secret_value() if value is not None else None


def default_replica_id() -> str:
    """This host's name and a random suffix: distinct for every replica, also
    for several on one host."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:40] or "replica"
    return f"{host}.{secrets.token_hex(6)}"


@dataclass(slots=True, eq=False)
class Drains:
    """This replica's drained workers, kept in step with the shared set."""

    shared: DrainedSet
    here: set[str] = field(default_factory=set)  # names drained on this replica
    pending: dict[str, bool] = field(default_factory=dict)  # name -> drained, not yet shared

    async def set(self, gw: Any, worker: Any, drained: bool) -> None:
        """An operator's drain (``True``) or resume: here at once, then shared."""
        apply(gw, worker, drained)
        (self.here.add if drained else self.here.discard)(worker.name)
        self.pending[worker.name] = drained
        await self.flush()

    async def flush(self) -> None:
        for name, drained in list(self.pending.items()):
            try:
                await (self.shared.add(name) if drained else self.shared.discard(name))
            except RedisDown:
                log.warning("replicas.drain_not_shared", worker=name, drained=drained)
                return
            self.pending.pop(name, None)

    async def forget(self, name: str) -> None:
        """``name`` left the pool: drop it from the drained names, here and shared."""
        if name in self.here or name in self.pending:
            self.here.discard(name)
            self.pending[name] = False
            await self.flush()

    def republish(self) -> None:
        """After an outage: write this replica's drains again (a Redis without
        persistence comes back empty, and would otherwise resume every drained worker)."""
        for name in self.here:
            self.pending.setdefault(name, True)

    async def sync(self, gw: Any) -> None:
        """Apply the shared set to this replica's workers (with the health probe)."""
        await self.flush()
        if self.pending:
            return
        names = await self.shared.members()
        leaving = gw.runtime_workers.leaving if gw.runtime_workers is not None else None
        for worker in gw.pool.workers:
            name = worker.name
            if leaving is not None and leaving(name):
                continue  # on its way out of the pool: it stays drained whatever the set says
            if (name in names) != (name in self.here):
                await self._follow(gw, worker, name in names)

    async def _follow(self, gw: Any, worker: Any, drained: bool) -> None:
        """Another replica's drain or resume, here: a cli worker's through its
        account's state machine (one action at a time; refused now, as during
        a bundle import, it is tried again at the next sync)."""
        async def follow() -> None:
            apply(gw, worker, drained)
            (self.here.add if drained else self.here.discard)(worker.name)
            log.info("replicas.drain_synced", worker=worker.name, drained=drained)

        account = getattr(worker, "account", None)
        if account is None:
            await follow()
            return
        try:
            await (account.drain if drained else account.resume)(follow)
        except Conflict as exc:
            log.info("replicas.drain_deferred", worker=worker.name, drained=drained,
                     reason=str(exc))


def apply(gw: Any, worker: Any, drained: bool) -> None:
    if drained:
        result = worker.drain()
        if inspect.isawaitable(result):  # a process worker waits for its requests: not us
            gw.background(result)
    else:
        worker.resume()
        gw.admission.refresh()  # requests queued meanwhile may go to it now
