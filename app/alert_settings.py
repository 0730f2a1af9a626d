"""The ``[[alerts]]`` tables: where poolgate posts a signed JSON body when an
account, a worker or a key changes into a state an operator should hear of.

The events are named in :data:`EVENTS`; an unknown name is a config error that
names it. The signing secret is read from ``secret_env`` at load time (into a
``SecretStr``) and never appears in a body, a log line or an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

__all__ = ["EVENTS", "AlertSettings", "missing_alert_secrets", "resolve_alert_secrets"]

#: event name -> what fires it (docs/configuration.md has the same table)
EVENTS: Mapping[str, str] = {
    "account_logged_out": "a cli account became logged_out (once until it leaves that state)",
    "login_failed": "a login attempt of a cli account failed",
    "account_cooling_down": "a cli account is cooling down until its quota resets",
    "worker_crash_looping": "a worker's process keeps failing (crash_loop_threshold)",
    "key_over_budget": "a key's daily or monthly token budget is used up (once per budget window)",
    "key_near_budget": "a key used budget_warn_percent of a budget (once per budget window)",
    "account_quota_low": "a quota window of a cli account has less than quota_warn_percent "
                         "left (once per window until it resets)",
    "account_quota_forecast": "a quota window of a cli account is forecast to run out within "
                              "forecast_warn_minutes (once per window until it resets)",
}


class AlertSettings(BaseModel):
    """One ``[[alerts]]`` table: a receiver and the events it gets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    events: tuple[str, ...] = Field(min_length=1)
    # the HMAC-SHA256 key of the x-poolgate-signature header, by environment variable
    secret_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    secret: SecretStr | None = None  # resolved from secret_env; never in a body or a log
    budget_warn_percent: float = Field(80.0, gt=0, lt=100)  # key_near_budget fires at this
    quota_warn_percent: float = Field(20.0, gt=0, lt=100)   # account_quota_low: left below this
    forecast_warn_minutes: float = Field(60.0, gt=0, le=10080)  # account_quota_forecast: within
    timeout: float = Field(5.0, gt=0, le=60)            # one POST, seconds
    retry_initial: float = Field(1.0, gt=0, le=60)      # first backoff, doubled per attempt
    retry_max: float = Field(60.0, gt=0, le=3600)       # backoff ceiling
    max_attempts: int = Field(10, ge=1, le=100)         # then the alert counts as failed

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url must be an http:// or https:// URL with a host")
        return url

    @field_validator("events")
    @classmethod
    def _check_events(cls, events: tuple[str, ...]) -> tuple[str, ...]:
        for name in events:
            if name not in EVENTS:
                raise ValueError(f"unknown event {name!r} (known: {', '.join(EVENTS)})")
        return tuple(dict.fromkeys(events))


def missing_alert_secrets(alerts: Any, environ: Mapping[str, str]) -> list[str]:
    """``alerts[i].secret_env`` naming a variable that is not set."""
    if not isinstance(alerts, list | tuple):
        return []
    return [f"alerts[{i}].secret_env: environment variable {a['secret_env']} is not set"
            for i, a in enumerate(alerts)
            if isinstance(a, dict) and isinstance(a.get("secret_env"), str)
            and not environ.get(a["secret_env"])]


def resolve_alert_secrets(alerts: tuple[AlertSettings, ...],
                          environ: Mapping[str, str]) -> tuple[AlertSettings, ...]:
    return tuple(a.model_copy(update={"secret": SecretStr(environ[a.secret_env])})
                 if a.secret_env else a for a in alerts)
