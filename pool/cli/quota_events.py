"""Sans-IO: what the vendor CLIs say about an account's quota, as
:class:`~pool.quota.QuotaWindow` values (see docs/cli-workers.md, "Quota").

Everything here reads CLI output, so everything is hostile: a field of the
wrong type, a name that is not a name, a percent out of range, a reset in
the year 3000 or a hundred windows give no window (or a clamped one), never
an exception. Units on the way out: percent 0–100, Unix seconds.

* Claude Code: ``rate_limit_event`` (``rate_limit_info``: ``rateLimitType``,
  ``utilization`` as a fraction, ``resetsAt``, ``status``; since 2.1.3xx also
  ``unifiedWindows.<window>`` with ``utilization`` / ``resetsAt`` / ``status``
  for every window) and the answer to the ``get_usage`` control request
  (``rate_limits.<window>.utilization`` in percent, ``resets_at`` ISO 8601).
* Codex: ``account/rateLimits/updated`` / ``account/rateLimits/read``
  (``primary`` / ``secondary``: ``usedPercent``, ``windowDurationMins``,
  ``resetsAt``; ``limitId``).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any, Mapping

from ..quota import VENDOR, QuotaWindow

__all__ = ["window", "claude_rate_limit", "claude_usage", "codex_rate_limits",
           "MAX_WINDOWS", "CLAUDE_WINDOW_SECONDS"]

#: windows taken from one report (a CLI that lists more is cut)
MAX_WINDOWS = 8
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_MAX_TIME = 4102444800.0     # 2100-01-01: a reset past it is junk
_MAX_WINDOW = 400 * 86400.0  # a window longer than this is junk
#: Claude's window names and their lengths (the names say it: 5 hours, 7 days)
CLAUDE_WINDOW_SECONDS = {"five_hour": 18000.0, "seven_day": 604800.0,
                         "seven_day_opus": 604800.0, "seven_day_sonnet": 604800.0,
                         "seven_day_overage_included": 604800.0}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _time(value: Any) -> float | None:
    """Unix seconds from a number or an ISO 8601 text; ``None`` for junk."""
    if isinstance(value, str) and 0 < len(value) <= 40:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            return None  # a local time says nothing exact
        number: float | None = parsed.timestamp()
    else:
        number = _num(value)
    return number if number is not None and 0 < number < _MAX_TIME else None


def window(name: Any, used_percent: Any, *, resets_at: Any = None, window_seconds: Any = None,
           seen_at: float, source: str = VENDOR) -> QuotaWindow | None:
    """One window from untrusted values, or ``None`` when the name or the percent
    is not usable (the percent is clamped to 0–100; a junk reset or length is
    left out)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return None
    used = _num(used_percent)
    if used is None:
        return None
    length = _num(window_seconds)
    return QuotaWindow(name=name, used_percent=min(100.0, max(0.0, used)),
                       resets_at=_time(resets_at),
                       window_seconds=length if length is not None and 0 < length <= _MAX_WINDOW
                       else None,
                       source=source, seen_at=seen_at)


def _found(windows: list[QuotaWindow | None]) -> tuple[QuotaWindow, ...]:
    return tuple(w for w in windows if w is not None)[:MAX_WINDOWS]


# --- Claude Code ------------------------------------------------------------------------

def _claude_window(name: Any, fraction: Any, resets_at: Any, now: float) -> QuotaWindow | None:
    used = _num(fraction)
    return window(name, used * 100.0 if used is not None else None, resets_at=resets_at,
                  seen_at=now, window_seconds=CLAUDE_WINDOW_SECONDS.get(name)
                  if isinstance(name, str) else None)


def claude_rate_limit(info: Any, now: float) -> tuple[QuotaWindow, ...]:
    """The windows a ``rate_limit_event``'s ``rate_limit_info`` gives numbers for:
    each of ``unifiedWindows`` (2.1.3xx: every window, fractions), and its
    ``rateLimitType`` at ``utilization`` × 100 (present with ``allowed_warning``)
    or at 100 % when ``rejected``. An older CLI's ``allowed`` carries no
    utilization: nothing (``get_usage`` says how much)."""
    if not isinstance(info, Mapping):
        return ()
    found: list[QuotaWindow | None] = []
    unified = info.get("unifiedWindows")
    if isinstance(unified, Mapping):
        for name, numbers in list(unified.items())[:MAX_WINDOWS * 2]:
            if isinstance(numbers, Mapping):
                found.append(_claude_window(name, numbers.get("utilization"),
                                            numbers.get("resetsAt"), now))
    name = info.get("rateLimitType")
    if not any(w is not None and w.name == name for w in found):
        fraction = info.get("utilization")
        if _num(fraction) is None and info.get("status") == "rejected":
            fraction = 1.0
        found.append(_claude_window(name, fraction, info.get("resetsAt"), now))
    return _found(found)


def claude_usage(response: Any, now: float) -> tuple[QuotaWindow, ...]:
    """The windows of a ``get_usage`` answer (``response.rate_limits``); a
    window whose utilization is missing (null) is unknown, not 0 %."""
    limits = response.get("rate_limits") if isinstance(response, Mapping) else None
    if not isinstance(limits, Mapping):
        return ()
    found: list[QuotaWindow | None] = []
    for name, numbers in list(limits.items())[:MAX_WINDOWS * 2]:
        if isinstance(numbers, Mapping):
            found.append(window(name, numbers.get("utilization"), seen_at=now,
                                resets_at=numbers.get("resets_at"),
                                window_seconds=CLAUDE_WINDOW_SECONDS.get(name)
                                if isinstance(name, str) else None))
    return _found(found)


# --- Codex ------------------------------------------------------------------------------

def _codex_limit(limits: Any, now: float, limit_id: Any = None) -> list[QuotaWindow | None]:
    if not isinstance(limits, Mapping):
        return []
    limit_id = limits.get("limitId", limit_id)
    prefix = "" if limit_id in (None, "codex") else f"{limit_id}:"
    found: list[QuotaWindow | None] = []
    for slot in ("primary", "secondary"):
        numbers = limits.get(slot)
        if isinstance(numbers, Mapping):
            minutes = _num(numbers.get("windowDurationMins"))
            found.append(window(prefix + slot, numbers.get("usedPercent"), seen_at=now,
                                resets_at=numbers.get("resetsAt"),
                                window_seconds=minutes * 60 if minutes is not None else None))
    return found


def codex_rate_limits(params: Any, now: float) -> tuple[QuotaWindow, ...]:
    """The windows of an ``account/rateLimits/updated`` notification's params or
    an ``account/rateLimits/read`` answer: ``primary`` / ``secondary`` of the
    ``codex`` limit by those names, another limit's as ``<limitId>:primary``."""
    if not isinstance(params, Mapping):
        return ()
    found = _codex_limit(params.get("rateLimits"), now)
    by_id = params.get("rateLimitsByLimitId")
    if isinstance(by_id, Mapping):
        for limit_id, limits in list(by_id.items())[:MAX_WINDOWS]:
            if limit_id != "codex" or not found:
                found += _codex_limit(limits, now, limit_id)
    seen: set[str] = set()
    unique = [w for w in found if w is not None and not (w.name in seen or seen.add(w.name))]
    return _found(list(unique))
