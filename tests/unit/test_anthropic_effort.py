"""A reasoning effort (OpenAI ``reasoning.effort`` / ``reasoning_effort``)
sent to an Anthropic upstream becomes a thinking budget (table-driven); with
thinking on, the sampling Anthropic refuses with it is left out of a Gemini
client's request."""

from __future__ import annotations

from typing import Any

import pytest

from pool.model import (
    ChatRequest, Message, ReasoningPart, Sampling, TextPart, Tool, ToolCallPart, ToolChoice,
    ToolResultPart,
)
from pool.remote import anthropic_messages as am

DEFAULT = am.DEFAULT_MAX_TOKENS
WEATHER = Tool("weather", "Weather by city", {"type": "object", "properties": {}})


def req(effort: str | None, max_tokens: int | None = None, *,
        turn: tuple[Any, ...] = (), **kw: Any) -> ChatRequest:
    """A request; ``turn``: the parts of an assistant turn that called a tool, answered."""
    messages = [Message("user", (TextPart("x"),))]
    if turn:
        messages += [Message("assistant", turn),
                     Message("user", (ToolResultPart("c1", (TextPart("ok"),)),))]
    return ChatRequest(model="up", messages=tuple(messages), dialect="openai_responses",
                       reasoning_effort=effort, sampling=Sampling(max_tokens=max_tokens), **kw)


CALL = ToolCallPart("c1", "weather", "{}")
SIGNED = ReasoningPart("hm", signature="SIG")


CASES = [
    # effort, client cap, other fields -> thinking budget (None: no thinking), max_tokens
    ("low", None, {}, 1024, 1024 + DEFAULT),
    ("medium", None, {}, 4096, 4096 + DEFAULT),
    ("high", None, {}, 16384, 16384 + DEFAULT),
    ("xhigh", None, {}, 32768, 32768 + DEFAULT),
    ("minimal", None, {}, None, DEFAULT),
    ("none", None, {}, None, DEFAULT),
    ("sideways", None, {}, None, DEFAULT),        # an effort nobody defines: no thinking
    (None, None, {}, None, DEFAULT),
    # the client's cap covers thinking and answer (OpenAI's meaning): half of it at most
    ("high", 10000, {}, 5000, 10000),
    ("low", 10000, {}, 1024, 10000),
    ("medium", 3000, {}, 1500, 3000),
    ("low", 2000, {}, None, 2000),                # half of it is below Anthropic's 1024
    # an explicit budget wins over the effort
    ("high", None, {"thinking_budget": 2048}, 2048, DEFAULT),
    # Anthropic refuses thinking with a forced tool: the effort (a hint) gives way
    ("high", None, {"tools": (WEATHER,), "tool_choice": ToolChoice("required")}, None, DEFAULT),
    ("high", None, {"tools": (WEATHER,), "tool_choice": ToolChoice("named", "weather")},
     None, DEFAULT),
    ("high", None, {"tools": (WEATHER,), "tool_choice": ToolChoice("auto")},
     16384, 16384 + DEFAULT),
    # a tool turn must open with its signed thinking when thinking is on
    ("high", None, {"turn": (SIGNED, CALL)}, 16384, 16384 + DEFAULT),
    ("high", None, {"turn": (TextPart(""), ReasoningPart("", redacted_data="R"), CALL)},
     16384, 16384 + DEFAULT),
    ("high", None, {"turn": (CALL,)}, None, DEFAULT),
    ("high", None, {"turn": (ReasoningPart("unsigned"), CALL)}, None, DEFAULT),
    ("high", None, {"turn": (TextPart("let me look"), SIGNED, CALL)}, None, DEFAULT),
    ("high", None, {"turn": (SIGNED, TextPart("done"))}, 16384, 16384 + DEFAULT),
    # so must an explicit budget's (Gemini CLI drops thought parts from its history)
    (None, None, {"thinking_budget": 2048, "turn": (CALL,)}, None, DEFAULT),
    (None, None, {"thinking_budget": 2048, "turn": (SIGNED, CALL)}, 2048, DEFAULT),
    (None, None, {"thinking_budget": 2048, "tools": (WEATHER,),
                  "tool_choice": ToolChoice("required")}, None, DEFAULT),
]


@pytest.mark.parametrize("effort, cap, extra, budget, max_tokens", CASES)
def test_effort_to_thinking(effort: str | None, cap: int | None, extra: dict[str, Any],
                            budget: int | None, max_tokens: int) -> None:
    body = am.build_body(req(effort, cap, **extra))
    assert body["max_tokens"] == max_tokens
    if budget is None:
        assert "thinking" not in body
    else:
        assert body["thinking"] == {"type": "enabled", "budget_tokens": budget}
        assert body["thinking"]["budget_tokens"] < body["max_tokens"]


@pytest.mark.parametrize("sampling, kept", [
    # Gemini CLI's defaults: top_k goes, temperature 1 and top_p 0.95 are taken
    (Sampling(temperature=1, top_p=0.95, top_k=64), {"temperature": 1, "top_p": 0.95}),
    (Sampling(temperature=0.2, top_p=0.5, top_k=5), {}),
])
def test_thinking_leaves_out_the_sampling_anthropic_refuses_with_it(
        sampling: Sampling, kept: dict[str, Any]) -> None:
    with_thinking = am.build_body(ChatRequest(
        model="up", messages=(Message("user", (TextPart("x"),)),), dialect="gemini",
        thinking_budget=2048, sampling=sampling))
    assert with_thinking["thinking"]["budget_tokens"] == 2048
    assert {k: with_thinking[k] for k in ("temperature", "top_p", "top_k")
            if k in with_thinking} == kept
    hi = (Message("user", (TextPart("x"),)),)
    without = am.build_body(ChatRequest(model="up", messages=hi, dialect="gemini",
                                        sampling=sampling))
    # an OpenAI client's sampling is its choice: sent as it is (the upstream's 400)
    openai = am.build_body(ChatRequest(model="up", messages=hi, dialect="openai_chat",
                                       thinking_budget=2048, sampling=sampling))
    for body in (without, openai):
        assert (body["temperature"], body["top_p"], body["top_k"]) == (
            sampling.temperature, sampling.top_p, sampling.top_k)
