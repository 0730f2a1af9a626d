"""The Gemini API upstream, sans-IO: the request body (sent on or translated)
and the answer (SSE payloads, split at every byte, or one body) as events."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from pool.accumulate import fold
from pool.errors import GatewayError
from pool.model import (
    ChatRequest, Finish, ImagePart, Message, ReasoningDelta, ReasoningEnd, ReasoningPart,
    ResponseFormat, Sampling, Start, TextDelta, TextPart, Tool, ToolCallDelta, ToolCallEnd,
    ToolCallPart, ToolCallStart, ToolChoice, ToolResultPart, Usage,
)
from pool.remote.gemini import StreamParser, body_events, build_body
from pool.remote.policy import PassPolicy
from pool.sse import SSEDecoder

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}


def request(*messages: Message, **fields: Any) -> ChatRequest:
    return ChatRequest(model="gemini-x", messages=messages, dialect="openai_chat", **fields)


def test_same_dialect_body_is_sent_on_without_unlisted_fields() -> None:
    raw = {"contents": [{"parts": [{"text": "hi"}]}], "safetySettings": [{"x": 1}],
           "cachedContent": "cachedContents/abc", "generationConfig": {"topK": 3}}
    req = ChatRequest(model="m", messages=(), dialect="gemini", raw=raw)
    body = build_body(req)
    assert body == {k: v for k, v in raw.items() if k != "cachedContent"}
    assert body is not raw
    assert build_body(req, PassPolicy(pass_fields=frozenset({"cachedContent"}))) == raw


def test_translated_body() -> None:
    req = request(
        Message("system", (TextPart("be brief"),)),
        Message("user", (TextPart("weather?"), ImagePart(data="iVBO", media_type="image/png"),
                         ImagePart(url="https://x/a.jpg"))),
        Message("assistant", (ReasoningPart("hmm", signature="anthropic-sig"),
                              ToolCallPart("call_1", "get_weather", '{"city":"Oslo"}'))),
        Message("user", (ToolResultPart("call_1", (TextPart("snow"),)),)),
        Message("user", (ToolResultPart("call_1", (TextPart("boom"),), is_error=True),)),
        tools=(Tool("get_weather", "Weather", WEATHER),),
        tool_choice=ToolChoice("named", "get_weather"),
        sampling=Sampling(max_tokens=9, temperature=0.2, top_p=0.5, top_k=4, stop=("END",),
                          seed=1),
        response_format=ResponseFormat("json_schema", schema=WEATHER),
        thinking_budget=256)
    assert build_body(req) == {
        "contents": [
            {"role": "user", "parts": [
                {"text": "weather?"}, {"inlineData": {"mimeType": "image/png", "data": "iVBO"}},
                {"fileData": {"mimeType": "image/*", "fileUri": "https://x/a.jpg"}}]},
            # another vendor's reasoning is left out: Gemini takes only its own signatures
            {"role": "model", "parts": [{"functionCall": {
                "id": "call_1", "name": "get_weather", "args": {"city": "Oslo"}}}]},
            {"role": "user", "parts": [
                {"functionResponse": {"id": "call_1", "name": "get_weather",
                                      "response": {"output": "snow"}}},
                {"functionResponse": {"id": "call_1", "name": "get_weather",
                                      "response": {"error": "boom"}}}]}],
        "systemInstruction": {"parts": [{"text": "be brief"}]},
        "tools": [{"functionDeclarations": [
            {"name": "get_weather", "description": "Weather", "parametersJsonSchema": WEATHER}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY",
                                                 "allowedFunctionNames": ["get_weather"]}},
        "generationConfig": {"maxOutputTokens": 9, "temperature": 0.2, "topP": 0.5, "topK": 4,
                             "seed": 1, "stopSequences": ["END"],
                             "responseMimeType": "application/json",
                             "responseJsonSchema": WEATHER,
                             "thinkingConfig": {"thinkingBudget": 256, "includeThoughts": True}}}


@pytest.mark.parametrize("choice,config", [
    (ToolChoice("auto"), {"mode": "AUTO"}), (ToolChoice("none"), {"mode": "NONE"}),
    (ToolChoice("required"), {"mode": "ANY"})])
def test_tool_choice(choice: ToolChoice, config: dict[str, Any]) -> None:
    body = build_body(request(Message("user", (TextPart("x"),)), tool_choice=choice))
    assert body["toolConfig"] == {"functionCallingConfig": config}


def test_effort_is_a_thinking_level() -> None:
    body = build_body(request(Message("user", (TextPart("x"),)), reasoning_effort="high"))
    assert body["generationConfig"]["thinkingConfig"] == {"thinkingLevel": "HIGH",
                                                          "includeThoughts": True}


# --- answers ------------------------------------------------------------------------------

def chunk(*parts: dict[str, Any], finish: str | None = None,
          usage: dict[str, int] | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    out: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-x",
                           "responseId": "r1"}
    if usage:
        out["usageMetadata"] = usage
    return out


USAGE = {"promptTokenCount": 10, "candidatesTokenCount": 5, "thoughtsTokenCount": 2,
         "totalTokenCount": 17, "cachedContentTokenCount": 4}
CHUNKS = [
    chunk({"text": "let me see", "thought": True, "thoughtSignature": "c2lnMQ=="}),
    chunk({"text": "It is "}),
    chunk({"text": "cold."}, {"functionCall": {"name": "f", "args": {"a": 1}},
                              "thoughtSignature": "c2lnMg=="}),
    chunk({"functionCall": {"id": "given", "name": "g"}}, finish="STOP", usage=USAGE),
]
EXPECTED = [
    Start("r1", "gemini-x"), ReasoningDelta("let me see"), ReasoningEnd(signature="c2lnMQ=="),
    TextDelta("It is "), TextDelta("cold."), ReasoningEnd(signature="c2lnMg=="),
    ToolCallStart(0, "call_0", "f"), ToolCallDelta(0, '{"a":1}'), ToolCallEnd(0),
    ToolCallStart(1, "given", "g"), ToolCallDelta(1, "{}"), ToolCallEnd(1),
    Finish("tool_calls"),
    Usage(input_tokens=10, output_tokens=7, cached_tokens=4, reasoning_tokens=2),
]


def sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks)


def parse(stream: bytes, cut: int | None = None) -> list[Any]:
    decoder, parser = SSEDecoder(), StreamParser()
    pieces = [stream] if cut is None else [stream[:cut], stream[cut:]]
    events: list[Any] = []
    for piece in pieces:
        for data in decoder.feed_data(piece):
            events += parser.feed(data)
    for data in decoder.close_data():
        events += parser.feed(data)
    assert parser.done
    return events


def test_stream_events() -> None:
    assert parse(sse(CHUNKS)) == EXPECTED


def test_stream_split_at_every_byte() -> None:
    stream = sse(CHUNKS)
    for cut in range(1, len(stream)):
        assert parse(stream, cut) == EXPECTED


def test_body_events_fold_like_the_stream() -> None:
    whole = chunk(*[p for c in CHUNKS for p in c["candidates"][0]["content"]["parts"]],
                  finish="STOP", usage=USAGE)
    assert fold(body_events(whole)).parts == fold(EXPECTED).parts


@pytest.mark.parametrize("reason,finish", [
    ("STOP", "stop"), ("MAX_TOKENS", "length"), ("SAFETY", "content_filter"),
    ("RECITATION", "content_filter"), ("OTHER", "stop")])
def test_finish_reasons(reason: str, finish: str) -> None:
    assert Finish(finish) in body_events(chunk({"text": "x"}, finish=reason))  # type: ignore[arg-type]


def test_error_in_the_stream_is_the_upstreams_error() -> None:
    parser = StreamParser()
    with pytest.raises(GatewayError) as caught:
        parser.feed('{"error": {"code": 400, "message": "bad thing", "status": "INVALID_ARGUMENT"}}')
    assert "bad thing" in caught.value.message
    assert caught.value.status == 400
