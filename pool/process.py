"""``ProcessWorker``: a :class:`~pool.worker.Worker` whose backend is a child
process of ours speaking the worker protocol (:mod:`pool.wire`) over a
socketpair, kept alive by a :class:`~pool.supervisor.Supervisor`.

Requests are multiplexed on one socket by id; closing a stream early sends
``cancel``. When the child dies (or is killed as hung) every request in
flight on it ends at once with :class:`~pool.errors.WorkerCrashed`, whose
``before_first_event`` tells the pool whether a retry elsewhere is safe.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, cast

from .channel import Incarnation
from .childenv import child_environment
from .errors import UpstreamUnavailable
from .model import ChatRequest, Event, Start
from .supervisor import ChildGone, ExitInfo, Supervisor, SupervisorPolicy
from .worker import Capabilities, WorkerState, flatten
from .worker_main import ENV_SOCKET_FD, ENV_WATCHDOG_FD

__all__ = ["ProcessSpec", "ProcessWorker"]


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    name: str
    command: tuple[str, ...] | list[str]
    models: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)
    capacity: int = 64
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    env_passthrough: tuple[str, ...] = ()  # names of the gateway's variables the child also gets
    cwd: str | None = None
    ready_timeout: float = 30.0
    health_interval: float = 5.0
    health_timeout: float = 2.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    crash_loop_threshold: int = 5
    crash_loop_window: float = 60.0
    stop_timeout: float = 10.0

    def policy(self) -> SupervisorPolicy:
        return SupervisorPolicy(
            ready_timeout=self.ready_timeout, health_interval=self.health_interval,
            health_timeout=self.health_timeout, backoff_initial=self.backoff_initial,
            backoff_max=self.backoff_max, crash_loop_threshold=self.crash_loop_threshold,
            crash_loop_window=self.crash_loop_window, stop_timeout=self.stop_timeout)


class ProcessWorker:
    """A supervised child process serving ``spec.models`` (see :class:`pool.worker.Worker`)."""

    kind = "process"

    def __init__(self, spec: ProcessSpec, *, capabilities: Capabilities | None = None,
                 base_env: Mapping[str, str] = {}) -> None:
        self.spec = spec
        self.name = spec.name
        self.models = tuple(spec.models)
        self.aliases = dict(spec.aliases)
        self.capacity = spec.capacity
        self.capabilities = capabilities or Capabilities()
        # The child's environment before spec.env: the allow-listed part of what
        # the gateway was started with, handed down from its Settings (pool/
        # reads no environment itself). Never the gateway's secrets.
        self._base_env = child_environment(base_env, spec.env_passthrough)
        self._supervisor = Supervisor(spec.name, spec.policy(), self._launch)
        self._draining = False  # drained by request: sticky until resume()
        self._restarting = 0  # restarts under way: nothing new meanwhile, whatever resume() says
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __repr__(self) -> str:
        return f"<ProcessWorker {self.name} pid={self.pid}>"

    # --- state and admin info ---------------------------------------------------------

    @property
    def state(self) -> WorkerState:
        state = self._supervisor.state
        if state is WorkerState.READY:
            child = self._child()
            if child is None or not child.connected:  # died; the supervisor is about to see it
                return WorkerState.UNHEALTHY
            if self._draining or self._restarting:
                return WorkerState.DRAINING
        return state

    @property
    def pid(self) -> int | None:
        child = self._supervisor.child
        return child.pid if child is not None else None

    @property
    def uptime(self) -> float | None:
        """Seconds since the current incarnation got ready."""
        since = self._supervisor.ready_since
        return None if since is None else asyncio.get_running_loop().time() - since

    @property
    def restarts(self) -> int:
        return self._supervisor.restarts

    @property
    def last_exit(self) -> ExitInfo | None:
        return self._supervisor.last_exit

    @property
    def crash_looping(self) -> bool:
        return self._supervisor.crash_looping

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def buffered(self) -> int:
        """Events from the child not yet taken by their requests' consumers."""
        child = self._child()
        return child.buffered if child is not None else 0

    @property
    def supervisor(self) -> Supervisor:
        return self._supervisor

    def _child(self) -> Incarnation | None:
        return cast("Incarnation | None", self._supervisor.child)

    def info(self) -> dict[str, Any]:
        last = self.last_exit
        return {"name": self.name, "kind": self.kind, "state": self.state.value, "pid": self.pid,
                "uptime": self.uptime, "restarts": self.restarts,
                "crash_looping": self.crash_looping, "in_flight": self._in_flight,
                "last_exit": last.as_dict() if last else None}

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> bool:
        """Start supervising; return whether the first incarnation got ready."""
        return await self._supervisor.start()

    async def health(self) -> bool:
        """A live probe: ready and answering a ping within ``health_timeout``."""
        child = self._supervisor.child
        if self._supervisor.state is not WorkerState.READY or child is None:
            return False
        try:
            async with asyncio.timeout(self.spec.health_timeout):
                await child.ping()
        except (TimeoutError, ChildGone):
            return False
        return True

    async def drain(self, timeout: float | None = None) -> bool:
        """Take no new requests; wait (up to ``timeout``) for the ones in flight.
        Return whether none is left. The worker stays draining until :meth:`resume`."""
        self._draining = True
        return await self._until_idle(timeout)

    async def _until_idle(self, timeout: float | None) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def resume(self) -> None:
        self._draining = False

    async def restart(self) -> None:
        """Take nothing new, let the requests in flight finish (up to
        ``stop_timeout``), then replace the process gracefully. Whether the worker
        is drained is the operator's call alone: a drain issued during the
        restart holds after it, and one from before it is not lifted."""
        self._restarting += 1
        try:
            await self._until_idle(self.spec.stop_timeout)
            await self._supervisor.restart()
        finally:
            self._restarting -= 1

    async def aclose(self) -> None:
        """Drain (up to ``stop_timeout``), then SIGTERM, ``stop_timeout``, SIGKILL."""
        if self._supervisor.state is not WorkerState.STOPPED:
            await self.drain(self.spec.stop_timeout)
        await self._supervisor.stop()

    async def _launch(self) -> Incarnation:
        spec = self.spec
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        watch_r, watch_w = os.pipe()
        try:
            env = {**self._base_env, **spec.env, ENV_SOCKET_FD: str(theirs.fileno()),
                   ENV_WATCHDOG_FD: str(watch_r)}
            proc = await asyncio.create_subprocess_exec(
                *spec.command, stdin=asyncio.subprocess.DEVNULL, env=env, cwd=spec.cwd,
                pass_fds=(theirs.fileno(), watch_r), start_new_session=True)
        except BaseException:
            ours.close()
            os.close(watch_w)
            raise
        finally:
            theirs.close()
            os.close(watch_r)
        child = Incarnation(self.name, proc, watch_w, loop)
        try:
            await loop.create_connection(lambda: child, sock=ours)
        except BaseException:
            child.signal(signal.SIGKILL)
            await proc.wait()
            child.gone()
            raise
        return child

    # --- the request ------------------------------------------------------------------------

    def stream(self, request: ChatRequest) -> AsyncIterator[Event]:
        return flatten(self._batches(request))

    def stream_batches(self, request: ChatRequest) -> AsyncIterator[list[Event]]:
        """The events of :meth:`stream` as lists: all the child sent so far each
        time, so the gateway can write them at once. A subclass whose
        ``stream`` adds to this one's sets ``stream_batches = None``."""
        return self._batches(request)

    async def _batches(self, request: ChatRequest) -> AsyncIterator[list[Event]]:
        child = self._child()
        if self.state is not WorkerState.READY or child is None:
            raise UpstreamUnavailable(f"worker {self.name} is {self.state.value}")
        call = child.open(request)
        self._in_flight += 1
        self._idle.clear()
        try:
            batch = await call.next_batch()
            if batch is None:
                raise UpstreamUnavailable(f"worker {self.name} ended the answer without events")
            if type(batch[0]) is not Start:
                batch.insert(0, Start())
            yield batch
            next_batch = call.next_batch
            while (batch := await next_batch()) is not None:
                yield batch
        finally:
            child.close_call(call)
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()
