"""``account_quota_low`` and ``account_quota_forecast``: alerts from the quota
the cli workers last saw, checked by a loop (every 2 s) off the request path.

Per account and window: a window with less than a receiver's
``quota_warn_percent`` left alerts that receiver once, and one forecast to run
out within its ``forecast_warn_minutes`` alerts once, until the window resets;
after the reset it may alert again. However many turns or status frames report
the same low window meanwhile, and however its numbers hover around the
threshold, it is one alert. The reset that names a window's spell is the first
one seen: a vendor's reset time that moves by up to a minute between reports
(Codex gives seconds from now) is the same spell.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from pool.quota import QuotaWindow

from .alert_settings import AlertSettings
from .alerts import Alerts
from .quota_view import account_quota, iso

__all__ = ["QuotaAlerts", "QUOTA_EVENTS"]

log = structlog.get_logger("app.alerts")
QUOTA_EVENTS = ("account_quota_low", "account_quota_forecast")
#: reset times this close are the same window's
_SAME_RESET = 60.0


class QuotaAlerts:
    """Turns the cli workers' quota into alerts (see the module's docstring)."""

    def __init__(self, alerts: Alerts, clock: Callable[[], float] = time.time) -> None:
        self.alerts = alerts
        self._clock = clock
        self._spells: dict[tuple[str, str], float] = {}  # (worker, window) -> first reset seen

    def wanted(self) -> bool:
        return any(self.alerts.wants(event) for event in QUOTA_EVENTS)

    async def watch(self, workers: Callable[[], Iterable[Any]], interval: float = 2.0) -> None:
        while True:
            try:
                self.check(workers())
            except Exception as exc:  # a bug here must not end the alerts for good
                log.error("alerts.quota_check_bug", error=type(exc).__name__)
            await asyncio.sleep(interval)

    def check(self, workers: Iterable[Any]) -> None:
        """Alert what the workers' quota says now (synchronous, no I/O)."""
        now = self._clock()
        for worker in list(workers):
            quota = account_quota(worker)
            if quota is None:
                continue
            headroom = quota.headroom(now)
            for window in quota.windows:
                if window.current(now):
                    self._check_window(worker.name, window, headroom, now)

    def _check_window(self, name: str, window: QuotaWindow, headroom: float | None,
                      now: float) -> None:
        left = window.left_percent(now)
        forecast = window.forecast(now)
        spell = self._spell(name, window)
        details = {"window": window.name, "source": window.source,
                   "used_percent": round(window.used_percent, 2),
                   "left_percent": round(left, 2),
                   "headroom_percent": None if headroom is None else round(headroom, 2),
                   "resets_at": iso(window.resets_at), "seen_at": iso(window.seen_at or None),
                   "forecast_empty_at": iso(forecast)}

        def low(s: AlertSettings) -> bool:
            return left < s.quota_warn_percent
        self.alerts.notify("account_quota_low", "worker", name, "quota_low", once=spell,
                           part=window.name, when=low, details=details)
        if forecast is None:
            return
        minutes = max(0.0, forecast - now) / 60

        def soon(s: AlertSettings) -> bool:
            return minutes <= s.forecast_warn_minutes
        self.alerts.notify("account_quota_forecast", "worker", name, "quota_forecast",
                           once=spell, part=window.name, when=soon,
                           details={**details, "minutes_left": round(minutes, 1)})

    def _spell(self, name: str, window: QuotaWindow) -> str:
        """The dedup token of this window until it resets: its first reset time seen."""
        if window.resets_at is None:
            return window.name
        key = (name, window.name)
        first = self._spells.get(key)
        if first is None or abs(window.resets_at - first) > _SAME_RESET:
            self._spells[key] = first = window.resets_at
        return f"{window.name}@{first:.0f}"
