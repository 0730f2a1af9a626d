"""An encoder's ``feed_batch`` (the events of one upstream read at once) writes
exactly what ``feed`` of each event writes, however the events are batched."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.dialects import anthropic_messages, openai_responses
from pool.errors import UpstreamUnavailable
from pool.model import (
    ExecutedTool, Finish, ReasoningDelta, ReasoningEnd, Start, TextDelta, ToolCallDelta,
    ToolCallEnd, ToolCallStart, Usage,
)

ANTHROPIC = anthropic_messages.decode(
    {"model": "m", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    {})
RESPONSES = openai_responses.decode({"model": "m", "stream": True, "input": "hi"}, {})
DIALECTS = [(anthropic_messages, ANTHROPIC), (openai_responses, RESPONSES)]

EVENTS: list[Any] = [
    Start("up-1", "up"), Usage(input_tokens=9),
    TextDelta("Hel"), TextDelta(""), TextDelta('lo "there"'),
    ReasoningDelta("hmm"), ReasoningDelta(""), ReasoningEnd(signature="sig"),
    TextDelta("after thinking"), TextDelta(" \u00e9\U0001F600"),
    ToolCallStart(0, "call_a", "weather"), ToolCallDelta(0, '{"city":'), TextDelta("between"),
    ToolCallDelta(0, '"Paris"}'), ToolCallEnd(0),
    ExecutedTool("x1", "ls", "{}", "a.txt"),
    TextDelta("tail"), TextDelta(" end"),
    Finish("stop"), Usage(output_tokens=12), TextDelta("after finish"),
]


def _encoder(dialect: Any, request: Any) -> Any:
    return dialect.StreamEncoder(request, response_id="resp_1", created=1, model="m")


def _one_by_one(dialect: Any, request: Any) -> tuple[bytes, Any]:
    enc = _encoder(dialect, request)
    return b"".join(enc.feed(e) for e in EVENTS) + enc.close(), enc


def _batched(dialect: Any, request: Any, cuts: list[int]) -> tuple[bytes, Any]:
    enc = _encoder(dialect, request)
    points = [0, *sorted(set(cuts)), len(EVENTS)]
    out = b"".join(enc.feed_batch(EVENTS[a:b]) for a, b in zip(points, points[1:]))
    return out + enc.close(), enc


@pytest.mark.parametrize("dialect, request_", DIALECTS, ids=["anthropic", "responses"])
def test_feed_batch_of_everything_at_once_or_in_pairs(dialect, request_):
    expected, ref = _one_by_one(dialect, request_)
    assert b"text_delta" in expected or b"output_text.delta" in expected
    for cuts in ([], list(range(0, len(EVENTS), 2)), list(range(1, len(EVENTS)))):
        got, enc = _batched(dialect, request_, cuts)
        assert got == expected
        if dialect is openai_responses:
            assert enc.response() == ref.response()  # the stored response folds the same


@pytest.mark.parametrize("dialect, request_", DIALECTS, ids=["anthropic", "responses"])
@given(cuts=st.lists(st.integers(min_value=1, max_value=len(EVENTS) - 1), max_size=6))
def test_feed_batch_split_anywhere(dialect, request_, cuts):
    assert _batched(dialect, request_, cuts)[0] == _one_by_one(dialect, request_)[0]


@pytest.mark.parametrize("dialect, request_", DIALECTS, ids=["anthropic", "responses"])
def test_nothing_is_written_after_a_failure(dialect, request_):
    enc = _encoder(dialect, request_)
    enc.feed_batch(EVENTS[:4])
    enc.fail(UpstreamUnavailable("gone"))
    assert enc.feed_batch(EVENTS[4:6]) == b""
