"""Supervision of one worker process slot, independent of how we talk to it.

A :class:`Supervisor` owns one slot: it launches an incarnation (a
:class:`Child`), waits for it to say ready within ``ready_timeout``, then
watches it: the OS must report it alive *and* it must answer a ping within
``health_timeout`` every ``health_interval``. An incarnation that exits,
never gets ready or stops answering is killed (its whole process group) and
replaced in the same slot after an exponential backoff with jitter. Enough
failures inside ``crash_loop_window`` raise the ``crash_looping`` flag; the
slot keeps retrying at the (capped) backoff. An incarnation that stays up for
``crash_loop_window`` resets the backoff and clears the flag.

The loop outlives its own mistakes: an unexpected exception (in the launch,
the watch or the bookkeeping) is logged, counted as a failure and followed by
a backoff, and :meth:`Supervisor.restart` brings back a slot whose loop did
end (stopped, or cancelled from outside).

``stop()`` is graceful: SIGTERM to the process group, ``stop_timeout``, then
SIGKILL.
"""

from __future__ import annotations

import asyncio
import collections
import random
import signal
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Literal, Protocol

import structlog

from .worker import WorkerState

__all__ = ["Child", "ChildGone", "ChildUnhealthy", "ExitInfo", "SupervisorPolicy", "Supervisor"]

log = structlog.get_logger("pool.supervisor")


class ChildGone(Exception):
    """The incarnation went away (its channel closed) while we waited on it."""


class ChildUnhealthy(ChildGone):
    """The incarnation answered its ping, but reported that it cannot serve
    (its engine hangs, or stopped making progress): it is replaced like a hung one."""


class Child(Protocol):
    """One incarnation of a supervised process (it may also carry ``refused``: why
    it said it cannot start)."""

    pid: int

    async def ready(self) -> None:
        """Return once the child says it is ready; raise :class:`ChildGone` if it goes first."""

    async def ping(self) -> None:
        """Return when the child answers; raise :class:`ChildGone` if it is gone,
        :class:`ChildUnhealthy` if it says it cannot serve."""

    async def wait(self) -> int:
        """The OS return code once the process has exited (negative: the signal)."""

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's process group (no error if already gone)."""

    def gone(self) -> None:
        """Called once the process is reaped: fail whatever is still in flight."""


@dataclass(frozen=True, slots=True)
class ExitInfo:
    code: int | None      # exit status, or None when killed by a signal
    signal: int | None    # the signal that ended it
    at: float             # wall-clock time (time.time())
    reason: str           # "exited", "hung", "unhealthy", "not_ready", "stopped", "restart",
                          # "spawn_failed", "supervisor_error"
    detail: str | None = None  # why, in the child's words, when it refused to start

    def as_dict(self) -> dict[str, object]:
        return {"code": self.code, "signal": self.signal, "at": self.at, "reason": self.reason,
                "detail": self.detail}


@dataclass(frozen=True, slots=True)
class SupervisorPolicy:
    ready_timeout: float = 30.0
    health_interval: float = 5.0
    health_timeout: float = 2.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    crash_loop_threshold: int = 5
    crash_loop_window: float = 60.0
    stop_timeout: float = 10.0
    jitter: float = 0.1   # each delay is scaled by a uniform factor in [1-jitter, 1+jitter]


def refused(child: Child) -> str | None:
    """Why ``child`` said it cannot start (a ``refused`` frame), if it did."""
    return getattr(child, "refused", None)


_Outcome = Literal["exited", "hung", "unhealthy", "restart"]

#: past this many doublings every delay is ``backoff_max`` anyway (2.0 ** 1024 overflows)
_MAX_DOUBLINGS = 64


class Supervisor:
    """Keeps one slot filled with a live, answering incarnation of ``launch()``."""

    def __init__(self, name: str, policy: SupervisorPolicy,
                 launch: Callable[[], Awaitable[Child]], *,
                 on_ready: Callable[[Child], None] | None = None,
                 rng: Callable[[], float] = random.random) -> None:
        self.name = name
        self.policy = policy
        self._launch = launch
        self._on_ready = on_ready
        self._rng = rng
        self.state = WorkerState.STOPPED
        self.child: Child | None = None
        self.crash_looping = False
        self.restarts = 0            # incarnations launched after the first
        self.last_exit: ExitInfo | None = None
        self.delays: collections.deque[float] = collections.deque(maxlen=16)  # backoffs taken
        self.ready_since: float | None = None   # loop time the current incarnation got ready
        self._failures: collections.deque[float] = collections.deque()
        self._consecutive = 0
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._restart = False
        self._first_outcome: asyncio.Future[bool] | None = None

    # --- control --------------------------------------------------------------------

    async def start(self) -> bool:
        """Launch the slot; return whether the first incarnation got ready (the
        slot keeps trying in the background either way)."""
        self._begin()
        assert self._first_outcome is not None
        return await asyncio.shield(self._first_outcome)

    def _begin(self) -> None:
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._first_outcome = loop.create_future()
            self.state = WorkerState.STARTING
            self._restart = False
            self._wake.clear()
            self._task = loop.create_task(self._run(), name=f"supervise:{self.name}")

    async def restart(self) -> None:
        """Replace the running incarnation now (gracefully, no backoff); a slot
        whose loop has ended (stopped, or killed by a bug) is started again."""
        if self._task is None or self._task.done():
            log.info("worker.supervisor_revived", worker=self.name)
            self._begin()  # not waiting for readiness: that may take ready_timeout
            return
        self._restart = True
        self._wake.set()

    async def stop(self) -> None:
        """Stop the slot: SIGTERM, ``stop_timeout``, SIGKILL. Idempotent."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise
        self.state = WorkerState.STOPPED
        self._settle_first(False)

    # --- the loop ----------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                try:
                    await self._incarnation()
                except Exception as exc:  # noqa: BLE001 - the slot must outlive our own bugs
                    log.exception("worker.supervisor_error", worker=self.name,
                                  error=type(exc).__name__)
                    await self._discard()
                    self._record(None, "supervisor_error")
                    self._settle_first(False)
                    await self._backoff()
        finally:
            await self._discard(stopping=True)
            self.ready_since = None
            self.state = WorkerState.STOPPED

    async def _incarnation(self) -> None:
        """One incarnation from launch to its end, and the backoff after a failure."""
        self.state = WorkerState.STARTING
        reason: str
        try:
            child = await self._launch()
        except OSError as exc:
            log.error("worker.spawn_failed", worker=self.name, error=str(exc))
            self._record(None, "spawn_failed")
            self._settle_first(False)
            await self._backoff()
            return
        self.child = child
        log.info("worker.spawned", worker=self.name, pid=child.pid)
        outcome = await self._until_ready(child)
        if outcome == "ready":
            self.state = WorkerState.READY
            self.ready_since = asyncio.get_running_loop().time()
            log.info("worker.ready", worker=self.name, pid=child.pid)
            self._settle_first(True)
            if self._on_ready is not None:
                self._on_ready(child)
            reason = await self._watch(child)
        else:
            reason = outcome
            self._settle_first(False)
        self.ready_since = None
        if reason == "restart":
            self.state = WorkerState.STARTING
            code = await self._terminate(child)
        else:
            self.state = WorkerState.UNHEALTHY
            code = await (self._await_exit(child) if refused(child) else self._kill(child))
        self._record(code, reason, detail=refused(child))
        self.child = None
        self.restarts += 1
        if reason == "restart":
            self._restart = False
            return
        log.warning("worker.failed", worker=self.name, reason=reason,
                    exit=self.last_exit.as_dict() if self.last_exit else None,
                    crash_looping=self.crash_looping)
        await self._backoff()

    async def _discard(self, *, stopping: bool = False) -> None:
        """End the current incarnation, if any: gracefully when the slot stops,
        by SIGKILL after an error of ours (its state is unknown)."""
        child, self.child = self.child, None
        self.ready_since = None
        if child is None:
            return
        if stopping:
            code = await asyncio.shield(self._terminate(child))
            self._record(code, "stopped", failure=False)
        else:
            await self._kill(child)
            self.restarts += 1

    async def _until_ready(self, child: Child) -> str:
        exited = asyncio.ensure_future(child.wait())
        ready = asyncio.ensure_future(child.ready())
        try:
            done, _ = await asyncio.wait({exited, ready}, timeout=self.policy.ready_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            exited.cancel()
        if ready in done and not ready.cancelled() and ready.exception() is None:
            return "ready"
        return "exited" if exited in done or ready in done else "not_ready"

    async def _watch(self, child: Child) -> _Outcome:
        policy = self.policy
        exited = asyncio.ensure_future(child.wait())
        try:
            while True:
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait({exited, woken}, timeout=policy.health_interval,
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
                if exited.done():
                    return "exited"
                if self._wake.is_set():
                    self._wake.clear()
                    if self._restart:
                        return "restart"
                self._maybe_stable()
                try:
                    async with asyncio.timeout(policy.health_timeout):
                        await child.ping()
                except (TimeoutError, ChildGone) as exc:
                    if exited.done():
                        return "exited"
                    log.warning("worker.unhealthy", worker=self.name, pid=child.pid,
                                why=str(exc) or type(exc).__name__)
                    return "unhealthy" if isinstance(exc, ChildUnhealthy) else "hung"
        finally:
            exited.cancel()

    def _maybe_stable(self) -> None:
        since = self.ready_since
        if since is not None and asyncio.get_running_loop().time() - since >= \
                self.policy.crash_loop_window and (self._consecutive or self.crash_looping):
            self._consecutive = 0
            self._failures.clear()
            if self.crash_looping:
                log.info("worker.crash_loop_over", worker=self.name)
            self.crash_looping = False

    # --- ending an incarnation ---------------------------------------------------------

    async def _kill(self, child: Child) -> int:
        child.signal(signal.SIGKILL)
        code = await child.wait()
        child.gone()
        return code

    async def _await_exit(self, child: Child) -> int:
        """A child that refused to start exits by itself (its code says so); killed if not."""
        try:
            async with asyncio.timeout(self.policy.stop_timeout):
                code = await child.wait()
        except TimeoutError:
            child.signal(signal.SIGKILL)
            code = await child.wait()
        child.gone()
        return code

    async def _terminate(self, child: Child) -> int:
        child.signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(self.policy.stop_timeout):
                code = await child.wait()
        except TimeoutError:
            log.warning("worker.stop_timeout", worker=self.name, pid=child.pid)
            child.signal(signal.SIGKILL)
            code = await child.wait()
        child.gone()
        return code

    def _record(self, code: int | None, reason: str, *, failure: bool = True,
                detail: str | None = None) -> None:
        if code is None:
            info = ExitInfo(None, None, time.time(), reason, detail)
        elif code < 0:
            info = ExitInfo(None, -code, time.time(), reason, detail)
        else:
            info = ExitInfo(code, None, time.time(), reason, detail)
        self.last_exit = info
        if not failure or reason in ("restart", "stopped"):
            return
        now = asyncio.get_running_loop().time()
        failures = self._failures
        failures.append(now)
        while failures and now - failures[0] > self.policy.crash_loop_window:
            failures.popleft()
        self._consecutive += 1
        if len(failures) >= self.policy.crash_loop_threshold and not self.crash_looping:
            self.crash_looping = True
            log.error("worker.crash_looping", worker=self.name, failures=len(failures))

    def next_delay(self) -> float:
        """The backoff before the next launch: exponential in consecutive failures, jittered."""
        policy = self.policy
        doublings = min(max(0, self._consecutive - 1), _MAX_DOUBLINGS)
        base = min(policy.backoff_max, policy.backoff_initial * 2.0 ** doublings)
        return base * (1.0 + policy.jitter * (2.0 * self._rng() - 1.0))

    async def _backoff(self) -> None:
        delay = self.next_delay()
        self.delays.append(delay)
        self.state = WorkerState.UNHEALTHY
        self._wake.clear()
        try:
            async with asyncio.timeout(delay):
                await self._wake.wait()  # a restart request cuts the wait short
        except TimeoutError:
            pass
        self._wake.clear()
        self._restart = False

    def _settle_first(self, ready: bool) -> None:
        fut = self._first_outcome
        if fut is not None and not fut.done():
            fut.set_result(ready)
