"""The input-token estimate behind ``/v1/messages/count_tokens``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pool.model import (
    ChatRequest, ImagePart, Message, ReasoningPart, TextPart, Tool, ToolCallPart, ToolResultPart,
)
from pool.tokens import IMAGE_TOKENS, LOW_DETAIL_IMAGE_TOKENS, estimate_tokens


def request(*messages: Message, tools: tuple[Tool, ...] = ()) -> ChatRequest:
    return ChatRequest(model="m", messages=messages, dialect="anthropic", tools=tools)


def user(*parts: Any) -> Message:
    return Message("user", tuple(TextPart(p) if isinstance(p, str) else p for p in parts))


WEATHER = Tool("get_weather", "Current weather for a city.",
               {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]})


def test_a_small_request_has_the_documented_count() -> None:
    # 3 per request + 4 per message + ceil(11 bytes / 4)
    assert estimate_tokens(request(user("hello world"))) == 3 + 4 + 3


def test_deterministic() -> None:
    req = request(Message("system", (TextPart("be brief"),)), user("hi"), tools=(WEATHER,))
    assert estimate_tokens(req) == estimate_tokens(req)


def test_bytes_not_characters_are_counted() -> None:
    ascii_text, accented = "e" * 40, "é" * 40  # é is 2 bytes
    assert (estimate_tokens(request(user(accented))) - estimate_tokens(request(user(ascii_text)))
            == 10)


@given(st.text(max_size=200), st.text(min_size=1, max_size=200))
def test_monotonic_in_text(base: str, more: str) -> None:
    assert estimate_tokens(request(user(base + more))) >= estimate_tokens(request(user(base)))
    assert estimate_tokens(request(user(base), user(more))) > estimate_tokens(request(user(base)))


def test_longer_text_costs_more() -> None:
    counts = [estimate_tokens(request(user("word " * n))) for n in (0, 10, 100, 1000)]
    assert counts == sorted(counts) and len(set(counts)) == 4
    assert counts[-1] - counts[0] == 5000 // 4


def test_system_messages_are_counted() -> None:
    plain = estimate_tokens(request(user("hi")))
    with_system = estimate_tokens(request(Message("system", (TextPart("x" * 400),)), user("hi")))
    assert with_system == plain + 4 + 100


def test_tools_are_counted() -> None:
    plain = estimate_tokens(request(user("hi")))
    one = estimate_tokens(request(user("hi"), tools=(WEATHER,)))
    two = estimate_tokens(request(user("hi"), tools=(WEATHER, Tool("noop"))))
    assert one - plain > 300  # the tool-use preamble plus the definition
    assert two > one
    bigger = Tool(WEATHER.name, WEATHER.description,
                  {**WEATHER.parameters, "description": "d" * 400})  # type: ignore[dict-item]
    assert estimate_tokens(request(user("hi"), tools=(bigger,))) >= one + 100


@pytest.mark.parametrize(("image", "cost"), [
    (ImagePart(url="https://example.com/a.png"), IMAGE_TOKENS),
    (ImagePart(data="iVBORw0KGgo=" * 1000, media_type="image/png"), IMAGE_TOKENS),
    (ImagePart(url="https://example.com/a.png", detail="low"), LOW_DETAIL_IMAGE_TOKENS),
])
def test_images_cost_a_fixed_amount(image: ImagePart, cost: int) -> None:
    plain = estimate_tokens(request(user("look")))
    assert estimate_tokens(request(user("look", image))) == plain + cost
    # base64 data is not counted as text
    assert estimate_tokens(request(user("look", image, image))) == plain + 2 * cost


def test_tool_calls_results_and_reasoning_are_counted() -> None:
    base = request(user("weather?"))
    call = Message("assistant", (ReasoningPart("let me check", signature="s" * 400),
                                 ToolCallPart("toolu_1", "get_weather", '{"city": "Paris"}')))
    result = user(ToolResultPart("toolu_1", (TextPart("sunny, 21C"),
                                             ImagePart(url="https://x/map.png"))))
    with_call = estimate_tokens(request(*base.messages, call))
    with_result = estimate_tokens(request(*base.messages, call, result))
    assert with_call > estimate_tokens(base)
    assert with_result - with_call > IMAGE_TOKENS
    # the opaque signature is not model text
    unsigned = Message("assistant", (ReasoningPart("let me check"), call.parts[1]))
    assert estimate_tokens(request(*base.messages, unsigned)) == with_call
