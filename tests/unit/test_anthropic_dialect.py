"""The Anthropic ``/v1/messages`` dialect: decode, JSON encode, SSE stream encode."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import anthropic
import httpx2
import orjson
import pytest

from app.dialects.anthropic_messages import (
    StreamEncoder, decode, decode_count_tokens, encode_completion,
)
from pool.accumulate import fold
from pool.errors import BadRequest, Overloaded, UpstreamUnavailable
from pool.model import (
    ChatRequest, Finish, ImagePart, Logprobs, Message, ReasoningDelta, ReasoningEnd, ReasoningPart,
    Start, TextDelta, TextPart, TokenLogprob, ToolCallDelta, ToolCallEnd, ToolCallPart,
    ToolCallStart, ToolChoice, ToolResultPart, Usage,
)
from pool.sse import SSEDecoder
from tests.support.paths import FIXTURES as _FIXTURES

FIXTURES = str(_FIXTURES)
MESSAGE_FIXTURES = sorted(glob.glob(os.path.join(FIXTURES, "*-POST-v1_messages.json")))
COUNT_FIXTURES = sorted(glob.glob(os.path.join(FIXTURES, "*-POST-v1_messages_count_tokens.json")))
MINIMAL: dict[str, Any] = {"model": "m", "max_tokens": 10,
                           "messages": [{"role": "user", "content": "hi"}]}


def body(**fields: Any) -> dict[str, Any]:
    return {**MINIMAL, **fields}


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# --- decode: every recorded client request is accepted ------------------------------------

@pytest.mark.parametrize("path", MESSAGE_FIXTURES + COUNT_FIXTURES, ids=os.path.basename)
def test_decode_recorded_requests(path: str) -> None:
    record = load(path)
    raw, headers = record["body"], record["headers"]
    fn = decode_count_tokens if "count_tokens" in path else decode
    req = fn(raw, headers)

    assert req.raw is raw
    assert req.dialect == "anthropic"
    assert req.model == raw["model"]
    assert req.stream is bool(raw.get("stream", False))
    assert req.sampling.max_tokens == raw.get("max_tokens")
    assert len(req.messages) == len(raw["messages"]) + (1 if raw.get("system") else 0)
    wire_roles = [m["role"] for m in raw["messages"]]
    assert [m.role for m in req.messages][-len(wire_roles):] == wire_roles
    expected_headers = {k: headers[k] for k in ("anthropic-version", "anthropic-beta")
                        if k in headers}
    assert dict(req.passthrough_headers) == expected_headers
    custom_tools = [t for t in raw.get("tools", []) if t.get("type") in (None, "custom")]
    assert [t.name for t in req.tools] == [t["name"] for t in custom_tools]

    wire_blocks = [b for m in raw["messages"] if isinstance(m["content"], list)
                   for b in m["content"]]
    parts = [p for m in req.messages for p in m.parts]
    for block in wire_blocks:
        if block["type"] == "thinking":
            assert any(isinstance(p, ReasoningPart) and p.signature is not None
                       and p.signature.encode() == block["signature"].encode()
                       and p.text == block["thinking"] for p in parts)
        if block["type"] == "tool_use":
            assert ToolCallPart(block["id"], block["name"],
                                orjson.dumps(block["input"]).decode()) in parts

    if "metadata" in raw:
        assert req.user == raw["metadata"]["user_id"]
        assert req.session_id == json.loads(raw["metadata"]["user_id"])["session_id"]
    if "x-claude-code-session-id" in headers:
        assert req.session_id == headers["x-claude-code-session-id"]


def test_recorded_fixtures_cover_thinking_signatures_and_tool_results() -> None:
    # guards the parametrised test above against silently checking nothing
    blocks = [b.get("type") for p in MESSAGE_FIXTURES for m in load(p)["body"]["messages"]
              if isinstance(m["content"], list) for b in m["content"]]
    roles = {m["role"] for p in MESSAGE_FIXTURES for m in load(p)["body"]["messages"]}
    assert {"thinking", "tool_use", "tool_result"} <= set(blocks) and "system" in roles


# --- decode: specific shapes ----------------------------------------------------------------

THINKING_SIG = "EqQBCkYIBxgCKkA+/==\u00e9"

DECODE_CASES = [
    pytest.param(body(system="be brief"),
                 lambda r: r.messages[0] == Message("system", (TextPart("be brief"),)),
                 id="system-string"),
    pytest.param(body(system=[{"type": "text", "text": "a"},
                              {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]),
                 lambda r: r.messages[0] == Message("system", (TextPart("a"), TextPart("b"))),
                 id="system-blocks-one-message"),
    pytest.param(body(system=""), lambda r: [m.role for m in r.messages] == ["user"],
                 id="system-empty-dropped"),
    pytest.param(body(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
        {"type": "image", "source": {"type": "file", "file_id": "f1"}},
    ]}]), lambda r: r.messages[0].parts == (ImagePart(data="AAA", media_type="image/png"),
                                            ImagePart(url="https://x/y.png")),
        id="images"),
    pytest.param(body(messages=[
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": THINKING_SIG},
            {"type": "redacted_thinking", "data": "opaque=="},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"b": 1, "a": [1, "x"]}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": [
                {"type": "text", "text": "bad"},
                {"type": "image", "source": {"type": "url", "url": "u"}},
                {"type": "search_result", "source": "s", "title": "t", "content": []}]},
            {"type": "tool_result", "tool_use_id": "t2"}]},
    ]), lambda r: r.messages == (
        Message("assistant", (ReasoningPart("hmm", signature=THINKING_SIG),
                              ReasoningPart(redacted_data="opaque=="),
                              ToolCallPart("t1", "f", '{"b":1,"a":[1,"x"]}'))),
        Message("user", (ToolResultPart("t1", (TextPart("bad"), ImagePart(url="u")), True),
                         ToolResultPart("t2", ()))),
    ), id="thinking-tools-results"),
    pytest.param(body(messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}},
        {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
        {"type": "web_search_tool_result", "tool_use_id": "s", "content": []},
        {"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}]}]),
        lambda r: r.messages[0].parts == (TextPart("q"),), id="unknown-blocks-skipped"),
    pytest.param(body(messages=[{"role": "user", "content": "a"},
                                {"role": "system", "content": "late"}]),
                 lambda r: [m.role for m in r.messages] == ["user", "system"], id="system-in-messages"),
    pytest.param(body(tools=[{"name": "f", "description": "d", "input_schema": {"type": "object"}},
                             {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
                             {"type": "custom", "name": "g", "input_schema": {}}],
                      tool_choice={"type": "any", "disable_parallel_tool_use": True}),
                 lambda r: ([t.name for t in r.tools] == ["f", "g"]
                            and r.tools[0].parameters == {"type": "object"}
                            and r.tool_choice == ToolChoice("required", None, False)),
                 id="tools-and-server-tools"),
    pytest.param(body(tool_choice={"type": "tool", "name": "f"}),
                 lambda r: r.tool_choice == ToolChoice("named", "f", None), id="tool-choice-named"),
    pytest.param(body(tool_choice={"type": "none", "disable_parallel_tool_use": False}),
                 lambda r: r.tool_choice == ToolChoice("none", None, True), id="tool-choice-none"),
    pytest.param(body(tool_choice={"type": "auto"}),
                 lambda r: r.tool_choice == ToolChoice("auto"), id="tool-choice-auto"),
    pytest.param(body(thinking={"type": "enabled", "budget_tokens": 32000}, max_tokens=8000),
                 lambda r: r.thinking_budget == 32000 and r.sampling.max_tokens == 8000,
                 id="thinking-budget-above-max-tokens"),
    pytest.param(body(thinking={"type": "adaptive"}, output_config={"effort": "low"}),
                 lambda r: r.thinking_budget is None and r.reasoning_effort == "low",
                 id="adaptive-effort"),
    pytest.param(body(output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}}),
                 lambda r: r.response_format is not None and r.response_format.schema == {"type": "object"},
                 id="output-format"),
    pytest.param(body(stop_sequences=["\n\n", "END"], temperature=0.5, top_p=1, top_k=5, stream=True),
                 lambda r: (r.sampling.stop == ("\n\n", "END") and r.sampling.temperature == 0.5
                            and r.sampling.top_p == 1 and r.sampling.top_k == 5 and r.stream),
                 id="sampling"),
    pytest.param(body(metadata={"user_id": "alice"}),
                 lambda r: r.user == "alice" and r.session_id is None, id="plain-user-id"),
    pytest.param(body(metadata={"user_id": "{not json"}),
                 lambda r: r.user == "{not json" and r.session_id is None, id="broken-json-user-id"),
    pytest.param(body(metadata={"user_id": '{"session_id": "s-1", "device_id": "d"}'}),
                 lambda r: r.session_id == "s-1", id="claude-code-user-id"),
    pytest.param(body(context_management={"edits": []}, service_tier="auto", container="c",
                      mcp_servers=[], _n_tools=0),
                 lambda r: r.raw["service_tier"] == "auto", id="unknown-fields-accepted"),
    pytest.param(body(max_tokens=5.0), lambda r: r.sampling.max_tokens == 5, id="integral-float"),
]


@pytest.mark.parametrize("raw, check", DECODE_CASES)
def test_decode_shapes(raw: dict[str, Any], check: Any) -> None:
    req = decode(raw, {})
    assert req.raw is raw
    assert check(req)


def test_decode_headers_passthrough_and_session_header() -> None:
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "a,b",
               "x-claude-code-session-id": "hdr-session", "x-api-key": "secret"}
    req = decode(body(), headers)
    assert dict(req.passthrough_headers) == {"anthropic-version": "2023-06-01",
                                             "anthropic-beta": "a,b"}
    assert req.session_id == "hdr-session"
    assert decode(body()).passthrough_headers == {}


@pytest.mark.parametrize("value, key", [("conv-7", "conv-7"), (42, "42")])
def test_a_body_session_id_is_the_session_key_and_stays_out_of_the_upstream_body(
        value: Any, key: str) -> None:
    raw = body(session_id=value, metadata={"user_id": '{"session_id": "from-metadata"}'})
    req = decode(raw, {"x-claude-code-session-id": "from-header"})
    assert req.session_id == key  # the explicit field wins over metadata and header
    assert "session_id" not in req.raw and req.raw["messages"] == raw["messages"]
    assert raw["session_id"] == value  # the client's object is left as it was


BAD_BODIES = [
    pytest.param([], None, id="not-an-object"),
    pytest.param({"max_tokens": 1, "messages": MINIMAL["messages"]}, "model", id="no-model"),
    pytest.param(body(model=3), "model", id="model-type"),
    pytest.param({"model": "m", "messages": MINIMAL["messages"]}, "max_tokens", id="no-max-tokens"),
    pytest.param(body(max_tokens=0), "max_tokens", id="max-tokens-zero"),
    pytest.param(body(max_tokens="5"), "max_tokens", id="max-tokens-type"),
    pytest.param(body(max_tokens=True), "max_tokens", id="max-tokens-bool"),
    pytest.param({"model": "m", "max_tokens": 1}, "messages", id="no-messages"),
    pytest.param(body(messages=[]), "messages", id="empty-messages"),
    pytest.param(body(messages={"role": "user"}), "messages", id="messages-type"),
    pytest.param(body(messages=["hi"]), "messages[0]", id="message-type"),
    pytest.param(body(messages=[{"content": "x"}]), "messages[0].role", id="no-role"),
    pytest.param(body(messages=[{"role": "tool", "content": "x"}]), "messages[0].role", id="bad-role"),
    pytest.param(body(messages=[{"role": "user"}]), "messages[0].content", id="no-content"),
    pytest.param(body(messages=[{"role": "user", "content": 5}]), "messages[0].content",
                 id="content-type"),
    pytest.param(body(messages=[{"role": "user", "content": ["x"]}]), "messages[0].content[0]",
                 id="block-type"),
    pytest.param(body(messages=[{"role": "user", "content": [{"text": "x"}]}]),
                 "messages[0].content[0].type", id="block-no-type"),
    pytest.param(body(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
                 "messages[0].content[0].text", id="text-type"),
    pytest.param(body(messages=[{"role": "user", "content": [
        {"type": "text", "text": "ok"}, {"type": "tool_result", "tool_use_id": 7}]}]),
        "messages[0].content[1].tool_use_id", id="tool-use-id-type"),
    pytest.param(body(messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": 3}]}]),
        "messages[0].content[0].content", id="tool-result-content-type"),
    pytest.param(body(messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text"}]}]}]),
        "messages[0].content[0].content[0].text", id="tool-result-nested-text"),
    pytest.param(body(messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]),
        "messages[0].content[0].is_error", id="is-error-type"),
    pytest.param(body(messages=[{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]),
        "messages[0].content[0].input", id="tool-use-input-type"),
    pytest.param(body(messages=[{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "input": {}}]}]),
        "messages[0].content[0].name", id="tool-use-no-name"),
    pytest.param(body(messages=[{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "x", "signature": 5}]}]),
        "messages[0].content[0].signature", id="signature-type"),
    pytest.param(body(messages=[{"role": "assistant", "content": [
        {"type": "redacted_thinking"}]}]), "messages[0].content[0].data", id="redacted-no-data"),
    pytest.param(body(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "data": "x"}}]}]),
        "messages[0].content[0].source.media_type", id="image-no-media-type"),
    pytest.param(body(messages=[{"role": "user", "content": [{"type": "image"}]}]),
                 "messages[0].content[0].source", id="image-no-source"),
    pytest.param(body(system=5), "system", id="system-type"),
    pytest.param(body(system=[{"type": "image"}]), "system[0].type", id="system-block-kind"),
    pytest.param(body(tools={}), "tools", id="tools-type"),
    pytest.param(body(tools=[{"description": "d"}]), "tools[0].name", id="tool-no-name"),
    pytest.param(body(tools=[{"name": "f", "input_schema": []}]), "tools[0].input_schema",
                 id="tool-schema-type"),
    pytest.param(body(tool_choice="auto"), "tool_choice", id="tool-choice-type"),
    pytest.param(body(tool_choice={"type": "required"}), "tool_choice.type", id="tool-choice-enum"),
    pytest.param(body(tool_choice={"type": "tool"}), "tool_choice.name", id="tool-choice-no-name"),
    pytest.param(body(tool_choice={"type": "any", "disable_parallel_tool_use": 1}),
                 "tool_choice.disable_parallel_tool_use", id="disable-parallel-type"),
    pytest.param(body(stop_sequences="END"), "stop_sequences", id="stop-type"),
    pytest.param(body(stop_sequences=["a", 1]), "stop_sequences[1]", id="stop-item-type"),
    pytest.param(body(temperature=1.5), "temperature", id="temperature-range"),
    pytest.param(body(temperature="hot"), "temperature", id="temperature-type"),
    pytest.param(body(top_p=-0.1), "top_p", id="top-p-range"),
    pytest.param(body(top_k=-1), "top_k", id="top-k-range"),
    pytest.param(body(thinking={"type": "enabled"}), "thinking.budget_tokens", id="no-budget"),
    pytest.param(body(thinking={"type": "enabled", "budget_tokens": 0}), "thinking.budget_tokens",
                 id="budget-range"),
    pytest.param(body(thinking={"type": "maybe"}), "thinking.type", id="thinking-enum"),
    pytest.param(body(thinking=True), "thinking", id="thinking-type"),
    pytest.param(body(metadata="u"), "metadata", id="metadata-type"),
    pytest.param(body(metadata={"user_id": 5}), "metadata.user_id", id="user-id-type"),
    pytest.param(body(output_config={"effort": 3}), "output_config.effort", id="effort-type"),
    pytest.param(body(output_config={"format": {"type": "xml"}}), "output_config.format.type",
                 id="format-enum"),
    pytest.param(body(stream="yes"), "stream", id="stream-type"),
    pytest.param(body(session_id=["s"]), "session_id", id="session-id-type"),
    pytest.param(body(session_id=""), "session_id", id="session-id-empty"),
    pytest.param(body(session_id=1.5), "session_id", id="session-id-float"),
]


@pytest.mark.parametrize("raw, param", BAD_BODIES)
def test_decode_rejects(raw: Any, param: str | None) -> None:
    with pytest.raises(BadRequest) as info:
        decode(raw, {})
    assert info.value.param == param
    assert info.value.status == 400
    if param is not None:
        assert param in info.value.message


def test_count_tokens_does_not_need_max_tokens() -> None:
    raw = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert decode_count_tokens(raw).sampling.max_tokens is None
    with pytest.raises(BadRequest):
        decode(raw)


# --- encode: the non-streaming body ---------------------------------------------------------

REQUEST = decode(body())


def completion(events: list[Any]) -> Any:
    return fold(events)


ENCODE_CASES = [
    pytest.param(
        [Start(), TextDelta("Hel"), TextDelta("lo"), Finish("stop"),
         Usage(input_tokens=100, output_tokens=7, cached_tokens=60, cache_creation_tokens=10)],
        {"content": [{"type": "text", "text": "Hello"}], "stop_reason": "end_turn",
         "stop_sequence": None,
         "usage": {"input_tokens": 30, "output_tokens": 7, "cache_creation_input_tokens": 10,
                   "cache_read_input_tokens": 60}},
        id="text-with-cache-usage"),
    pytest.param(
        [ReasoningDelta("think"), ReasoningEnd(signature=THINKING_SIG),
         ReasoningEnd(redacted_data="R=="), TextDelta("x"),
         ToolCallStart(0, "toolu_1", "f"), ToolCallDelta(0, '{"b":1,"a":2}'), ToolCallEnd(0),
         ToolCallStart(1, "toolu_2", "g"), ToolCallDelta(1, '{"broken'), Finish("stop")],
        {"content": [{"type": "thinking", "thinking": "think", "signature": THINKING_SIG},
                     {"type": "redacted_thinking", "data": "R=="},
                     {"type": "text", "text": "x"},
                     {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"b": 1, "a": 2}},
                     {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}}],
         "stop_reason": "tool_use", "stop_sequence": None,
         "usage": {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                   "cache_read_input_tokens": 0}},
        id="thinking-redacted-tools-bad-json"),
    pytest.param([TextDelta("a"), Finish("length"), Usage(input_tokens=3, output_tokens=1)],
                 {"stop_reason": "max_tokens", "stop_sequence": None,
                  "usage": {"input_tokens": 3, "output_tokens": 1,
                            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}},
                 id="max-tokens"),
    pytest.param([TextDelta("a"), Finish("stop_sequence", "END")],
                 {"stop_reason": "stop_sequence", "stop_sequence": "END"}, id="stop-sequence"),
    pytest.param([Finish("content_filter")], {"stop_reason": "refusal", "content": []},
                 id="refusal"),
    pytest.param([ToolCallStart(0, "t", "f"), ToolCallDelta(0, "[1]")],
                 {"stop_reason": "tool_use",
                  "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                 id="no-finish-non-object-args"),
    pytest.param([Finish("tool_calls")], {"stop_reason": "tool_use"}, id="tool-calls"),
]


@pytest.mark.parametrize("events, expected", ENCODE_CASES)
def test_encode_completion(events: list[Any], expected: dict[str, Any]) -> None:
    out = encode_completion(completion(events), REQUEST, response_id="msg_1", created=1,
                            model="claude-x")
    assert {k: out[k] for k in expected} == expected
    assert (out["id"], out["type"], out["role"], out["model"]) == (
        "msg_1", "message", "assistant", "claude-x")
    orjson.dumps(out)  # serialisable as is


# --- stream encoder -------------------------------------------------------------------------

def encoder() -> StreamEncoder:
    return StreamEncoder(REQUEST, response_id="msg_1", created=1, model="claude-x")


def parse(stream: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Every frame as (event name, JSON data); the two must agree."""
    decoder = SSEDecoder()
    frames = []
    for sse in decoder.feed(stream) + decoder.close():
        data = orjson.loads(sse.data)
        assert sse.event == data["type"]
        frames.append((sse.event, data))
    return frames


def check_grammar(frames: list[tuple[str, dict[str, Any]]]) -> None:
    """Anthropic's event order: message_start, ping*, blocks (start delta* stop) indexed
    0.., message_delta, message_stop; an error frame ends the stream wherever it is."""
    assert frames[0][0] == "message_start"
    assert frames[0][1]["message"]["content"] == []
    open_index, next_index, state = None, 0, "content"
    for name, data in frames[1:]:
        assert state != "stopped", name
        if name == "error":
            state = "stopped"
        elif name == "ping":
            continue
        elif name == "content_block_start":
            assert state == "content" and open_index is None and data["index"] == next_index
            open_index, next_index = data["index"], next_index + 1
        elif name in ("content_block_delta", "content_block_stop"):
            assert state == "content" and data["index"] == open_index
            if name == "content_block_stop":
                open_index = None
        elif name == "message_delta":
            assert state == "content" and open_index is None
            state = "delta"
        else:
            assert name == "message_stop" and state == "delta"
            state = "stopped"
    assert state == "stopped"


def run(events: list[Any]) -> bytes:
    enc = encoder()
    return b"".join(enc.feed(e) for e in events) + enc.close()


def sdk_final_message(stream: bytes) -> anthropic.types.Message:
    """What the real ``anthropic`` SDK's MessageStream accumulates from our bytes."""
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=stream)

    client = anthropic.Anthropic(api_key="k", base_url="http://gateway.test", max_retries=0,
                                 http_client=httpx2.Client(transport=httpx2.MockTransport(answer)))
    with client.messages.stream(model="claude-x", max_tokens=10,
                                messages=[{"role": "user", "content": "hi"}]) as s:
        return s.get_final_message()


def names(frames: list[tuple[str, dict[str, Any]]]) -> list[str]:
    out = []
    for name, data in frames:
        if name == "content_block_start":
            name = f"start:{data['content_block']['type']}"
        elif name == "content_block_delta":
            name = data["delta"]["type"]
        out.append(name)
    return out


STREAM_CASES = [
    pytest.param(
        [Start(id="up-1"), Usage(input_tokens=10), TextDelta("Hel"), TextDelta(""),
         TextDelta("lo"), Logprobs((TokenLogprob("lo", -0.1),)), Finish("stop"),
         Usage(output_tokens=2)],
        ["message_start", "start:text", "text_delta", "text_delta", "content_block_stop",
         "message_delta", "message_stop"],
        id="text"),
    pytest.param(
        [Start(), ReasoningDelta("let me "), ReasoningDelta("think"),
         ReasoningEnd(signature=THINKING_SIG), TextDelta("Hi"), Finish("stop")],
        ["message_start", "start:thinking", "thinking_delta", "thinking_delta",
         "signature_delta", "content_block_stop", "start:text", "text_delta",
         "content_block_stop", "message_delta", "message_stop"],
        id="thinking-signature"),
    pytest.param(
        [Start(), ReasoningEnd(signature="only-sig"), TextDelta("Hi")],
        ["message_start", "start:thinking", "signature_delta", "content_block_stop",
         "start:text", "text_delta", "content_block_stop", "message_delta", "message_stop"],
        id="signature-without-text"),
    pytest.param(
        [Start(), ReasoningDelta("x"), ReasoningEnd(signature="s"),
         ReasoningEnd(redacted_data="REDACTED=="), TextDelta("ok"), Finish("stop")],
        ["message_start", "start:thinking", "thinking_delta", "signature_delta",
         "content_block_stop", "start:redacted_thinking", "content_block_stop", "start:text", "text_delta",
         "content_block_stop", "message_delta", "message_stop"],
        id="redacted-thinking"),
    pytest.param(
        [Start(), TextDelta("I'll look."), ToolCallStart(0, "toolu_1", "Read"),
         ToolCallDelta(0, '{"file_'), ToolCallDelta(0, 'path": "/tmp/\u00e9"}'), ToolCallEnd(0),
         ToolCallStart(1, "toolu_2", "Bash"), ToolCallDelta(1, '{"command":"ls"}'),
         ToolCallDelta(7, '{"ignored":1}'), ToolCallEnd(9), Finish("tool_calls"),
         Usage(input_tokens=50, output_tokens=20)],
        ["message_start", "start:text", "text_delta", "content_block_stop", "start:tool_use",
         "input_json_delta", "input_json_delta", "content_block_stop", "start:tool_use",
         "input_json_delta", "content_block_stop", "message_delta", "message_stop"],
        id="tool-use"),
    pytest.param(
        [Start(), TextDelta("trunc"), Finish("length"), Usage(output_tokens=1)],
        ["message_start", "start:text", "text_delta", "content_block_stop", "message_delta",
         "message_stop"],
        id="max-tokens"),
    pytest.param(
        [Start(), TextDelta("a"), Finish("stop_sequence", "END")],
        ["message_start", "start:text", "text_delta", "content_block_stop", "message_delta",
         "message_stop"],
        id="stop-sequence"),
    pytest.param(
        [Start(), Usage(input_tokens=100, cached_tokens=60, cache_creation_tokens=10),
         TextDelta("a"), Finish("stop"), Usage(output_tokens=5),
         Usage(input_tokens=101)],
        ["message_start", "start:text", "text_delta", "content_block_stop", "message_delta",
         "message_stop"],
        id="usage-after-finish"),
    pytest.param(
        [Start(), ToolCallStart(0, "t", "f"), ToolCallDelta(0, '{"a":1}')],
        ["message_start", "start:tool_use", "input_json_delta", "content_block_stop",
         "message_delta", "message_stop"],
        id="no-finish-with-tool"),
    pytest.param([Start()], ["message_start", "message_delta", "message_stop"], id="empty"),
]


@pytest.mark.parametrize("events, expected", STREAM_CASES)
def test_stream_frames_and_sdk_agree_with_non_stream(events: list[Any],
                                                     expected: list[str]) -> None:
    stream = run(events)
    frames = parse(stream)
    check_grammar(frames)
    assert names(frames) == expected
    assert stream.count(b"event: ") == len(frames)

    # the SDK's accumulation of the stream equals the non-streaming body of the same events
    whole = encode_completion(fold(events), REQUEST, response_id="msg_1", created=1,
                              model="claude-x")
    message = sdk_final_message(stream)
    assert (message.id, message.model, message.role) == ("msg_1", "claude-x", "assistant")
    assert [b.to_dict(exclude_none=True) for b in message.content] == whole["content"]
    assert (message.stop_reason, message.stop_sequence) == (whole["stop_reason"],
                                                            whole["stop_sequence"])
    assert message.usage.to_dict(exclude_none=True) == whole["usage"]


def test_stream_usage_reaches_message_start_and_message_delta() -> None:
    frames = parse(run([Start(), Usage(input_tokens=100, cached_tokens=60,
                                       cache_creation_tokens=10),
                        TextDelta("a"), Finish("stop"), Usage(output_tokens=5)]))
    assert frames[0][1]["message"]["usage"] == {
        "input_tokens": 30, "output_tokens": 0, "cache_creation_input_tokens": 10,
        "cache_read_input_tokens": 60}
    name, delta = frames[-2]
    assert name == "message_delta"
    assert delta == {"type": "message_delta",
                     "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                     "usage": {"output_tokens": 5, "input_tokens": 30,
                               "cache_creation_input_tokens": 10, "cache_read_input_tokens": 60}}


def test_stream_without_usage_reports_only_output_tokens_in_delta() -> None:
    frames = parse(run([Start(), TextDelta("a"), Finish("stop_sequence", "\n\nHuman:")]))
    assert frames[-2][1]["usage"] == {"output_tokens": 0}
    assert frames[-2][1]["delta"] == {"stop_reason": "stop_sequence",
                                      "stop_sequence": "\n\nHuman:"}


def test_stream_tool_block_start_and_deltas() -> None:
    frames = parse(run([Start(), ToolCallStart(3, "toolu_\"q", "f"),
                        ToolCallDelta(3, '{"a": "\\n'), ToolCallDelta(3, '"}')]))
    assert frames[1][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "tool_use", "id": 'toolu_"q', "name": "f",
                                              "input": {}}}
    assert "".join(d["delta"]["partial_json"] for n, d in frames
                   if n == "content_block_delta") == '{"a": "\\n"}'


def test_ping_sends_message_start_first_and_only_once() -> None:
    enc = encoder()
    first = enc.ping()
    stream = first + enc.feed(Start()) + enc.ping() + enc.feed(TextDelta("x")) + enc.close()
    frames = parse(stream)
    check_grammar(frames)
    assert [n for n, _ in frames[:2]] == ["message_start", "ping"]
    assert [n for n, _ in frames].count("message_start") == 1
    assert b'event: ping\ndata: {"type":"ping"}\n\n' in first


@pytest.mark.parametrize("exc, etype", [
    (Overloaded("busy"), "overloaded_error"),
    (UpstreamUnavailable("worker died"), "api_error"),
])
def test_fail_mid_stream_is_one_error_frame_then_nothing(exc: Any, etype: str) -> None:
    enc = encoder()
    head = enc.feed(Start()) + enc.feed(TextDelta("partial"))
    tail = enc.fail(exc)
    frames = parse(head + tail)
    check_grammar(frames)
    assert [n for n, _ in frames] == ["message_start", "content_block_start",
                                      "content_block_delta", "error"]
    assert frames[-1][1] == {"type": "error", "error": {"type": etype, "message": exc.message}}
    assert enc.close() == b"" and enc.feed(TextDelta("late")) == b"" and enc.ping() == b""
    with pytest.raises(anthropic.APIStatusError) as info:
        sdk_final_message(head + tail)
    assert etype in str(info.value)


def test_fail_before_any_content_still_sends_message_start() -> None:
    enc = encoder()
    frames = parse(enc.feed(Start()) + enc.fail(Overloaded("busy")))
    assert [n for n, _ in frames] == ["message_start", "error"]
    assert enc.fail(Overloaded("again")) == b""


def test_close_is_idempotent_and_feed_after_close_is_silent() -> None:
    enc = encoder()
    enc.feed(Start())
    assert enc.close().endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert enc.close() == b"" and enc.feed(Finish("stop")) == b""
    assert enc.fail(Overloaded("x")) == b""


def test_stream_split_at_every_byte_parses_the_same() -> None:
    stream = run(STREAM_CASES[1].values[0])
    whole = parse(stream)
    for cut in range(1, len(stream)):
        decoder = SSEDecoder()
        events = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) + decoder.close()
        assert [(e.event, orjson.loads(e.data)) for e in events] == whole


def test_redacted_end_while_thinking_is_open_keeps_both_blocks() -> None:
    # odd but legal: the open thinking block is closed (unsigned), not overwritten
    frames = parse(run([ReasoningDelta("x"), ReasoningEnd(redacted_data="R==")]))
    check_grammar(frames)
    assert names(frames) == ["message_start", "start:thinking", "thinking_delta",
                             "content_block_stop", "start:redacted_thinking",
                             "content_block_stop", "message_delta", "message_stop"]
    assert frames[4][1]["content_block"] == {"type": "redacted_thinking", "data": "R=="}
