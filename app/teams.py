"""Per-key policy on the request path: which models a key sees, its rate and
budget limits (refused with 429 and the headers OpenAI and Anthropic clients
read), and what an answer that ended is charged.

Cost per request: one dict lookup for a key without a policy; with one, a
cached glob match and one :meth:`LimitStore.admit` (O(1) in the memory store),
and with Redis and a ``max_in_flight``, a slot shared by the replicas
(:meth:`Teams.take_slot`: a spare reserved earlier, else one round trip).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Iterable, Sequence

from auth.limits import KeyPolicy, LimitStore, Refusal, month_number
from pool.admission import KeyLimitExceeded
from pool.errors import GatewayError, NotFound

__all__ = ["Teams", "RateLimited", "policy_from_settings", "policy_from_mapping",
           "policy_as_mapping", "model_not_found", "refusal_headers", "LISTED_MODELS"]

_BUDGET_NAMES = {"budget_day": "daily", "budget_month": "monthly"}


class RateLimited(GatewayError):
    """A key over its rpm, tpm or token budget: 429 in both dialects, with
    ``headers`` (``Retry-After`` and the rate-limit headers) on the response."""

    status = 429
    kind = "rate_limit"

    def __init__(self, message: str, *, code: str, retry_after: float,
                 headers: dict[str, str]) -> None:
        super().__init__(message, code=code, retry_after=retry_after)
        self.headers = headers


#: served models an unknown-model error names at most
LISTED_MODELS = 20


def model_not_found(model: str, served: Sequence[str] | None = None) -> NotFound:
    """The 404 for a model nobody serves (or the key may not use); ``served``,
    when given, the models the key may use, named in the message (the first
    :data:`LISTED_MODELS`, then how many more)."""
    message = f"The model '{model}' does not exist or is not served here."
    if served is not None:
        if not served:
            message += " No model is served to this API key."
        else:
            more = len(served) - LISTED_MODELS
            message += (" Models served to this API key: " + ", ".join(served[:LISTED_MODELS])
                        + (f" and {more} more (GET /v1/models lists them all)." if more > 0
                           else "."))
    return NotFound(message, param="model", code="model_not_found")


def policy_from_mapping(name: str, policy: Any) -> KeyPolicy:
    """A :class:`KeyPolicy` from a run-time key's stored JSON policy."""
    budget = policy.get("budget_tokens") or {}
    models = policy.get("models")
    return KeyPolicy(name=name, models=tuple(models) if models is not None else None,
                     max_in_flight=policy.get("max_in_flight"), rpm=policy.get("rpm"),
                     tpm=policy.get("tpm"), budget_day=budget.get("day"),
                     budget_month=budget.get("month"))


def policy_as_mapping(policy: KeyPolicy) -> dict[str, Any]:
    """The policy fields as ``GET /internal/keys`` shows them (and the store keeps them)."""
    budget = None
    if policy.budget_day is not None or policy.budget_month is not None:
        budget = {"day": policy.budget_day, "month": policy.budget_month}
    return {"models": list(policy.models) if policy.models is not None else None,
            "max_in_flight": policy.max_in_flight, "rpm": policy.rpm, "tpm": policy.tpm,
            "budget_tokens": budget}


def policy_from_settings(name: str, key: Any) -> KeyPolicy:
    """A :class:`KeyPolicy` from a ``[server.keys.<name>]`` table (or anything with its fields)."""
    budget = key.budget_tokens
    return KeyPolicy(name=name, models=tuple(key.models) if key.models is not None else None,
                     max_in_flight=key.max_in_flight, rpm=key.rpm, tpm=key.tpm,
                     budget_day=budget.day if budget is not None else None,
                     budget_month=budget.month if budget is not None else None)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _duration(seconds: float) -> str:
    """OpenAI's reset format: ``"17s"``, ``"1m0s"``."""
    whole = max(0, math.ceil(seconds))
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def refusal_headers(refusal: Refusal, now: float) -> dict[str, str]:
    """``Retry-After`` (whole seconds, and ``retry-after-ms``) and the limit headers."""
    retry = max(0.001, refusal.retry_after)
    headers = {"retry-after": str(max(1, math.ceil(retry))),
               "retry-after-ms": str(math.ceil(retry * 1000))}
    w = refusal.window
    reset_at = _iso(now + w.reset_after)
    for unit, limit, remaining in (("requests", w.rpm, w.requests_remaining),
                                   ("tokens", w.tpm, w.tokens_remaining)):
        if limit is None:
            continue
        headers[f"x-ratelimit-limit-{unit}"] = str(limit)
        headers[f"x-ratelimit-remaining-{unit}"] = str(remaining)
        headers[f"x-ratelimit-reset-{unit}"] = _duration(w.reset_after)
        headers[f"anthropic-ratelimit-{unit}-limit"] = str(limit)
        headers[f"anthropic-ratelimit-{unit}-remaining"] = str(remaining)
        headers[f"anthropic-ratelimit-{unit}-reset"] = reset_at
    return headers


def _refusal_error(key: str, refusal: Refusal, now: float) -> RateLimited:
    headers = refusal_headers(refusal, now)
    if refusal.limit in _BUDGET_NAMES:
        message = (f"The {_BUDGET_NAMES[refusal.limit]} token budget of API key '{key}' "
                   f"({refusal.budget} tokens) is used up; it resets at "
                   f"{_iso(refusal.resets_at)}.")
        return RateLimited(message, code="budget_exceeded", retry_after=refusal.retry_after,
                           headers=headers)
    per_minute = refusal.window.rpm if refusal.limit == "requests" else refusal.window.tpm
    message = (f"API key '{key}' is over its limit of {per_minute} {refusal.limit} per "
               f"minute; retry in {math.ceil(refusal.retry_after)} s.")
    return RateLimited(message, code="rate_limit_exceeded", retry_after=refusal.retry_after,
                       headers=headers)


class Teams:
    """The policies of the keys that have one, and the windows counting them."""

    def __init__(self, policies: Iterable[KeyPolicy], limits: LimitStore, *,
                 slots: Any = None, max_wait: float = 0.0) -> None:
        self.policies: dict[str, KeyPolicy] = {p.name: p for p in policies}
        self.limits = limits
        self.slots = slots  # sessions.redis_slots.RedisSlots with Redis, else None
        self.max_wait = max_wait  # how long a request waits for one of its key's slots
        self.alerts: Any = None  # app.alerts.Alerts, set by create_app

    def set_policy(self, policy: KeyPolicy) -> None:
        self.policies[policy.name] = policy

    async def drop(self, key: str) -> None:
        self.policies.pop(key, None)
        await self.limits.forget(key)

    def sees(self, key: str, model: str) -> bool:
        """Whether ``key`` may use (and list) ``model``."""
        policy = self.policies.get(key)
        return policy is None or policy.allows(model)

    async def admit(self, key: str, model: str) -> None:
        """Check the model and count one request; raise NotFound or RateLimited."""
        policy = self.policies.get(key)
        if policy is None:
            return
        if not policy.allows(model):
            raise model_not_found(model)
        if policy.limited:
            refusal = await self.limits.admit(policy)
            if refusal is not None:
                if refusal.limit in _BUDGET_NAMES and self.alerts is not None:
                    # once per budget window, however many requests it refuses
                    self.alerts.notify(
                        "key_over_budget", "key", key, "over_budget",
                        once=f"{refusal.limit}:{refusal.resets_at:.0f}", shared=True,
                        details={"budget": _BUDGET_NAMES[refusal.limit],
                                 "budget_tokens": refusal.budget,
                                 "resets_at": _iso(refusal.resets_at)})
                raise _refusal_error(key, refusal, time.time())

    async def take_slot(self, key: str, key_id: str) -> bool:
        """One of the ``max_in_flight`` slots of ``key`` (counted under its
        ``key_id``) shared by the replicas,
        waiting up to ``max_wait`` for one that a request here hands over or,
        looking again at growing intervals up to 0.25 s, one that another
        replica gave back; raise :class:`KeyLimitExceeded` after that. False
        when the key has no such limit (no slot taken, none to give back)."""
        policy = self.policies.get(key)
        limit = policy.max_in_flight if policy is not None else None
        slots = self.slots
        if limit is None or slots is None:
            return False
        if await slots.take(key_id, limit):
            return True
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + self.max_wait, 0.02
        while (left := deadline - loop.time()) > 0:
            if await slots.wait(key_id, min(pause, left)):
                return True
            pause = min(pause * 2, 0.25)
            if await slots.take(key_id, limit):
                return True
        raise KeyLimitExceeded(f"This API key already has {limit} requests in flight; "
                               "retry when one finishes.", code="rate_limit_exceeded",
                               retry_after=1.0)

    def charge(self, key: str, tokens: int) -> None:
        """Charge an answer that ended (input + output tokens) to the key's windows."""
        policy = self.policies.get(key)
        if policy is not None and policy.limited and tokens > 0:
            self.limits.charge(key, tokens)
            if self.alerts is not None and self.alerts.wants("key_near_budget"):
                self._near_budget(policy)

    def _near_budget(self, policy: KeyPolicy) -> None:
        """``key_near_budget`` once per budget window (across replicas: ``shared``),
        from the budget counters the store keeps here (with Redis: the shared
        totals it last heard, plus this replica's charges since)."""
        used = getattr(self.limits, "budget_used", None)
        if used is None:
            return
        now = time.time()
        day_used, month_used = used(policy.name)
        for limit, budget, spent, window in (
                ("budget_day", policy.budget_day, day_used, int(now // 86400)),
                ("budget_month", policy.budget_month, month_used, month_number(now))):
            if budget:
                self.alerts.notify(
                    "key_near_budget", "key", policy.name, "near_budget",
                    once=f"{limit}:{window}", percent=100.0 * spent / budget, shared=True,
                    details={"budget": _BUDGET_NAMES[limit], "budget_tokens": budget,
                             "used_tokens": spent})
