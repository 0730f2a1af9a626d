"""Per-key policy (models, in-flight, rate and budget limits) and the windows
that count requests and tokens against it.

:class:`LimitStore` is the seam: :class:`MemoryLimits` keeps the windows in
this process; a Redis store (scale-out) implements the same three methods.
Every method costs O(1) whatever the number of keys: one dict lookup and a
few integer operations on the key's own counters.

Windows:

* ``rpm``/``tpm``: a fixed one-minute window per key, opened by the first
  request after the previous one closed; a refusal's ``retry_after`` is the
  time left in it.
* budgets: the UTC calendar day and month; a refusal names the budget and
  when it resets (the next UTC midnight, the first of the next month).

Requests are counted when admitted; tokens (input + output) are charged when
the answer ends (:meth:`LimitStore.charge`), so a request may finish above a
limit, and the next one is refused.
"""

from __future__ import annotations

import calendar
import functools
import time
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Callable, Mapping, Protocol

__all__ = ["KeyPolicy", "Refusal", "WindowState", "LimitStore", "MemoryLimits", "model_allowed",
           "Counters", "month_number", "WINDOW_SECONDS"]

WINDOW_SECONDS = 60.0
_DAY = 86400


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """What one API key may do; ``None`` everywhere means unlimited."""

    name: str
    models: tuple[str, ...] | None = None  # glob patterns of client-facing model names
    max_in_flight: int | None = None
    rpm: int | None = None
    tpm: int | None = None
    budget_day: int | None = None
    budget_month: int | None = None

    @property
    def limited(self) -> bool:
        """Whether the windows have anything to check for this key."""
        return (self.rpm is not None or self.tpm is not None or self.budget_day is not None
                or self.budget_month is not None)

    def allows(self, model: str) -> bool:
        return self.models is None or model_allowed(self.models, model)


@functools.lru_cache(maxsize=16384)
def model_allowed(patterns: tuple[str, ...], model: str) -> bool:
    """``model`` matches one of the glob ``patterns`` (case-sensitive)."""
    return any(fnmatchcase(model, p) for p in patterns)


@dataclass(frozen=True, slots=True)
class WindowState:
    """A key's minute window after a check, for the ``x-ratelimit-*`` headers."""

    rpm: int | None
    requests_remaining: int
    tpm: int | None
    tokens_remaining: int
    reset_after: float  # seconds until the minute window closes


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: ``limit`` is ``requests``, ``tokens``,
    ``budget_day`` or ``budget_month``; ``retry_after`` seconds from now,
    ``resets_at`` the wall-clock (Unix) time the limit resets."""

    limit: str
    retry_after: float
    resets_at: float
    window: WindowState
    budget: int | None = None  # the budget's size, for a budget refusal


class LimitStore(Protocol):
    async def admit(self, policy: KeyPolicy) -> Refusal | None:
        """Refuse, or count one request of ``policy.name`` and return None."""
        ...

    def charge(self, key: str, tokens: int) -> None:
        """Add ``tokens`` (input + output of an answer that ended) to the key's
        windows. Synchronous and never blocking: it runs as a request ends; a
        shared store queues the increment and sends it in the background."""
        ...

    async def seed(self, key: str, day_tokens: int, month_tokens: int) -> None:
        """Start today's and this month's budgets at what the ledger already has."""
        ...

    async def rebuild(self, totals: Mapping[str, tuple[int, int]]) -> None:
        """Seed every key of ``totals`` (name -> today's, this month's tokens, as
        the ledger has them); a shared store also writes back what it knew, so
        counters lost with Redis come back from the database and the replicas."""
        ...

    async def forget(self, key: str) -> None:
        """Drop a deleted key's counters."""
        ...


class Counters(Protocol):
    """A key's counters, as :meth:`MemoryLimits.refusal` reads them."""

    window_start: float
    requests: int
    tokens: int
    day: int
    day_tokens: int
    month_tokens: int


class _Counters:
    __slots__ = ("window_start", "requests", "tokens", "day", "day_tokens", "month",
                 "month_tokens")

    def __init__(self, now: float) -> None:
        self.window_start = now
        self.requests = 0
        self.tokens = 0
        self.day = int(now // _DAY)
        self.day_tokens = 0
        self.month = month_number(now)
        self.month_tokens = 0

    def roll(self, now: float) -> None:
        if now - self.window_start >= WINDOW_SECONDS:
            self.window_start = now
            self.requests = 0
            self.tokens = 0
        day = int(now // _DAY)
        if day != self.day:
            self.day = day
            self.day_tokens = 0
            month = month_number(now)
            if month != self.month:
                self.month = month
                self.month_tokens = 0


def month_number(now: float) -> int:
    """The UTC calendar month of ``now`` as ``year * 12 + month - 1``."""
    t = time.gmtime(now)
    return t.tm_year * 12 + t.tm_mon - 1


def _next_month_start(now: float) -> float:
    t = time.gmtime(now)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return float(calendar.timegm((year, month, 1, 0, 0, 0)))


class MemoryLimits:
    """:class:`LimitStore` in this process; ``clock`` is wall-clock seconds
    (budgets follow the calendar)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._keys: dict[str, _Counters] = {}

    def _counters(self, key: str, now: float) -> _Counters:
        c = self._keys.get(key)
        if c is None:
            c = self._keys[key] = _Counters(now)
        else:
            c.roll(now)
        return c

    async def admit(self, policy: KeyPolicy) -> Refusal | None:
        now = self._clock()
        c = self._counters(policy.name, now)
        refusal = self.refusal(policy, c, now)
        if refusal is None:
            c.requests += 1
        return refusal

    def refusal(self, policy: KeyPolicy, c: Counters, now: float) -> Refusal | None:
        """Why ``policy`` refuses one more request given the counters ``c``
        (rolled to ``now``), or None. Pure: a shared store that counts
        elsewhere builds its refusals here."""
        reset_after = c.window_start + WINDOW_SECONDS - now
        rpm, tpm = policy.rpm, policy.tpm
        refused = None
        if rpm is not None and c.requests >= rpm:
            refused = "requests"
        elif tpm is not None and c.tokens >= tpm:
            refused = "tokens"
        if refused is not None:
            return Refusal(refused, reset_after, now + reset_after, self._state(policy, c, reset_after))
        return self._budget_refusal(policy, c, now, reset_after)

    def over_budget(self, policy: KeyPolicy) -> Refusal | None:
        """The budget refusal of ``policy`` by this process's counters (what the
        ledger, the shared store's last answers and this replica's own charges
        say), or None: a shared store that lost its counters refuses by it."""
        if policy.budget_day is None and policy.budget_month is None:
            return None
        c = self._keys.get(policy.name)
        if c is None:
            return None
        now = self._clock()
        c.roll(now)
        return self._budget_refusal(policy, c, now, c.window_start + WINDOW_SECONDS - now)

    def _budget_refusal(self, policy: KeyPolicy, c: Counters, now: float,
                        reset_after: float) -> Refusal | None:
        budget = policy.budget_day
        if budget is not None and c.day_tokens >= budget:
            resets = float((c.day + 1) * _DAY)
            return Refusal("budget_day", resets - now, resets,
                           self._state(policy, c, reset_after), budget)
        budget = policy.budget_month
        if budget is not None and c.month_tokens >= budget:
            resets = _next_month_start(now)
            return Refusal("budget_month", resets - now, resets,
                           self._state(policy, c, reset_after), budget)
        return None

    def charge(self, key: str, tokens: int) -> None:
        if tokens <= 0:
            return
        c = self._counters(key, self._clock())
        c.tokens += tokens
        c.day_tokens += tokens
        c.month_tokens += tokens

    async def seed(self, key: str, day_tokens: int, month_tokens: int) -> None:
        self.raise_to(key, day_tokens, month_tokens)

    def raise_to(self, key: str, day_tokens: int, month_tokens: int) -> None:
        """Today's and this month's tokens are at least these (never lowered)."""
        c = self._counters(key, self._clock())
        c.day_tokens = max(c.day_tokens, day_tokens)
        c.month_tokens = max(c.month_tokens, month_tokens)

    def budget_used(self, key: str) -> tuple[int, int]:
        """Today's and this month's tokens of ``key`` as counted here."""
        c = self._keys.get(key)
        if c is None:
            return 0, 0
        c.roll(self._clock())
        return c.day_tokens, c.month_tokens

    async def rebuild(self, totals: Mapping[str, tuple[int, int]]) -> None:
        for key, (day_tokens, month_tokens) in totals.items():
            self.raise_to(key, day_tokens, month_tokens)

    async def forget(self, key: str) -> None:
        self._keys.pop(key, None)

    @staticmethod
    def _state(policy: KeyPolicy, c: Counters, reset_after: float) -> WindowState:
        rpm, tpm = policy.rpm, policy.tpm
        return WindowState(rpm, max(0, rpm - c.requests) if rpm is not None else 0,
                           tpm, max(0, tpm - c.tokens) if tpm is not None else 0,
                           max(0.0, reset_after))
