"""A replica's lease on one key's shared rate window: requests it may admit
without a Redis round trip.

The Redis limit script counts a request before it is served, so admitting
it needs Redis's word. Asking once per request costs a round trip on every
request's path; instead a replica reserves a *lease* of ``n`` requests in one
script call (counted in the shared window at once, so the other replicas see
them as taken) and admits the next ``n - 1`` requests of that key from it
locally. A lease is refreshed in the background before it runs out, so a busy
key's requests wait for Redis only when its minute window opens.

What that costs in exactness, and the bounds that keep it small:

* **rpm never goes over**: leases are reserved atomically from the shared
  window. A refusal may come early by the leased requests other replicas have
  not used yet; a lease is at most 1/``SHARE`` of the requests left when it was
  taken (so near the limit it is one request: no lease at all), and what is
  left of it goes back to Redis when it has not been used for ``LIFETIME``.
* **tpm and budgets** are checked against the counters Redis returned with
  the lease, plus this replica's own charges: another replica's tokens are
  seen at most ``LIFETIME`` seconds late (a busy lease is refreshed every
  ``LIFETIME / 2``). Past a token limit, a replica may therefore admit at most
  the rest of its lease, within ``LIFETIME``; a lease is sized to be expected
  to use at most 1/``SHARE`` of the tokens left (by the key's average tokens per
  request as this replica saw them), and is one request until that average is
  known. Tokens are charged when answers end in any case, so a key's last
  requests always may finish above its tpm.

Sans-IO: :class:`Lease` is bookkeeping; ``sessions.redis_limits`` talks to Redis.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["Lease", "LIFETIME", "SHARE"]

#: a lease holds about this many seconds of the key's traffic on this replica
HORIZON = 0.5
MAX_SIZE = 512
#: a lease takes at most 1/SHARE of what is left of any of the key's limits
SHARE = 16
#: seconds a lease (and the shared counters it carries) may be used; refreshed at half
LIFETIME = 1.0
_DAY = 86400


class Lease:
    """Requests of one key this replica may admit locally, and what Redis
    last said of the key's windows."""

    __slots__ = ("policy", "window_raw", "window_start", "day", "left", "size", "requests",
                 "tokens", "day_tokens", "month_tokens", "granted_at", "expires", "refreshing",
                 "refused",
                 "timer", "rate", "counted", "rate_since", "seen_requests", "seen_tokens")

    def __init__(self, policy: Any, now: float) -> None:
        self.policy = policy
        self.window_raw = ""   # the window's start as Redis stores it (gives leases back)
        self.window_start = now
        self.day = int(now // _DAY)
        self.left = 0          # leased requests not used yet
        self.size = 0          # the last grant
        self.requests = self.tokens = self.day_tokens = self.month_tokens = 0
        self.granted_at = self.expires = now
        self.refreshing: Any = None  # the task asking Redis for more, while it runs
        self.refused: list[Any] | None = None  # the last reply, when Redis refused
        self.timer: Any = None  # the loop's handle that gives an idle lease back
        self.rate = 0.0        # admissions per second here (smoothed)
        self.counted = 0       # admissions since rate_since
        self.rate_since = now
        self.seen_requests = self.seen_tokens = 0  # for tokens per request

    def take(self, policy: Any, now: float, window: float) -> bool:
        """Admit one request from the lease, if it holds one and its counters allow it."""
        if (self.left <= 0 or policy is not self.policy or now >= self.expires
                or now - self.window_start >= window or int(now // _DAY) != self.day):
            return False
        if ((policy.tpm is not None and self.tokens >= policy.tpm)
                or (policy.budget_day is not None and self.day_tokens >= policy.budget_day)
                or (policy.budget_month is not None and self.month_tokens >= policy.budget_month)):
            return False  # Redis decides, and words the refusal
        self.left -= 1
        self.counted += 1
        self.seen_requests += 1
        return True

    def stale(self, now: float) -> bool:
        """Time to refresh in the background: half used, or half its lifetime gone."""
        return self.left * 2 <= self.size or now >= self.granted_at + LIFETIME / 2

    def want(self, policy: Any, now: float) -> int:
        """How many requests of ``policy``'s key to ask Redis for (at least 1)."""
        elapsed = now - self.rate_since
        if elapsed > 0.005:
            rate = self.counted / elapsed
            self.rate = rate if self.rate == 0 else (self.rate + rate) / 2
            self.counted, self.rate_since = 0, now
        size = min(MAX_SIZE, math.ceil(self.rate * HORIZON))
        if policy.rpm is not None:
            size = min(size, (policy.rpm - self.requests) // SHARE)
        token_limits = ((policy.tpm, self.tokens), (policy.budget_day, self.day_tokens),
                        (policy.budget_month, self.month_tokens))
        if any(limit is not None for limit, _ in token_limits):
            if self.seen_tokens <= 0:
                return 1
            per_request = self.seen_tokens / max(1, self.seen_requests)
            for limit, used in token_limits:
                if limit is not None:
                    size = min(size, int((limit - used) / (SHARE * per_request)))
        return max(1, size)

    def granted(self, policy: Any, reply: list[Any], now: float) -> None:
        """Take in a script reply: the key's counters, and ``reply[7]`` requests granted."""
        raw = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        if raw != self.window_raw:
            self.left = 0  # a new window: what was leased in the old one is void
            self.window_raw, self.window_start = raw, float(raw)
        self.requests, self.tokens, self.day, self.day_tokens, self.month_tokens = (
            int(x) for x in reply[2:7])
        self.size = int(reply[7])
        self.left += self.size
        self.refused = reply if reply[0] else None
        self.policy = policy
        self.granted_at, self.expires = now, now + LIFETIME

    def charged(self, tokens: int) -> None:
        self.tokens += tokens
        self.day_tokens += tokens
        self.month_tokens += tokens
        self.seen_tokens += tokens
