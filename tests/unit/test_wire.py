"""The worker protocol codec: canonical data ↔ JSON, frames split anywhere, errors."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from pool import errors, wire
from pool.model import (ChatRequest, Finish, ImagePart, Logprobs, Message, ReasoningDelta,
                        ReasoningEnd, ReasoningPart, ResponseFormat, Sampling, Start, TextDelta,
                        TextPart, TokenLogprob, Tool, ToolCallDelta, ToolCallEnd, ToolCallPart,
                        ToolCallStart, ToolChoice, ToolResultPart, Usage)

RICH = ChatRequest(
    model="m", dialect="anthropic", stream=True,
    messages=(
        Message("system", (TextPart("be brief"),)),
        Message("user", (TextPart("look"), ImagePart(data="aGk=", media_type="image/png")),
                name="ann"),
        Message("assistant", (ReasoningPart("hmm", signature="c2ln"),
                              ToolCallPart("call_1", "get", '{"a": [1, 2]}', kind="custom"))),
        Message("user", (ToolResultPart("call_1", (TextPart("42"),), is_error=True),)),
    ),
    tools=(Tool("get", "fetch", {"type": "object", "_t": "not a tag", "enum": [1, 2]},
                strict=True),),
    tool_choice=ToolChoice("named", "get", parallel=False),
    sampling=Sampling(max_tokens=5, temperature=0.0, stop=("x", "y"), seed=7),
    response_format=ResponseFormat("json_schema", {"type": "object"}, "s", True),
    logprobs=True, top_logprobs=3, thinking_budget=1024, session_id="s1",
    metadata={"user_id": "u"}, raw={"model": "m", "messages": [], "_t": "raw"},
    passthrough_headers={"anthropic-beta": "x"},
)

EVENTS = [
    Start("id1", "m"), Start(), TextDelta("hé"), ReasoningDelta("r"),
    ReasoningEnd(signature="sig"), ReasoningEnd(redacted_data="zz"),
    ToolCallStart(0, "c", "f", kind="custom"), ToolCallDelta(0, '{"'), ToolCallEnd(0),
    Logprobs((TokenLogprob("a", -0.5, id=3, bytes=(97,), top=(("a", -0.5), ("b", -1.0))),)),
    Usage(input_tokens=1, output_tokens=2, cached_tokens=0), Finish("stop_sequence", "x"),
]


def through_json(data: Any) -> Any:
    return orjson.loads(orjson.dumps(data))


def test_request_round_trip() -> None:
    back = wire.request_from_dict(through_json(wire.request_to_dict(RICH)))
    assert back == RICH
    assert back.raw == {"model": "m", "messages": [], "_t": "raw"}  # opaque, lists stay lists
    assert back.tools[0].parameters == {"type": "object", "_t": "not a tag", "enum": [1, 2]}


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_event_round_trip(event: Any) -> None:
    assert wire.event_from_dict(through_json(wire.event_to_dict(event))) == event


def test_not_a_request_is_refused() -> None:
    with pytest.raises(ValueError):
        wire.request_from_dict(wire.event_to_dict(TextDelta("x")))


def test_frames_split_at_every_byte() -> None:
    msgs = [{"op": "event", "id": i, "event": wire.event_to_dict(e)} for i, e in enumerate(EVENTS)]
    stream = b"".join(wire.frame(m) for m in msgs)
    for cut in range(len(stream) + 1):
        decoder = wire.FrameDecoder()
        assert decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) == msgs
    decoder = wire.FrameDecoder()
    assert [m for b in stream for m in decoder.feed(bytes([b]))] == msgs


def test_oversized_frame_is_refused() -> None:
    with pytest.raises(ValueError):
        wire.FrameDecoder().feed((wire.MAX_FRAME + 1).to_bytes(4, "big"))


@pytest.mark.parametrize("exc", [
    errors.BadRequest("bad", param="n"),
    errors.UpstreamError("slow down", status=429, kind="rate_limit", code="rl", retry_after=3),
    errors.UpstreamError("nope", status=400),
    errors.Overloaded("full", status=429, code="rate_limit_exceeded"),
    errors.Overloaded("full", retry_after=1),
    errors.UpstreamUnavailable("down"),
    errors.UpstreamTimeout("slow"),
])
def test_errors_round_trip(exc: errors.GatewayError) -> None:
    back = wire.error_from_dict(through_json(wire.error_to_dict(exc)))
    assert type(back) is type(exc)
    assert (back.kind, back.status, back.message, back.param, back.code, back.retry_after) == \
        (exc.kind, exc.status, exc.message, exc.param, exc.code, exc.retry_after)


@pytest.mark.parametrize("data, cls, status", [
    ({"error": "WorkerCrashed", "kind": "upstream", "message": "x"},
     errors.UpstreamUnavailable, 502),  # a child cannot claim a retry-safe crash
    ({"kind": "weird", "status": 418, "message": "x"}, errors.UpstreamError, 418),
    ({"kind": "weird"}, errors.UpstreamUnavailable, 502),
    ({}, errors.UpstreamUnavailable, 502),
])
def test_unknown_errors_degrade_safely(data: dict[str, Any], cls: type, status: int) -> None:
    back = wire.error_from_dict(data)
    assert type(back) is cls and back.status == status
