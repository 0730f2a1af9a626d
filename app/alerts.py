"""Signed webhooks for ``[[alerts]]``: what an operator should hear of, posted
by background tasks, never on the request path.

Who notices a change calls :meth:`Alerts.notify` (synchronous, no I/O): it is
deduplicated per receiver, event and subject by its ``once`` token (a key's
budget window, "logged out until it leaves that state") and put on the
receiver's bounded queue; a full queue drops it and counts it. One task per
receiver posts the queue in order, retrying a refused or failed POST with
exponential backoff (``retry_initial`` doubled up to ``retry_max``, at most
``max_attempts``). Each POST is signed (docs/configuration.md#alerts):

    x-poolgate-timestamp: <unix seconds of this attempt>
    x-poolgate-signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + body)>
    x-poolgate-alert-id:  <the same on every attempt of one alert>
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
import structlog
from prometheus_client import CollectorRegistry, Counter

from pool.cli.account import AccountState

from .alert_settings import AlertSettings

__all__ = ["Alert", "Alerts", "AccountAlerts", "sign", "QUEUE_SIZE"]

log = structlog.get_logger("app.alerts")
#: alerts waiting per receiver; past it new ones are dropped (and counted)
QUEUE_SIZE = 1000


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert: ``subject`` is a worker's or a key's name (``subject_kind``)."""

    event: str
    subject_kind: str
    subject: str
    state: str
    time: float
    details: Mapping[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: secrets.token_hex(12))
    shared: str | None = None  # its once token, when every replica may notice it (claims)

    def body(self) -> bytes:
        return orjson.dumps({
            "id": self.id, "event": self.event, self.subject_kind: self.subject,
            "state": self.state, "time": _iso(self.time), "details": dict(self.details)})


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``x-poolgate-signature`` value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


class _Receiver:
    """One ``[[alerts]]`` entry: its queue, its task, what it was last told."""

    def __init__(self, settings: AlertSettings, queue_size: int) -> None:
        self.settings = settings
        self.queue: asyncio.Queue[Alert] = asyncio.Queue(queue_size)
        # (event, subject or "subject\x1fpart") -> its once token
        self.sent: dict[tuple[str, str], str] = {}
        self.task: asyncio.Task[None] | None = None

    def wants(self, event: str, percent: float | None,
              when: Callable[[AlertSettings], bool] | None) -> bool:
        if event not in self.settings.events:
            return False
        if when is not None and not when(self.settings):
            return False
        return percent is None or percent >= self.settings.budget_warn_percent


class Alerts:
    """Every ``[[alerts]]`` receiver; ``notify`` from anywhere on the loop."""

    def __init__(self, settings: Iterable[AlertSettings], registry: CollectorRegistry, *,
                 queue_size: int = QUEUE_SIZE, clock: Callable[[], float] = time.time) -> None:
        self.receivers = [_Receiver(s, queue_size) for s in settings]
        self._clock = clock
        self._client: aiohttp.ClientSession | None = None
        # sessions.alert_claims.RedisAlertClaims with Redis: a shared alert is sent by one replica
        self.claims: Any = None
        self.sent = Counter("poolgate_alerts_sent", "Alerts a receiver accepted (2xx).",
                            ["event"], registry=registry)
        self.failed = Counter("poolgate_alerts_failed",
                              "Alerts given up on after their attempts (or refused with a 4xx).",
                              ["event"], registry=registry)
        self.dropped = Counter("poolgate_alerts_dropped",
                               "Alerts dropped because a receiver's queue was full.",
                               ["event"], registry=registry)

    # --- noticing --------------------------------------------------------------------------

    def wants(self, event: str) -> bool:
        """Whether any receiver gets ``event`` (so a caller can skip the work of noticing it)."""
        return any(event in r.settings.events for r in self.receivers)

    def notify(self, event: str, subject_kind: str, subject: str, state: str, *, once: str,
               details: Mapping[str, Any] | None = None, percent: float | None = None,
               when: Callable[[AlertSettings], bool] | None = None,
               part: str = "", shared: bool = False) -> None:
        """Queue ``event`` for every receiver that wants it and was not told of
        it with the same ``once`` token already; ``percent`` is checked against
        each receiver's ``budget_warn_percent``, ``when`` (if given) against its
        settings. ``part`` tells apart what of one subject is deduplicated
        separately (an account's quota windows). ``shared``: every replica may
        notice it (state kept in Redis); only the one that claims it sends it."""
        alert: Alert | None = None
        sent_key = (event, f"{subject}\x1f{part}" if part else subject)
        for receiver in self.receivers:
            if not receiver.wants(event, percent, when) or receiver.sent.get(sent_key) == once:
                continue
            alert = alert or Alert(event, subject_kind, subject, state, self._clock(),
                                   details or {},
                                   shared=(f"{part}:{once}" if part else once) if shared else None)
            try:
                receiver.queue.put_nowait(alert)
                receiver.sent[sent_key] = once
            except asyncio.QueueFull:  # not marked sent: the next notice tries again
                self.dropped.labels(event).inc()
                log.warning("alerts.dropped", alert_event=event, subject=subject,
                            url=_host(receiver.settings.url))

    def clear(self, event: str, subject: str) -> None:
        """``subject`` left the state of ``event``: the next entry alerts again."""
        for receiver in self.receivers:
            receiver.sent.pop((event, subject), None)

    # --- sending ---------------------------------------------------------------------------

    def start(self) -> None:
        if not self.receivers:
            return
        # the gateway's own proxy variables never route an alert; no cookies kept
        self._client = aiohttp.ClientSession(trust_env=False, cookie_jar=aiohttp.DummyCookieJar())
        for receiver in self.receivers:
            receiver.task = asyncio.ensure_future(self._deliver(receiver))

    async def aclose(self) -> None:
        for receiver in self.receivers:
            if receiver.task is not None:
                receiver.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await receiver.task
                if receiver.queue.qsize():
                    log.warning("alerts.unsent_at_shutdown", count=receiver.queue.qsize(),
                                url=_host(receiver.settings.url))
        if self._client is not None:
            await self._client.close()

    async def _deliver(self, receiver: _Receiver) -> None:
        while True:
            alert = await receiver.queue.get()
            try:
                if not await self._claimed(receiver, alert):
                    continue  # another replica sends it
                delivered = await self._post(receiver.settings, alert)
            except Exception as exc:  # a bug here must not end the receiver's task
                log.error("alerts.send_bug", alert_event=alert.event, error=type(exc).__name__)
                delivered = False
            (self.sent if delivered else self.failed).labels(alert.event).inc()

    async def _claimed(self, receiver: _Receiver, alert: Alert) -> bool:
        """Whether this replica sends ``alert`` to ``receiver``: always, unless it
        is shared and another replica claimed it first (per receiver, by its URL's hash)."""
        if alert.shared is None or self.claims is None:
            return True
        url = hashlib.sha256(receiver.settings.url.encode()).hexdigest()[:16]
        return bool(await self.claims.claim(f"{url}:{alert.event}:{alert.subject}:{alert.shared}"))

    async def _post(self, settings: AlertSettings, alert: Alert) -> bool:
        """Whether the receiver took ``alert``, after up to ``max_attempts`` tries."""
        assert self._client is not None
        body = alert.body()
        delay = settings.retry_initial
        for attempt in range(1, settings.max_attempts + 1):
            outcome = await self._attempt(settings, alert, body)
            if outcome is None:
                return True
            retry = outcome != "refused" and attempt < settings.max_attempts
            log.warning("alerts.attempt_failed", alert_event=alert.event, subject=alert.subject,
                        url=_host(settings.url), attempt=attempt, reason=outcome,
                        retry_in=round(delay, 2) if retry else None)
            if not retry:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, settings.retry_max)
        return False

    async def _attempt(self, settings: AlertSettings, alert: Alert, body: bytes) -> str | None:
        """None when delivered, else why not: ``refused`` (a 4xx: not retried) or
        the error or status (retried)."""
        assert self._client is not None
        now = int(self._clock())
        headers = {"content-type": "application/json", "x-poolgate-timestamp": str(now),
                   "x-poolgate-alert-id": alert.id, "x-poolgate-event": alert.event}
        if settings.secret is not None:
            headers["x-poolgate-signature"] = sign(settings.secret.get_secret_value().encode(),
                                                   now, body)
        try:
            async with self._client.post(
                    settings.url, data=body, headers=headers, allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=settings.timeout)) as response:
                status = response.status
                await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return type(exc).__name__
        if 200 <= status < 300:
            log.info("alerts.sent", alert_event=alert.event, subject=alert.subject,
                     url=_host(settings.url))
            return None
        if 400 <= status < 500 and status not in (408, 425, 429):
            return "refused"
        return f"http_{status}"

    # --- workers the gateway runs ------------------------------------------------------------

    async def watch_workers(self, workers: Callable[[], Iterable[Any]],
                            interval: float = 2.0) -> None:
        """``worker_crash_looping`` from each worker's supervisor flag, once per loop."""
        while True:
            for worker in list(workers()):
                if getattr(worker, "crash_looping", False):
                    self.notify("worker_crash_looping", "worker", worker.name, "crash_looping",
                                once="crash_looping",
                                details={"restarts": getattr(worker, "restarts", None)})
                else:
                    self.clear("worker_crash_looping", worker.name)
            await asyncio.sleep(interval)


#: account states that alert while the account is in them
_ACCOUNT_EVENTS = {AccountState.LOGGED_OUT: "account_logged_out",
                   AccountState.COOLING_DOWN: "account_cooling_down"}
#: the states that end a logged-out spell: logged in, or stopped by an operator (a login
#: under way, the restart after it, still count as logged out: no alert per attempt)
_LOGGED_IN = frozenset({AccountState.READY, AccountState.COOLING_DOWN, AccountState.DRAINING,
                        AccountState.STOPPED})


class AccountAlerts:
    """The :class:`pool.cli.account.AccountObserver` that turns an account's
    state changes into alerts: once on entering a state, again only after it
    left it (logged out: only once it is logged in again, or stopped)."""

    def __init__(self, alerts: Alerts) -> None:
        self.alerts = alerts

    def account_changed(self, name: str, before: AccountState | None, after: AccountState,
                        details: Mapping[str, Any]) -> None:
        for state, event in _ACCOUNT_EVENTS.items():
            if after is state:
                self.alerts.notify(event, "worker", name, after.value, once=state.value,
                                   details={"previous_state": before.value if before else None,
                                            **details})
            elif state is AccountState.COOLING_DOWN or after in _LOGGED_IN:
                self.alerts.clear(event, name)


def _host(url: str) -> str:
    """A receiver named in logs by scheme and host: its path may hold a token."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
