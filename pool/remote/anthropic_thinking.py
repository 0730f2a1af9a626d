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
  no thinking;
* budget or effort, two things Anthropic refuses to combine with thinking
  leave it off: a forced tool choice, and a last assistant turn that called a
  tool without its signed thinking first (what a Chat Completions client
  sends back: it has nowhere to keep the signature; Gemini CLI drops thought
  parts from its history);
* with thinking on, the sampling it refuses goes from a Gemini client's
  request (:func:`sampling_for_thinking`).
"""

from __future__ import annotations

from typing import Any, Mapping

from pool.model import ChatRequest, ReasoningPart, TextPart, ToolCallPart

__all__ = ["EFFORT_BUDGETS", "MIN_BUDGET", "sampling_for_thinking", "thinking"]

MIN_BUDGET = 1024
#: reasoning effort -> Anthropic thinking budget (tokens); absent: no thinking
EFFORT_BUDGETS: Mapping[str, int] = {
    "low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768, "max": 32768,
}


def thinking(req: ChatRequest, default_max_tokens: int) -> tuple[dict[str, Any] | None, int]:
    """The body's ``thinking`` (``None``: none) and its ``max_tokens``."""
    cap = req.sampling.max_tokens
    max_tokens = cap if cap is not None else default_max_tokens
    forced = req.tool_choice is not None and req.tool_choice.mode in ("required", "named")
    if forced or _unsigned_tool_turn(req):  # refused with thinking, however it was asked for
        return None, max_tokens
    if req.thinking_budget:
        if max_tokens <= MIN_BUDGET:
            return None, max_tokens
        return _enabled(min(max(MIN_BUDGET, req.thinking_budget), max_tokens - 1)), max_tokens
    budget = EFFORT_BUDGETS.get(req.reasoning_effort or "")
    if budget is None:
        return None, max_tokens
    if cap is None:
        return _enabled(budget), budget + default_max_tokens
    budget = min(budget, cap // 2)
    return (_enabled(budget) if budget >= MIN_BUDGET else None), cap


def sampling_for_thinking(body: dict[str, Any]) -> None:
    """With thinking on, Anthropic refuses ``top_k``, a ``temperature`` but 1
    and a ``top_p`` under 0.95. Gemini takes them with thinking, so a Gemini
    client sends them as a matter of course (Gemini CLI: ``topK`` 64 with a
    thinking budget): for it, thinking was asked for, and those go."""
    body.pop("top_k", None)
    if body.get("temperature", 1) != 1:
        del body["temperature"]
    if body.get("top_p", 1) < 0.95:
        del body["top_p"]


def _unsigned_tool_turn(req: ChatRequest) -> bool:
    """The last assistant message calls a tool but does not open with signed
    (or redacted) thinking, which Anthropic requires of it when thinking is on."""
    last = next((m for m in reversed(req.messages) if m.role == "assistant"), None)
    if last is None or not any(type(p) is ToolCallPart for p in last.parts):
        return False
    for part in last.parts:  # the first part that becomes a block (as build_body sends them)
        if type(part) is ReasoningPart:
            if part.signature is not None or part.redacted_data is not None:
                return False
        elif type(part) is not TextPart or part.text:
            return True
    return True


def _enabled(budget: int) -> dict[str, Any]:
    return {"type": "enabled", "budget_tokens": budget}
