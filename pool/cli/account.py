"""The life of one cli account, owned by one object: :class:`Account`.

Every change of an account's state, by an operator or by the gateway itself
(login, its code, its cancel, the automatic re-login, the re-probe of a
refused account, stop, restart, drain, resume, bundle import and export),
is an :class:`Action` that goes through the account's ``Account`` one at a
time (an asyncio lock per account). An action not allowed in the current
:class:`AccountState` is refused with :class:`AccountConflict` (HTTP 409
naming the state); see ``ALLOWED`` and docs/accounts.md for the table.

A login is the one long action: it runs as a task while the state is
``logging_in`` (its code and its cancel are the only logins actions then)
and ends at ``login_timeout`` at the latest. Stop cancels it first, so
nothing the login does afterwards (its restart of the worker) can touch a
worker an operator stopped.

The logins themselves (:class:`LoginFlow`, ``app/logins.py`` with ``auth/``)
and the bundle files (:class:`BundleFiles`, ``sessions/bundles.py``) are
handed in: this module imports neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Protocol

import structlog

from ..errors import Conflict
from ..worker import WorkerState

__all__ = ["AccountState", "Action", "ALLOWED", "AccountConflict", "LoginFlow", "BundleFiles",
           "AccountObserver", "Account"]

log = structlog.get_logger("pool.cli.account")
#: the re-probe of a refused account backs off up to this
PROBE_CAP = 3600.0


class AccountState(str, enum.Enum):
    STOPPED = "stopped"            # not running: never started, or stopped by an operator
    STARTING = "starting"          # the worker's process is on its way up
    READY = "ready"                # logged in and serving
    COOLING_DOWN = "cooling_down"  # logged in, its quota spent until a time
    LOGGED_OUT = "logged_out"      # running, refused (or without credentials)
    LOGGING_IN = "logging_in"      # a login is under way (a task, with a deadline)
    IMPORTING = "importing"        # a bundle is being written into the stopped home
    EXPORTING = "exporting"        # a bundle is being read out of the home
    DRAINING = "draining"          # running, takes no new requests
    UNHEALTHY = "unhealthy"        # its process failed; the supervisor brings it back


class Action(str, enum.Enum):
    LOGIN = "login"                # an operator starts a login
    AUTO_LOGIN = "auto_login"      # the gateway logs a logged-out account in by itself
    LOGIN_CODE = "login_code"      # an operator pastes the login's code
    CANCEL_LOGIN = "cancel_login"  # an operator ends the login
    PROBE = "probe"                # the gateway tries a refused account again
    STOP = "stop"
    RESTART = "restart"
    DRAIN = "drain"
    RESUME = "resume"
    IMPORT = "import"
    EXPORT = "export"


S = AccountState
_RUNNING = frozenset({S.STARTING, S.READY, S.COOLING_DOWN, S.LOGGED_OUT, S.DRAINING, S.UNHEALTHY})
#: the states each action is allowed in (any other: 409)
ALLOWED: Mapping[Action, frozenset[AccountState]] = {
    Action.LOGIN: _RUNNING,
    Action.AUTO_LOGIN: frozenset({S.LOGGED_OUT}),
    Action.LOGIN_CODE: frozenset({S.LOGGING_IN}),
    Action.CANCEL_LOGIN: frozenset({S.LOGGING_IN}),
    Action.PROBE: frozenset({S.LOGGED_OUT}),
    Action.STOP: _RUNNING | {S.STOPPED, S.LOGGING_IN},
    Action.RESTART: _RUNNING | {S.STOPPED},
    Action.DRAIN: _RUNNING | {S.STOPPED, S.LOGGING_IN},
    Action.RESUME: _RUNNING | {S.STOPPED, S.LOGGING_IN},
    Action.IMPORT: frozenset({S.STOPPED}),
    Action.EXPORT: frozenset({S.STOPPED, S.DRAINING}),
}
_HINTS = {S.STOPPED: "POST /internal/workers/{name}/restart first",
          S.LOGGING_IN: "paste its code, or DELETE /internal/workers/{name}/login to cancel it",
          S.DRAINING: "a drained worker with nothing in flight",
          S.LOGGED_OUT: "it is logged out"}


_ACTION_HINTS = {
    Action.LOGIN_CODE: "it is not waiting for a code: POST /internal/workers/{name}/login first",
    Action.CANCEL_LOGIN: "no login is under way",
    Action.EXPORT: "export only from a stopped worker, or a drained one with nothing in flight: "
                   "POST /internal/workers/{name}/stop or /drain first",
    Action.IMPORT: "import only into a stopped worker (POST /internal/workers/{name}/stop "
                   "first): its CLI would overwrite or use the files meanwhile",
    Action.AUTO_LOGIN: "only a logged-out account logs in by itself"}


class AccountConflict(Conflict):
    """The action is not allowed in the account's state (HTTP 409)."""

    def __init__(self, name: str, action: Action, state: AccountState,
                 detail: str | None = None) -> None:
        hint = detail or _ACTION_HINTS.get(action) or _HINTS.get(state, "")
        hint = hint.format(name=name)
        super().__init__(f"Worker '{name}' is {state.value}: {action.value} is not allowed now"
                         + (f" ({hint})." if hint else "."), code="account_state")
        self.state = state
        self.action = action


class LoginFlow(Protocol):
    """How an account logs in (``app/logins.py``): one record per login."""

    def prepare(self, name: str, auto: bool | None) -> Any:
        """Check the request and make the login's record (raises ``BadRequest``)."""

    async def run(self, account: Account, record: Any) -> None:
        """The whole login: the CLI's login, the browser or the pasted code, and
        the confirming restart (``account.worker.restart()``)."""

    def ended(self, record: Any, reason: str, message: str) -> None:
        """The login was ended from outside (``timeout``, ``cancelled``)."""

    async def answer(self, record: Any, stage: str) -> Any:
        """What the operator gets back once ``stage`` (``started``, ``code``) settles."""

    def paste(self, name: str, code: str) -> Any:
        """Hand the operator's code to the login (raises ``Conflict`` if it waits for none)."""

    def relogin_due(self, name: str) -> bool:
        """Whether a logged-out account should be logged in automatically now."""


class BundleFiles(Protocol):
    """The account's files as a session bundle (``sessions/bundles.py``)."""

    async def import_(self, data: bytes) -> Any: ...

    async def export(self, info: Mapping[str, Any]) -> bytes: ...


class AccountObserver(Protocol):
    """Told of each change of an account's state (``app/alerts.py``): called on
    the loop, after an action and at each :meth:`Account.tick`; must not block."""

    def account_changed(self, name: str, before: AccountState | None, after: AccountState,
                        details: Mapping[str, Any]) -> None: ...


class Account:
    """One cli worker's account: its state, and every action on it, one at a time."""

    def __init__(self, worker: Any, logins: LoginFlow, files: BundleFiles, *,
                 login_timeout: float = 600.0, probe_interval: float = 60.0,
                 clock: Callable[[], float] = time.monotonic,
                 observer: AccountObserver | None = None) -> None:
        self.worker = worker
        self.observer = observer
        self._seen: AccountState | None = None  # the state the observer was last told of
        self.name: str = worker.name
        self.logins = logins
        self.files = files
        self.login_timeout = login_timeout
        self.probe_interval = probe_interval
        self._clock = clock
        self._lock = asyncio.Lock()
        self._phase: AccountState | None = None  # a state this object holds, not the worker's
        self._login: asyncio.Task[None] | None = None
        self._probes = 0
        self._next_probe: float | None = None
        self.busy: Action | None = None  # the action under way (for tests and the log)

    # --- state ---------------------------------------------------------------------------

    @property
    def state(self) -> AccountState:
        if self._phase is not None:
            return self._phase
        state = self.worker.process_state
        if state is WorkerState.READY:
            login = self.worker.login
            if login == "logged_out":
                return S.LOGGED_OUT
            if login != "ready":
                return S.STARTING
            return S.COOLING_DOWN if self.worker.cooldown_until else S.READY
        return {WorkerState.STARTING: S.STARTING, WorkerState.DRAINING: S.DRAINING,
                WorkerState.UNHEALTHY: S.UNHEALTHY}.get(state, S.STOPPED)

    def _check(self, action: Action) -> None:
        state = self.state
        if state not in ALLOWED[action]:
            raise AccountConflict(self.name, action, state)

    @contextlib.asynccontextmanager
    async def _turn(self, action: Action) -> AsyncIterator[None]:
        """Hold the account for ``action``: refused at once in a state that does
        not allow it, else after the action before it, if it still is allowed."""
        self._check(action)
        async with self._lock:
            self._check(action)
            self.busy = action
            log.info("account.action", worker=self.name, action=action.value,
                     state=self.state.value)
            try:
                yield
            finally:
                self.busy = None
                self.observe()

    def observe(self) -> None:
        """Tell the observer the account's state, if it changed since it was last told."""
        state = self.state
        if self.observer is None or state is self._seen:
            return
        before, self._seen = self._seen, state
        details: dict[str, Any] = {}
        if state is S.COOLING_DOWN and self.worker.cooldown_until:
            details["cooldown_until"] = self.worker.cooldown_until
        try:
            self.observer.account_changed(self.name, before, state, details)
        except Exception as exc:  # an observer's bug must not fail the account's action
            log.error("account.observer_failed", worker=self.name, error=type(exc).__name__)

    # --- logins --------------------------------------------------------------------------

    async def login(self, auto: bool | None, *, automatic: bool = False) -> Any:
        async with self._turn(Action.AUTO_LOGIN if automatic else Action.LOGIN):
            record = self.logins.prepare(self.name, True if automatic else auto)
            self._phase = S.LOGGING_IN
            self._login = asyncio.ensure_future(self._run_login(record))
        return await self.logins.answer(record, "started")

    async def _run_login(self, record: Any) -> None:
        try:
            async with asyncio.timeout(self.login_timeout):
                await self.logins.run(self, record)
        except TimeoutError:
            log.warning("account.login_timed_out", worker=self.name, timeout=self.login_timeout)
            self.logins.ended(record, "timeout", f"the login did not end within "
                                                 f"login_timeout ({self.login_timeout:g} s)")
        except asyncio.CancelledError:
            self.logins.ended(record, "cancelled", "the login was cancelled")
            raise
        finally:
            if self._phase is S.LOGGING_IN:
                self._phase = None
            self._probes, self._next_probe = 0, None

    async def login_code(self, code: str) -> Any:
        async with self._turn(Action.LOGIN_CODE):
            record = self.logins.paste(self.name, code)
        return await self.logins.answer(record, "code")

    async def cancel_login(self) -> None:
        async with self._turn(Action.CANCEL_LOGIN):
            await self._end_login()

    async def aclose(self) -> None:
        """The gateway stops: a login under way ends (its process and locks with it)."""
        await self._end_login()

    async def _end_login(self) -> None:
        task, self._login = self._login, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- the worker ----------------------------------------------------------------------

    async def stop(self) -> None:
        """Stopped until an operator restarts it: a login under way is ended first."""
        async with self._turn(Action.STOP):
            await self._end_login()
            self._phase = S.STOPPED
            await self.worker.stop()

    async def restart(self) -> None:
        async with self._turn(Action.RESTART):
            self._phase = None
            await self.worker.restart()

    async def drain(self, apply: Callable[[], Awaitable[None]]) -> None:
        async with self._turn(Action.DRAIN):
            await apply()

    async def resume(self, apply: Callable[[], Awaitable[None]]) -> None:
        async with self._turn(Action.RESUME):
            await apply()

    # --- bundles -------------------------------------------------------------------------

    async def import_bundle(self, data: bytes) -> Any:
        async with self._turn(Action.IMPORT), self._holding(S.IMPORTING):
            return await self.files.import_(data)

    async def export_bundle(self) -> bytes:
        async with self._turn(Action.EXPORT):
            if self.state is S.DRAINING and self.worker.in_flight:
                raise AccountConflict(self.name, Action.EXPORT, S.DRAINING,
                                      f"{self.worker.in_flight} requests still in flight")
            info = self.worker.info()
            if info.get("login") == "logged_out":
                raise AccountConflict(self.name, Action.EXPORT, S.LOGGED_OUT,
                                      "there is nothing to export")
            async with self._holding(S.EXPORTING):
                return await self.files.export(info)

    @contextlib.asynccontextmanager
    async def _holding(self, state: AccountState) -> AsyncIterator[None]:
        before, self._phase = self._phase, state
        try:
            yield
        finally:
            self._phase = before

    # --- what the gateway does by itself ---------------------------------------------------

    async def tick(self) -> None:
        """Called on a schedule: a logged-out account is tried again (with a
        backoff), then logged in automatically when its login says so."""
        self.observe()
        if self.state is not S.LOGGED_OUT:
            self._probes, self._next_probe = 0, None
            return
        now = self._clock()
        if self._next_probe is None:
            self._next_probe = now + self.probe_interval
        with contextlib.suppress(AccountConflict):
            if now >= self._next_probe:
                await self.probe()
            elif self.logins.relogin_due(self.name):
                await self.login(True, automatic=True)

    async def probe(self) -> None:
        """One turn on a refused account: ready again once its credentials work."""
        async with self._turn(Action.PROBE):
            self._probes += 1
            delay = min(self.probe_interval * 2 ** self._probes, PROBE_CAP)
            self._next_probe = self._clock() + delay
            await self.worker.probe_login()
            log.info("account.probed", worker=self.name, login=self.worker.login,
                     next_in=round(delay, 1))
