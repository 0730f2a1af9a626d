"""Remote workers that join and leave while the gateway runs.

``POST /internal/workers`` registers one (validated as a ``[[workers]]``
entry is), ``DELETE /internal/workers/{name}`` drains it and takes it out.
Registrations live in a :class:`sessions.workers.WorkerRegistrations` store;
where that store is shared (Redis) every replica polls it (with the Redis
health probe) and brings its own pool in step, so a worker registered through
one replica is served by all, and one deleted through any replica leaves all.

A worker leaves in three steps: it is drained (admission grants it nothing
new, also to requests already queued), the gateway waits until no request
holds or is granted a slot on it, then it leaves the pool and is closed. No
request loses its slot: the pool drops a worker only at zero in flight.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Collection, Mapping

import structlog

from pool.errors import BadRequest, Conflict, GatewayError, NotFound
from pool.worker import Worker, WorkerState
from sessions.redis_link import RedisDown
from sessions.workers import RegistrationsLost, WorkerRegistrations

from .settings import ConfigError, WorkerSettings, registered_worker, registration_of

__all__ = ["RuntimeWorkers"]

log = structlog.get_logger("poolgate.workers")

_IDLE_POLL = 0.05  # seconds between looks at a leaving worker's in-flight count


class RuntimeWorkers:
    """The registered workers of one replica, kept in step with the store."""

    def __init__(self, gw: Any, store: WorkerRegistrations, *, environ: Mapping[str, str],
                 make: Callable[[WorkerSettings], Worker],
                 secret_envs: Collection[str] = ()) -> None:
        self._gw = gw
        self.store = store
        self._environ = environ
        self._secret_envs = frozenset(secret_envs)  # what api_key_env may name
        self._make = make
        # the workers the gateway started with (configured, or the default/demo ones)
        self.fixed = frozenset(w.name for w in gw.pool.workers)
        self._joined: set[str] = set()
        self._known: dict[str, dict[str, Any]] = {}  # the registrations last read or written
        self._leaves: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()  # one join or leave decision at a time

    def source(self, name: str) -> str:
        return "config" if name in self.fixed else "registered"

    def leaving(self, name: str) -> bool:
        return name in self._leaves

    # --- the admin endpoints ----------------------------------------------------------

    async def register(self, body: Mapping[str, Any]) -> Worker:
        """Validate, store and join a remote worker; raises BadRequest, Conflict."""
        settings = self._validate(body)
        name = settings.name
        if name in self.fixed:
            raise Conflict(f"A worker named '{name}' comes from the configuration.",
                           param="name", code="worker_exists")
        if name in self._leaves:
            raise Conflict(f"The worker '{name}' is still leaving the pool (its requests are "
                           "finishing); register it again once it has left.", param="name",
                           code="worker_leaving")
        if name in self._joined:
            raise Conflict(f"A worker named '{name}' is already registered.", param="name",
                           code="worker_exists")
        self._check_joining(settings)
        registration = registration_of(settings)
        if not await self.store.add(name, registration):
            raise Conflict(f"A worker named '{name}' is already registered.", param="name",
                           code="worker_exists")
        self._known[name] = registration
        try:
            async with self._lock:
                if name in self._joined:  # a sync of this replica was quicker
                    return self._gw.pool.worker(name)
                return await self._join(settings)
        except BaseException:
            self._known.pop(name, None)
            await self.store.remove(name)
            raise

    async def unregister(self, name: str, timeout: float) -> bool:
        """Forget ``name`` and let it leave; True once it is out of the pool,
        False if its requests are still finishing after ``timeout`` seconds
        (it leaves when they are done)."""
        if name in self.fixed:
            raise Conflict(f"The worker '{name}' comes from the configuration; it cannot be "
                           "removed at run time (drain it instead).", param="name",
                           code="worker_read_only")
        removed = await self.store.remove(name)
        self._known.pop(name, None)
        if not removed and name not in self._joined:
            raise NotFound(f"No registered worker named '{name}'.", param="name",
                           code="worker_not_found")
        if name not in self._joined:
            return True  # registered through another replica that has not synced yet
        leave = self._start_leave(name)
        try:
            await asyncio.wait_for(asyncio.shield(leave), timeout)
        except TimeoutError:
            return False
        return True

    # --- keeping in step with the store ---------------------------------------------

    async def sync(self) -> None:
        """Join what the store has and this pool lacks; let go of what it no longer has.
        The store is read under the lock, so a snapshot never predates a join."""
        async with self._lock:
            try:
                registrations = await self.store.all()
            except RedisDown:
                return  # the link logged it; the pool stays as it is until Redis answers
            except RegistrationsLost:
                await self._restore()
                return
            self._known = registrations
            for name, registration in registrations.items():
                if name in self._joined or name in self.fixed:
                    continue
                try:
                    await self._join(registered_worker(registration, self._environ, self._secret_envs))
                except ConfigError as exc:  # e.g. its api_key_env is not set on this replica
                    log.warning("workers.sync_refused", worker=name, problems=exc.problems)
                except (GatewayError, ValueError) as exc:
                    log.warning("workers.sync_refused", worker=name, problems=[str(exc)])
            for name in self._joined - set(registrations) - set(self._leaves):
                self._start_leave(name)

    async def _restore(self) -> None:
        """Redis came back empty: put back the registrations last seen (every replica
        saw the same ones), rather than let every replica drop its workers."""
        if not self._known:
            return
        try:
            await self.store.restore(self._known)
        except RedisDown:
            return
        log.warning("workers.registrations_restored", workers=sorted(self._known))

    async def aclose(self) -> None:
        for task in list(self._leaves.values()):
            task.cancel()

    # --- joining and leaving -----------------------------------------------------------

    def _validate(self, body: Mapping[str, Any]) -> WorkerSettings:
        try:
            return registered_worker(body, self._environ, self._secret_envs)
        except ConfigError as exc:
            # "field: message" names the field; a whole-entry check ("a remote worker
            # needs ...", an alias to an unserved model) names none
            head, sep, _ = exc.problems[0].partition(": ")
            param = head.split(".", 1)[0].split("[", 1)[0] if sep and " " not in head else None
            raise BadRequest("; ".join(exc.problems) + ".", param=param) from None

    def _check_joining(self, settings: WorkerSettings) -> None:
        try:
            self._gw.pool.check_joining(settings.name, settings.models, settings.aliases)
        except ValueError as exc:
            param = "name" if "named" in str(exc) else "models"
            raise Conflict(f"The worker cannot join: {exc}.", param=param,
                           code="worker_conflict") from None

    async def _join(self, settings: WorkerSettings) -> Worker:
        """Start the worker, probe it once, and take it into the pool (lock held)."""
        self._check_joining(settings)
        worker = self._make(settings)
        pool = self._gw.pool
        try:
            await worker.start()
            started = time.perf_counter()
            healthy = await worker.health()  # an unreachable upstream joins unhealthy, not ready
            pool.add(worker)
        except BaseException:
            await worker.aclose()  # its connection pool must not outlive a failed join
            raise
        pool.probe_seconds[worker.name] = time.perf_counter() - started
        self._joined.add(worker.name)
        self._gw.admission.refresh()  # requests queued for its model may go to it now
        log.info("workers.joined", worker=worker.name, models=list(worker.models),
                 healthy=healthy)
        return worker

    def _start_leave(self, name: str) -> asyncio.Task[None]:
        task = self._leaves.get(name)
        if task is None:
            task = self._leaves[name] = asyncio.ensure_future(self._leave(name))
        return task

    async def _leave(self, name: str) -> None:
        gw = self._gw
        worker = gw.pool.worker(name)

        def busy() -> bool:
            # a slot held during admission counts too, not only requests already streaming
            return bool(gw.admission.in_flight(name) or gw.pool.in_flight.get(name, 0))

        try:
            log.info("workers.leaving", worker=name, in_flight=gw.in_flight(name))
            while True:
                if worker.state is WorkerState.READY or worker.state is WorkerState.UNHEALTHY:
                    worker.drain()  # admission grants it nothing new (again, if resumed meanwhile)
                    gw.admission.refresh()  # requests parked on it look again (elsewhere)
                if not busy():
                    async with self._lock:
                        if not busy():  # nothing was admitted while we took the lock
                            gw.pool.remove(name)
                            self._joined.discard(name)
                            break
                await asyncio.sleep(_IDLE_POLL)
            await worker.aclose()
            await gw.drains.forget(name)  # a worker registered later under this name starts afresh
            log.info("workers.left", worker=name)
        finally:
            self._leaves.pop(name, None)
