"""An account's quota: the vendor's usage windows as a cli worker last saw
them (or as poolgate counted them, for CLIs that report nothing), and what
follows from them — headroom, the tightest window, a forecast of when the
account runs dry at its current rate.

Pure and frozen: the cli host builds an :class:`AccountQuota` from the
:class:`QuotaWindow` reports its decoders emit, the status frame carries
:meth:`AccountQuota.to_json`, the gateway side rebuilds it with
:meth:`AccountQuota.from_json`; routing, ``/internal/accounts``, ``/metrics``
and alerts only read it.

Units: ``used_percent`` is 0–100 (Claude Code's fractions are scaled by the
decoder), times are Unix seconds, window lengths seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

__all__ = ["QuotaWindow", "AccountQuota", "VENDOR", "COUNTED"]

VENDOR = "vendor"    # the vendor's own numbers (headers, events, usage calls)
COUNTED = "counted"  # poolgate's count of tokens against a configured window

#: a forecast needs at least this much of the window behind it (seconds), so
#: one early turn does not predict an empty account
_MIN_ELAPSED = 60.0


@dataclass(frozen=True, slots=True)
class QuotaWindow:
    """One usage window of one account, as last reported.

    ``name``: the vendor's name for it (``five_hour``, ``seven_day``,
    ``seven_day_opus``, Codex's ``primary`` / ``secondary``, or a counted
    window's configured name). ``prev_percent`` / ``prev_seen_at``: the sample
    before this one in the same window (same reset), for the recent rate.
    """

    name: str
    used_percent: float
    resets_at: float | None = None
    window_seconds: float | None = None
    source: str = VENDOR
    seen_at: float = 0.0
    prev_percent: float | None = None
    prev_seen_at: float | None = None

    def current(self, now: float) -> bool:
        """Whether the numbers still hold (the window has not reset since)."""
        return self.resets_at is None or now < self.resets_at

    def left_percent(self, now: float) -> float:
        """What is left of the window (100 once it has reset)."""
        if not self.current(now):
            return 100.0
        return max(0.0, 100.0 - self.used_percent)

    def rate(self) -> float | None:
        """Percent per second at the current rate: the recent slope when two
        samples of this window are far enough apart, else the average since
        the window began; ``None`` when nothing says."""
        if (self.prev_percent is not None and self.prev_seen_at is not None
                and self.seen_at - self.prev_seen_at >= _MIN_ELAPSED
                and self.used_percent >= self.prev_percent):
            return (self.used_percent - self.prev_percent) / (self.seen_at - self.prev_seen_at)
        if self.resets_at is None or not self.window_seconds:
            return None
        elapsed = self.seen_at - (self.resets_at - self.window_seconds)
        if elapsed < _MIN_ELAPSED or self.used_percent <= 0:
            return None
        return self.used_percent / elapsed

    def forecast(self, now: float) -> float | None:
        """When the window is used up at the current rate (Unix seconds), or
        ``None`` when it will not be before it resets (or nothing says)."""
        if not self.current(now):
            return None
        if self.used_percent >= 100:
            return self.seen_at
        rate = self.rate()
        if not rate or rate <= 0:
            return None
        empty_at = self.seen_at + (100.0 - self.used_percent) / rate
        if self.resets_at is not None and empty_at >= self.resets_at:
            return None
        return empty_at

    def after(self, newer: QuotaWindow) -> QuotaWindow:
        """``newer`` with this sample kept as its previous one when both are of
        the same window (same reset); a reset starts the history afresh."""
        if newer.resets_at is not None and self.resets_at is not None \
                and abs(newer.resets_at - self.resets_at) > 60:
            return newer
        if newer.seen_at <= self.seen_at:
            return newer
        return replace(newer, prev_percent=self.used_percent, prev_seen_at=self.seen_at)

    def to_json(self, now: float) -> dict[str, Any]:
        return {"window": self.name, "used_percent": round(self.used_percent, 2),
                "left_percent": round(self.left_percent(now), 2),
                "resets_at": self.resets_at, "window_seconds": self.window_seconds,
                "source": self.source, "seen_at": self.seen_at,
                "forecast_empty_at": self.forecast(now),
                "prev_percent": self.prev_percent, "prev_seen_at": self.prev_seen_at}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> QuotaWindow:
        def num(key: str) -> float | None:
            value = obj.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
                else None
        return cls(name=str(obj.get("window") or "unknown"),
                   used_percent=min(100.0, max(0.0, num("used_percent") or 0.0)),
                   resets_at=num("resets_at"), window_seconds=num("window_seconds"),
                   source=COUNTED if obj.get("source") == COUNTED else VENDOR,
                   seen_at=num("seen_at") or 0.0, prev_percent=num("prev_percent"),
                   prev_seen_at=num("prev_seen_at"))


@dataclass(frozen=True, slots=True)
class AccountQuota:
    """All the windows known for one account, by name."""

    windows: tuple[QuotaWindow, ...] = ()

    def merged(self, report: Iterable[QuotaWindow]) -> AccountQuota:
        """These windows with ``report``'s replacing those of the same name
        (each keeping its previous sample for the rate)."""
        by_name = {w.name: w for w in self.windows}
        for window in report:
            old = by_name.get(window.name)
            by_name[window.name] = old.after(window) if old is not None else window
        return AccountQuota(tuple(by_name.values()))

    def tightest(self, now: float) -> QuotaWindow | None:
        """The current window with the least left (ties: the one that resets last)."""
        live = [w for w in self.windows if w.current(now)]
        if not live:
            return None
        return min(live, key=lambda w: (w.left_percent(now), -(w.resets_at or 0)))

    def headroom(self, now: float) -> float | None:
        """Percent left in the tightest window; ``None`` when no window is known
        (routing then treats the account as unknown, not as empty)."""
        if not self.windows:
            return None
        tight = self.tightest(now)
        return 100.0 if tight is None else tight.left_percent(now)

    def forecast(self, now: float) -> float | None:
        """The earliest time any window is used up at its current rate."""
        times = [t for w in self.windows if (t := w.forecast(now)) is not None]
        return min(times) if times else None

    def source(self) -> str | None:
        """``vendor`` when any window is the vendor's own, else ``counted``."""
        if not self.windows:
            return None
        return VENDOR if any(w.source == VENDOR for w in self.windows) else COUNTED

    def to_json(self, now: float) -> list[dict[str, Any]]:
        return [w.to_json(now) for w in self.windows]

    @classmethod
    def from_json(cls, items: Any) -> AccountQuota:
        if not isinstance(items, list):
            return cls()
        return cls(tuple(QuotaWindow.from_json(i) for i in items if isinstance(i, Mapping)))
