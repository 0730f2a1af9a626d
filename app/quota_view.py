"""What operators see of a cli account's quota: the JSON block of
``GET /internal/accounts`` and ``GET /internal/workers``, and the rows the
``/metrics`` gauges are made of.

Read-only over :class:`pool.quota.AccountQuota` (a cli worker's ``quota``;
other workers have none). Times are given both as Unix seconds and as ISO
8601 UTC; a forecast is also given as seconds from ``now``. Nothing here
does I/O: a request or a scrape reads what the worker last saw.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pool.quota import AccountQuota, QuotaWindow

__all__ = ["account_quota", "quota_block", "account_entry", "quota_metrics", "iso"]


def iso(ts: float | None) -> str | None:
    """``ts`` (Unix seconds) as ISO 8601 UTC with a ``Z``; ``None`` stays ``None``."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def account_quota(worker: Any) -> AccountQuota | None:
    """The worker's quota: ``None`` for a worker that has none (not a cli
    worker), an empty one for a cli worker that knows nothing yet."""
    if getattr(worker, "kind", None) != "cli":
        return None
    quota = getattr(worker, "quota", None)
    return quota if isinstance(quota, AccountQuota) else AccountQuota()


def _in(ts: float | None, now: float) -> float | None:
    return None if ts is None else round(max(0.0, ts - now), 1)


def _window(w: QuotaWindow, now: float) -> dict[str, Any]:
    forecast = w.forecast(now)
    return {"window": w.name, "used_percent": round(w.used_percent, 2),
            "left_percent": round(w.left_percent(now), 2), "current": w.current(now),
            "resets_at": w.resets_at, "resets_at_iso": iso(w.resets_at),
            "window_seconds": w.window_seconds, "source": w.source,
            "seen_at": w.seen_at or None, "seen_at_iso": iso(w.seen_at or None),
            "forecast_empty_at": forecast, "forecast_empty_at_iso": iso(forecast),
            "forecast_seconds": _in(forecast, now)}


def quota_block(quota: AccountQuota, now: float) -> dict[str, Any]:
    """An account's quota as the admin JSON shows it: its source (``vendor``,
    ``counted``, or ``None`` when nothing is known), headroom (percent left in
    the tightest window), that window's name, the earliest forecast of running
    out, and every window."""
    tight = quota.tightest(now)
    headroom = quota.headroom(now)
    forecast = quota.forecast(now)
    return {"source": quota.source(),
            "headroom_percent": round(headroom, 2) if headroom is not None else None,
            "tightest_window": tight.name if tight is not None else None,
            "forecast_empty_at": forecast, "forecast_empty_at_iso": iso(forecast),
            "forecast_seconds": _in(forecast, now),
            "windows": [_window(w, now) for w in quota.windows]}


def account_entry(worker: Any, now: float) -> dict[str, Any]:
    """One cli account as ``GET /internal/accounts`` lists it."""
    info = worker.info()
    return {"name": worker.name, "cli": info.get("cli"), "account": info.get("account"),
            "state": info.get("account_state") or worker.state.value,
            "models": list(worker.models), "cooldown_until": info.get("cooldown_until"),
            **quota_block(account_quota(worker) or AccountQuota(), now)}


def quota_metrics(workers: Any, now: float) -> list[dict[str, Any]]:
    """Per cli account, what the ``poolgate_account_quota_*`` gauges export."""
    rows = []
    for worker in workers:
        quota = account_quota(worker)
        if quota is None:
            continue
        forecast = quota.forecast(now)
        rows.append({"worker": worker.name, "headroom": quota.headroom(now),
                     "forecast_seconds": None if forecast is None else max(0.0, forecast - now),
                     "windows": [{"window": w.name, "source": w.source,
                                  "used_percent": w.used_percent if w.current(now) else 0.0,
                                  "resets_at": w.resets_at, "seen_at": w.seen_at}
                                 for w in quota.windows]})
    return rows
