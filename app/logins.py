"""Logins of cli accounts: the CLI's own login (pool/cli/login.py), completed by
the browser (auth/autologin.py, with the worker's recipe and credentials) or
by an operator who pastes the code, then confirmed with a one-token turn.

One login per account at a time (a named lock, in Redis when replicas share it), one per fixed port
(Codex listens on 1455), each attempt time-limited; automatic attempts are
retried with doubling delays, except after a wrong password, which stops and
says so. What an operator sees (``status``) never holds a secret: the URL to
open, a device code, the attempt, the last error (scrubbed), whether a
screenshot exists, and the hash prefix of a pasted code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from auth.autologin import AutoLoginError, Credentials, auto_login
from auth.recipes import RecipeError, load_recipe
from pool.cli.driver import DriverError
from pool.cli.login import FIXED_PORTS, LoginFailed, make_login
from pool.errors import BadRequest, GatewayError
from pool.model import ChatRequest, Finish, Message, Sampling, TextPart
from pool.worker import WorkerState
from sessions.bundles import fingerprint
from sessions.shared import Locks, MemoryLocks

from .accounts import Accounts, Conflict

__all__ = ["LoginRecord", "Logins"]

log = structlog.get_logger("poolgate.accounts")
_BEGIN_TIMEOUT = 30.0
_SUBMIT_TIMEOUT = 60.0
_READY_TIMEOUT = 60.0
_BACKOFF_CAP = 600.0
_OPERATOR_WAIT = 3600.0  # how long a login lock outlasts an operator who has yet to paste
_ACTIVE = ("queued", "starting", "browser", "waiting_for_code", "confirming", "retrying")


@dataclass(slots=True)
class LoginRecord:
    worker: str
    auto: bool = False
    state: str = "idle"
    attempt: int = 0
    attempts: int = 1
    url: str | None = field(default=None, repr=False)
    user_code: str | None = None
    verification_url: str | None = None
    last_error: str | None = None
    reason: str | None = None
    page_text: str | None = None
    screenshot: bytes | None = field(default=None, repr=False)
    code_sha256: str | None = None
    pid: int | None = None  # the CLI's login process, while it runs
    started_at: float | None = None
    finished_at: float | None = None
    next_attempt_at: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def set(self, **values: Any) -> None:
        for key, value in values.items():
            setattr(self, key, value)
        self.changed.set()

    def as_dict(self) -> dict[str, Any]:
        shot = self.screenshot is not None
        return {"worker": self.worker, "state": self.state, "auto": self.auto,
                "attempt": self.attempt, "attempts": self.attempts, "url": self.url,
                "user_code": self.user_code, "verification_url": self.verification_url,
                "last_error": self.last_error, "reason": self.reason, "page_text": self.page_text,
                "screenshot": shot,
                "screenshot_url": f"/internal/workers/{self.worker}/login/screenshot" if shot
                else None,
                "code_sha256": self.code_sha256, "pid": self.pid, "started_at": self.started_at,
                "finished_at": self.finished_at, "next_attempt_at": self.next_attempt_at}


class Logins:
    def __init__(self, accounts: Accounts, registry: CollectorRegistry,
                 environment: Mapping[str, str], pool: Any = None,
                 locks: Locks | None = None) -> None:
        self.accounts = accounts
        # one login per account across replicas (Redis locks when replicas share Redis)
        self.locks: Locks = locks if locks is not None else MemoryLocks()
        self.environment = dict(environment)
        self.pool = pool
        self.records: dict[str, LoginRecord] = {}
        self._pasted: dict[str, asyncio.Queue[str]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.alerts: Any = None  # app.alerts.Alerts, set by create_app
        self.started = Counter("poolgate_logins_started", "Logins started.",
                               ["worker", "mode"], registry=registry)
        self.succeeded = Counter("poolgate_logins_succeeded", "Logins that ended logged in.",
                                 ["worker", "mode"], registry=registry)
        self.failed = Counter("poolgate_logins_failed", "Login attempts that failed, by reason.",
                              ["worker", "reason"], registry=registry)
        self.duration = Histogram("poolgate_login_duration_seconds",
                                  "Seconds from start to logged in or given up.", ["outcome"],
                                  buckets=(1, 2, 5, 10, 30, 60, 120, 300, 900),
                                  registry=registry)
        registry.register(_AccountsCollector(self))

    # --- the LoginFlow of pool/cli/account.py: every call comes through an Account ----------

    def prepare(self, name: str, auto: bool | None) -> LoginRecord:
        login = self.accounts.config(name).login
        automatic = login is not None and login.automatic
        auto = automatic if auto is None else auto
        if auto and not automatic:
            raise BadRequest(f"Worker '{name}' has no login.recipe with username_env and "
                             "password_env: start with {\"auto\": false} and paste the code.",
                             param="auto")
        record = self.records[name] = LoginRecord(
            worker=name, auto=auto, state="starting", started_at=time.time(),
            attempts=login.attempts if auto and login is not None else 1)
        self._pasted[name] = asyncio.Queue(maxsize=1)
        self.started.labels(name, "auto" if auto else "operator").inc()
        log.info("accounts.login_started", worker=name, auto=auto)
        return record

    async def run(self, account: Any, record: LoginRecord) -> None:
        await self._run(account.worker, record)

    def ended(self, record: LoginRecord, reason: str, message: str) -> None:
        """A login ended from outside (its deadline, or an operator's cancel): its
        CLI process is gone and its locks are free by now."""
        record.set(state="cancelled" if reason == "cancelled" else "failed", reason=reason,
                   last_error=message, finished_at=time.time(), pid=None)
        self.failed.labels(record.worker, reason).inc()
        if reason != "cancelled":  # an operator's cancel is no failure
            self._alert_failed(record, reason)
        if record.started_at is not None:
            self.duration.labels(reason).observe(time.time() - record.started_at)
        log.warning("accounts.login_ended", worker=record.worker, reason=reason)

    def _alert_failed(self, record: LoginRecord, reason: str) -> None:
        """``login_failed``: one alert per failed attempt (each one an operator acts on)."""
        if self.alerts is not None:
            self.alerts.notify("login_failed", "worker", record.worker, "login_failed",
                               once=f"{record.started_at}:{record.attempt}",
                               details={"reason": reason, "attempt": record.attempt})

    async def answer(self, record: LoginRecord, stage: str) -> dict[str, Any]:
        if stage == "started":  # answer with the URL when there is one
            await self._settle(record, ("starting",), 20.0)
        else:
            await self._settle(record, ("waiting_for_code", "confirming"), _SUBMIT_TIMEOUT + 30)
        return record.as_dict()

    def paste(self, name: str, code: str) -> LoginRecord:
        record = self.records.get(name)
        if record is None or record.state != "waiting_for_code":
            state = record.state if record else "idle"
            raise Conflict(f"Worker '{name}' is not waiting for a code (login state "
                           f"{state}): POST /internal/workers/{name}/login first.")
        queue = self._pasted[name]
        if queue.full():
            raise Conflict(f"A code for worker '{name}' was already pasted.")
        record.set(code_sha256=fingerprint(code.encode()))
        queue.put_nowait(code)
        log.info("accounts.login_code_pasted", worker=name, sha256=record.code_sha256)
        return record

    def relogin_due(self, name: str) -> bool:
        """After a failed login the next waits ``backoff`` doubled per attempt;
        after a wrong password, or a login an operator cancelled, nothing is
        tried until an operator starts a login."""
        login = self.accounts.config(name).login
        if login is None or not login.relogin or not login.automatic:
            return False
        record = self.records.get(name)
        if record is None or record.finished_at is None:
            return record is None
        if record.reason in ("wrong_password", "cancelled"):  # until an operator starts one
            return False
        wait = min(login.backoff * 2 ** record.attempt, _BACKOFF_CAP)
        return time.time() - record.finished_at >= wait

    async def watch(self, interval: float = 2.0) -> None:
        """Each account's own schedule (:meth:`pool.cli.account.Account.tick`): a
        logged-out account is probed again, and logged in by itself when its
        ``login.relogin`` (and a recipe and credentials) says so."""
        while True:
            await asyncio.sleep(interval)
            accounts = list(self.accounts.machines.values())
            results = await asyncio.gather(*(account.tick() for account in accounts),
                                           return_exceptions=True)
            for account, result in zip(accounts, results):
                if isinstance(result, Exception):  # one account's bug must not stop the others
                    log.error("accounts.tick_failed", worker=account.name,
                              error=type(result).__name__)

    def status(self, name: str) -> dict[str, Any]:
        self.accounts.config(name)
        record = self.records.get(name)
        info = record.as_dict() if record else LoginRecord(worker=name).as_dict()
        worker = self._worker(name)
        info["login"] = worker.info().get("login") if worker is not None else None
        account = self.accounts.machines.get(name)
        info["account_state"] = account.state.value if account is not None else None
        return info

    def screenshot(self, name: str) -> bytes | None:
        record = self.records.get(name)
        return record.screenshot if record else None

    # --- one login ------------------------------------------------------------------------

    async def _run(self, worker: Any, record: LoginRecord) -> None:
        account = self.accounts.config(worker.name)
        port = FIXED_PORTS.get(account.cli)
        started = time.monotonic()
        # held for every attempt and the waits between them; the port is this host's own
        timeout = account.login.timeout if account.login is not None else _OPERATOR_WAIT
        ttl = record.attempts * (timeout + _BACKOFF_CAP) + 60.0
        lock = self.locks.hold(f"login:{worker.name}", ttl=ttl)
        port_lock = self._locks.setdefault(f"port:{port}", asyncio.Lock()) if port else None
        if port_lock is not None and port_lock.locked():
            # another account's login holds the CLI's fixed port: wait in line, visibly
            record.set(state="queued", last_error=f"waiting for port {port} (another login)")
        try:
            async with lock, (port_lock or contextlib.nullcontext()):
                if await self._attempts(worker, account, record, started):
                    return
        except Exception as exc:  # the shared lock: Redis lost on the way in or out
            if record.state == "ready":
                log.warning("accounts.login_lock_lost", worker=worker.name, error=str(exc))
                return
            log.warning("accounts.login_lock_failed", worker=worker.name, error=str(exc))
            self._failed(record, LoginFailed(f"the login lock is unavailable "
                                             f"({type(exc).__name__})", "lock"))
        record.set(state="failed", finished_at=time.time())
        self.duration.labels("failed").observe(time.monotonic() - started)

    async def _attempts(self, worker: Any, account: Any, record: LoginRecord,
                        started: float) -> bool:
        """The attempts of one login, under its lock; whether it ended logged in."""
        record.set(last_error=None)
        for attempt in range(1, record.attempts + 1):
            record.set(attempt=attempt, state="starting", next_attempt_at=None)
            try:
                await self._attempt(worker, account, record)
            except (AutoLoginError, LoginFailed, GatewayError, RecipeError, TimeoutError,
                    DriverError) as exc:
                retry = self._failed(record, exc)
                if not retry or attempt == record.attempts:
                    break
                delay = min(account.login.backoff * 2 ** (attempt - 1), _BACKOFF_CAP)
                record.set(state="retrying", next_attempt_at=time.time() + delay)
                await asyncio.sleep(delay)
                continue
            except Exception as exc:  # a bug must not leave the login "in progress" forever
                log.exception("accounts.login_error", worker=worker.name)
                self._failed(record, LoginFailed(f"internal error ({type(exc).__name__})",
                                                 "internal"))
                break
            record.set(state="ready", finished_at=time.time(), last_error=None, reason=None)
            self.succeeded.labels(worker.name, "auto" if record.auto else "operator").inc()
            self.duration.labels("ready").observe(time.monotonic() - started)
            log.info("accounts.login_succeeded", worker=worker.name, attempt=attempt)
            return True
        return False

    def _failed(self, record: LoginRecord, exc: Exception) -> bool:
        """Record a failed attempt; whether another may follow."""
        reason = getattr(exc, "reason", None) or ("timeout" if isinstance(exc, TimeoutError)
                                                  else "error")
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        retry = getattr(exc, "retry", True) and reason not in ("unsupported", "code_refused")
        if isinstance(exc, (GatewayError, RecipeError, DriverError)):
            retry = False
        if reason == "wrong_password":
            message += " (wrong password: not retried, to keep the account from being locked)"
        shot = getattr(exc, "screenshot", None)
        record.set(last_error=message, reason=reason, page_text=getattr(exc, "page_text", None),
                   screenshot=shot if shot is not None else record.screenshot)
        self.failed.labels(record.worker, reason).inc()
        self._alert_failed(record, reason)
        log.warning("accounts.login_failed", worker=record.worker, reason=reason,
                    attempt=record.attempt, error=message)
        return retry and record.auto

    async def _attempt(self, worker: Any, account: Any, record: LoginRecord) -> None:
        spec = worker.cli_spec
        cli_login = make_login(account.cli, home=account.home,  # the CLI's own environment:
                               env=spec.child_config(self.environment)["env"],  # no gateway secret
                               command=spec.command or None)
        worker.login_override = "logging_in"  # shown in /internal/workers, not routed to
        try:
            challenge = await cli_login.begin(_BEGIN_TIMEOUT)
            record.set(pid=getattr(cli_login, "pid", None), url=challenge.url, user_code=challenge.user_code,
                       verification_url=challenge.verification_url,
                       state="browser" if record.auto else "waiting_for_code")
            if record.auto:
                # the browser leaves through the account's egress proxy, as its CLI does
                await self._browser(account, challenge, cli_login, worker.cli_spec.proxy)
            else:
                code = await self._pasted[worker.name].get()
                record.set(state="confirming")
                await cli_login.submit(code, _SUBMIT_TIMEOUT)
        finally:
            worker.login_override = None
            await cli_login.close()  # the whole process group, also when cancelled
            record.set(pid=None)
        record.set(state="confirming")
        await self._confirm(worker)

    async def _browser(self, account: Any, challenge: Any, cli_login: Any,
                       proxy: str | None) -> None:
        login = account.login
        recipe = load_recipe(login.recipe)
        credentials = Credentials(
            login.username.get_secret_value(), login.password.get_secret_value(),
            login.totp_secret.get_secret_value() if login.totp_secret else None)
        result = await auto_login(recipe, challenge.url, credentials, timeout=login.timeout,
                                  proxy=proxy)
        if challenge.wants_code:
            if not result.code:
                raise LoginFailed("the recipe found no code to paste (see its [code] table)",
                                  "no_code")
            await cli_login.submit(result.code, _SUBMIT_TIMEOUT)
        else:
            await cli_login.wait(_SUBMIT_TIMEOUT)

    async def _confirm(self, worker: Any) -> None:
        """Restart the worker on the new credentials and have it answer one token."""
        old_pid = getattr(worker, "pid", None)
        await worker.restart()  # a stopped slot is started again, a running one replaced
        deadline = time.monotonic() + _READY_TIMEOUT
        while True:
            await worker.refresh()
            # restart returns before the old process is gone: wait for the new one
            pid = getattr(worker, "pid", None)
            if (worker.state is WorkerState.READY and worker.login == "ready"
                    and pid is not None and pid != old_pid):
                break
            if time.monotonic() > deadline:
                raise LoginFailed(f"worker {worker.name} did not come back logged in "
                                  f"({worker.state.value}, {worker.login})", "confirm_failed")
            await asyncio.sleep(0.2)
        probe = ChatRequest(model=worker.models[0], dialect="anthropic",
                            messages=(Message("user", (TextPart("Reply with one word."),)),),
                            sampling=Sampling(max_tokens=1))
        finished = False
        try:
            async with asyncio.timeout(_SUBMIT_TIMEOUT):
                async for event in worker.stream(probe):
                    finished = finished or isinstance(event, Finish)
        except GatewayError as exc:
            raise LoginFailed(f"the one-token turn after the login failed: {exc.message}",
                              "confirm_failed") from None
        if not finished:
            raise LoginFailed("the one-token turn after the login did not finish",
                              "confirm_failed")

    # --- helpers ----------------------------------------------------------------------------

    async def _settle(self, record: LoginRecord, states: tuple[str, ...], timeout: float) -> None:
        """Wait (bounded) until the record leaves ``states``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while record.state in states:
                    record.changed.clear()
                    await record.changed.wait()

    def _worker(self, name: str) -> Any:
        if self.pool is None:
            return None
        with contextlib.suppress(GatewayError):
            return self.pool.worker(name)
        return None


class _AccountsCollector:
    """``poolgate_accounts{state}``: cli accounts by login state, read at scrape time."""

    def __init__(self, logins: Logins) -> None:
        self.logins = logins

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        counts = {"ready": 0, "logged_out": 0, "logging_in": 0, "failed": 0, "unknown": 0}
        for name in self.logins.accounts.configs:
            record = self.logins.records.get(name)
            worker = self.logins._worker(name)
            if record is not None and record.state in _ACTIVE:
                state = "logging_in"
            elif record is not None and record.state == "failed":
                state = "failed"
            else:
                login = worker.info().get("login") if worker is not None else None
                state = login if login in counts else "unknown"
            counts[state] += 1
        family = GaugeMetricFamily("poolgate_accounts", "cli accounts by login state.",
                                   labels=["state"])
        for state, count in counts.items():
            family.add_metric([state], count)
        yield family
