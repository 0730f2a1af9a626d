"""New conversations by what is left of an account's quota.

Only ``cli`` workers carry a quota (``worker.quota``, a
:class:`~pool.quota.AccountQuota`); the gateway asks this module only when a
model's eligible workers include one, so pools of remote and local workers
never pay for it. Two rules, both about *new* placements — a conversation
already held by an account stays there, whatever its quota says:

* **reserve** (:meth:`QuotaRouting.open_to_new`): an account whose headroom
  (the left percent of its tightest window) is below its ``quota_reserve``
  takes no new conversation. When no account of the model is open, the
  request is refused with :class:`QuotaReserveReached` (a 429 / 529 with a
  ``Retry-After`` until the earliest account is back above its reserve).
* **headroom** (:meth:`QuotaRouting.roomiest`): among the free accounts, the
  ones with the most headroom (compared in whole percents) are handed to the
  model's routing policy, which breaks the tie as it always does (load, then
  rendezvous hashing or round robin).

An account whose quota is unknown (nothing reported yet, or a worker without
quota) ranks as a full one and is never below a reserve: an account must take
conversations to report anything, and the CLIs report little while an account
is far from its limits (Claude Code's ``rate_limit_event`` comes when the
status changes). A window past its reset counts as full too.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .errors import Overloaded
from .quota import AccountQuota
from .worker import Worker

__all__ = ["QuotaRouting", "QuotaReserveReached", "headroom_of", "reserve_of"]

#: Retry-After when no account below its reserve says when its window resets
UNKNOWN_RESET = 60.0


class QuotaReserveReached(Overloaded):
    """Every account of the model is below its ``quota_reserve``: a new
    conversation has nowhere to go until a window resets."""


def headroom_of(worker: Worker, now: float) -> float | None:
    """The left percent of ``worker``'s tightest window; ``None``: unknown.
    Rounded: a vendor's fraction times 100 lands a hair off (0.55 → 44.99…)."""
    quota: AccountQuota | None = getattr(worker, "quota", None)
    left = None if quota is None else quota.headroom(now)
    return None if left is None else round(left, 6)


def reserve_of(worker: Worker, model: str, reserves: Mapping[str, float]) -> float:
    """``worker``'s own ``quota_reserve`` when set, else its model's, else 0."""
    own = getattr(getattr(worker, "cli_spec", None), "quota_reserve", None)
    return own if own is not None else reserves.get(model, 0.0)


@dataclass(frozen=True, slots=True)
class QuotaRouting:
    """``reserves``: model → percent (``[routing.quota_reserve]``);
    ``by_headroom``: rank new conversations by headroom (``routing.quota_routing``;
    off, the policy alone chooses and only the reserves apply)."""

    reserves: Mapping[str, float] = field(default_factory=dict)
    by_headroom: bool = True

    def open_to_new(self, workers: Sequence[Worker], model: str, keep: str | None,
                    now: float | None = None) -> Sequence[Worker]:
        """``workers`` less those below their reserve — except ``keep``, the
        account already holding this conversation. Raises
        :class:`QuotaReserveReached` when that leaves none."""
        now = time.time() if now is None else now
        closed: list[tuple[Worker, float]] = []
        for worker in workers:
            if worker.name == keep:
                continue
            reserve = reserve_of(worker, model, self.reserves)
            left = headroom_of(worker, now) if reserve > 0 else None
            if left is not None and left < reserve:
                closed.append((worker, reserve))
        if not closed:
            return workers
        if len(closed) == len(workers):
            raise self._refusal(model, closed, now)
        shut = {w.name for w, _ in closed}
        return [w for w in workers if w.name not in shut]

    def roomiest(self, free: Sequence[Worker], now: float | None = None) -> Sequence[Worker]:
        """The free accounts with the most headroom (whole percents; unknown
        counts as full), for the policy to choose among."""
        if not self.by_headroom or len(free) < 2:
            return free
        now = time.time() if now is None else now
        scores = [_score(headroom_of(w, now)) for w in free]
        best = max(scores)
        if best == min(scores):
            return free
        return [w for w, s in zip(free, scores) if s == best]

    @staticmethod
    def _refusal(model: str, closed: list[tuple[Worker, float]],
                 now: float) -> QuotaReserveReached:
        backs = [_back_at(w, reserve, now) for w, reserve in closed]
        known = [b for b in backs if b is not None]
        retry = max(1.0, min(known) - now) if known else UNKNOWN_RESET
        return QuotaReserveReached(
            f"Every account serving '{model}' is below its quota_reserve (the share of its "
            "usage window kept for the conversations it already holds); a new conversation "
            "can start when a window resets.", code="rate_limited", retry_after=math.ceil(retry))


def _score(left: float | None) -> int:
    return 100 if left is None else math.floor(left)


def _back_at(worker: Worker, reserve: float, now: float) -> float | None:
    """When every window of ``worker`` that is below ``reserve`` has reset."""
    quota: AccountQuota | None = getattr(worker, "quota", None)
    if quota is None:
        return None
    low = [w for w in quota.windows if w.current(now) and round(w.left_percent(now), 6) < reserve]
    if not low or any(w.resets_at is None for w in low):
        return None
    return max(w.resets_at for w in low if w.resets_at is not None)
