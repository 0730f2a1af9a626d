"""An account's subscription quota as the vendors' upstreams announce it: the
response headers Claude Code (``anthropic-ratelimit-unified-*``) and Codex
(``x-codex-primary-*`` / ``x-codex-secondary-*``) read, as their real
servers send them. A fake upstream keeps one :class:`FakeQuota` per
credential (``fake.quota[token] = FakeQuota(five_hour=97, seven_day=40)``),
adds its headers to every answer for that credential, and answers with the
vendor's 429 once a window is spent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["FakeQuota"]


def _later(seconds: float) -> float:
    return float(int(time.time() + seconds))


@dataclass
class FakeQuota:
    """Used percent (0–100) of the 5-hour and the weekly window, and when each
    resets (Unix seconds; default: 3 h and 4 days away)."""

    five_hour: float = 0.0
    seven_day: float = 0.0
    five_hour_reset: float = field(default_factory=lambda: _later(3 * 3600))
    seven_day_reset: float = field(default_factory=lambda: _later(4 * 86400))

    @property
    def spent(self) -> bool:
        return self.five_hour >= 100 or self.seven_day >= 100

    def anthropic_headers(self) -> dict[str, str]:
        """What api.anthropic.com sends a subscription's ``/v1/messages`` answer."""
        five, seven = self.five_hour / 100, self.seven_day / 100
        claim, reset = (("five_hour", self.five_hour_reset) if five >= seven
                        else ("seven_day", self.seven_day_reset))
        p = "anthropic-ratelimit-unified-"
        return {f"{p}status": "rejected" if self.spent else "allowed",
                f"{p}reset": str(int(reset)), f"{p}representative-claim": claim,
                f"{p}fallback-percentage": "0.5",
                f"{p}5h-utilization": f"{five:g}", f"{p}5h-reset": str(int(self.five_hour_reset)),
                f"{p}5h-status": "rejected" if five >= 1 else "allowed",
                f"{p}7d-utilization": f"{seven:g}",
                f"{p}7d-reset": str(int(self.seven_day_reset)),
                f"{p}7d-status": "rejected" if seven >= 1 else "allowed",
                f"{p}overage-status": "rejected",
                f"{p}overage-disabled-reason": "org_level_disabled"}

    def codex_headers(self) -> dict[str, str]:
        """What the ChatGPT backend sends with a Responses answer."""
        return {"x-codex-primary-used-percent": f"{self.five_hour:g}",
                "x-codex-primary-window-minutes": "300",
                "x-codex-primary-reset-at": str(int(self.five_hour_reset)),
                "x-codex-secondary-used-percent": f"{self.seven_day:g}",
                "x-codex-secondary-window-minutes": "10080",
                "x-codex-secondary-reset-at": str(int(self.seven_day_reset))}

    def wham_usage(self) -> dict:
        """What ``GET {chatgpt_base_url}/wham/usage`` answers a ChatGPT login."""
        now = time.time()
        return {"plan_type": "pro", "credits": None, "rate_limit": {
            "allowed": not self.spent, "limit_reached": self.spent,
            "primary_window": {"used_percent": self.five_hour, "limit_window_seconds": 18000,
                               "reset_after_seconds": int(self.five_hour_reset - now),
                               "reset_at": int(self.five_hour_reset)},
            "secondary_window": {"used_percent": self.seven_day, "limit_window_seconds": 604800,
                                 "reset_after_seconds": int(self.seven_day_reset - now),
                                 "reset_at": int(self.seven_day_reset)}}}

    def reset_at(self) -> float:
        """When the spent window resets."""
        return self.five_hour_reset if self.five_hour >= 100 else self.seven_day_reset
