"""The ``thinking`` of an Anthropic Messages body, from a canonical request's
``thinking_budget`` (an Anthropic client's own) or ``reasoning_effort`` (an
OpenAI client's, Responses ``reasoning.effort`` or Chat ``reasoning_effort``).

Anthropic wants ``budget_tokens`` of at least 1024 and below ``max_tokens``
(which counts thinking and answer together, as OpenAI's output caps do):

* an explicit budget is clamped to ``max_tokens - 1``; with ``max_tokens``
  of 1024 or less thinking is left off;
* an effort is a hint, so it never costs the answer its room: with no cap
  from the client, ``max_tokens`` becomes the budget plus the usual default;
  with a cap, thinking takes at most half of it, and is left off when that
  half is under 1024. ``none``/``minimal`` (and efforts nobody defines) mean
  no thinking, and so does a forced tool choice, which Anthropic refuses to
  combine with thinking.
"""

from __future__ import annotations

from typing import Any, Mapping

from pool.model import ChatRequest

__all__ = ["EFFORT_BUDGETS", "MIN_BUDGET", "thinking"]

MIN_BUDGET = 1024
#: reasoning effort -> Anthropic thinking budget (tokens); absent: no thinking
EFFORT_BUDGETS: Mapping[str, int] = {
    "low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768, "max": 32768,
}


def thinking(req: ChatRequest, default_max_tokens: int) -> tuple[dict[str, Any] | None, int]:
    """The body's ``thinking`` (``None``: none) and its ``max_tokens``."""
    cap = req.sampling.max_tokens
    max_tokens = cap if cap is not None else default_max_tokens
    if req.thinking_budget:
        if max_tokens <= MIN_BUDGET:
            return None, max_tokens
        return _enabled(min(max(MIN_BUDGET, req.thinking_budget), max_tokens - 1)), max_tokens
    budget = EFFORT_BUDGETS.get(req.reasoning_effort or "")
    forced = req.tool_choice is not None and req.tool_choice.mode in ("required", "named")
    if budget is None or forced:
        return None, max_tokens
    if cap is None:
        return _enabled(budget), budget + default_max_tokens
    budget = min(budget, cap // 2)
    return (_enabled(budget) if budget >= MIN_BUDGET else None), cap


def _enabled(budget: int) -> dict[str, Any]:
    return {"type": "enabled", "budget_tokens": budget}
