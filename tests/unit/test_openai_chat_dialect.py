"""The OpenAI Chat Completions dialect: decode, non-stream encode, stream encode.

Encoded output is also fed to the real ``openai`` SDK through an in-memory
transport, so "valid" means "the SDK parses it", not just "json.loads works".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.dialects import openai_chat
from pool.accumulate import fold
from pool.errors import BadRequest, UpstreamUnavailable
from pool.sse import SSEDecoder
from pool.model import (
    ChatRequest, Completion, Finish, ImagePart, Logprobs, Message, ReasoningDelta, ReasoningEnd,
    ReasoningPart, ResponseFormat, Start, TextDelta, TextPart, TokenLogprob, Tool, ToolCallDelta,
    ToolCallEnd, ToolCallPart, ToolCallStart, ToolChoice, ToolResultPart, Usage,
)

from tests.support.paths import FIXTURES  # noqa: E402
USER = {"role": "user", "content": "hi"}


def body(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "m", "messages": [USER]}
    out.update(fields)
    return out


def chat_fixtures() -> list[Path]:
    found = []
    for path in sorted(FIXTURES.glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("method") == "POST" and record.get("path") == "/v1/chat/completions":
            found.append(path)
    return found


# --- decode: recorded client requests -------------------------------------------------

@pytest.mark.parametrize("path", chat_fixtures(), ids=lambda p: p.stem)
def test_every_recorded_chat_request_decodes(path: Path) -> None:
    record = json.loads(path.read_text())
    raw = record["body"]
    request = openai_chat.decode(raw, record["headers"])
    assert request.raw is raw
    assert request.dialect == "openai_chat"
    assert request.model == raw["model"]
    assert request.stream is bool(raw.get("stream"))
    assert len(request.tools) == len(raw.get("tools", ()))
    assert request.messages and all(m.parts for m in request.messages)


def test_recorded_chat_fixtures_exist() -> None:
    assert len(chat_fixtures()) >= 5


def test_qwen_tool_turn_decodes_call_and_result() -> None:
    raw = json.loads((FIXTURES / "qwen-openai-tool-02-POST-v1_chat_completions.json")
                     .read_text())["body"]
    request = openai_chat.decode(raw)
    call_msg, result_msg = request.messages[-2:]
    call = raw["messages"][-2]["tool_calls"][0]
    assert call_msg.parts == (ToolCallPart(call["id"], "read_file",
                                           call["function"]["arguments"]),)
    assert result_msg == Message("user", (ToolResultPart(
        call["id"], (TextPart("The secret word is PINEAPPLE-42.\n"),)),))
    assert request.sampling.max_tokens == 8000


# --- decode: rejections ---------------------------------------------------------------

def msgs(*messages: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages)}


def user_parts(*parts: Any) -> dict[str, Any]:
    return msgs({"role": "user", "content": list(parts)})


BAD_BODIES = [
    ("not-an-object", [1, 2], None),
    ("no model", {"messages": [USER]}, "model"),
    ("model not str", body(model=3), "model"),
    ("empty model", body(model=""), "model"),
    ("no messages", {"model": "m"}, "messages"),
    ("messages not list", body(messages={}), "messages"),
    ("empty messages", body(messages=[]), "messages"),
    ("message not object", msgs(USER, "hi"), "messages[1]"),
    ("no role", msgs({"content": "x"}), "messages[0].role"),
    ("bad role", msgs({"role": "robot", "content": "x"}), "messages[0].role"),
    ("function role", msgs({"role": "function", "name": "f", "content": "x"}),
     "messages[0].role"),
    ("user without content", msgs({"role": "user"}), "messages[0].content"),
    ("content wrong type", msgs(USER, {"role": "user", "content": 5}), "messages[1].content"),
    ("part not object", user_parts("x"), "messages[0].content[0]"),
    ("part without type", user_parts({"text": "x"}), "messages[0].content[0].type"),
    ("unknown part type", user_parts({"type": "video"}), "messages[0].content[0].type"),
    ("text not string", user_parts({"type": "text", "text": 1}),
     "messages[0].content[0].text"),
    ("text missing", user_parts({"type": "text"}), "messages[0].content[0].text"),
    ("audio part", user_parts({"type": "text", "text": "a"},
                              {"type": "input_audio", "input_audio": {}}),
     "messages[0].content[1]"),
    ("file part", user_parts({"type": "file", "file": {}}), "messages[0].content[0]"),
    ("image url missing", user_parts({"type": "image_url", "image_url": {}}),
     "messages[0].content[0].image_url.url"),
    ("image url not str", user_parts({"type": "image_url", "image_url": {"url": 1}}),
     "messages[0].content[0].image_url.url"),
    ("image url bad scheme", user_parts({"type": "image_url", "image_url": {"url": "ftp://x"}}),
     "messages[0].content[0].image_url.url"),
    ("image data url not base64",
     user_parts({"type": "image_url", "image_url": {"url": "data:image/png,abc"}}),
     "messages[0].content[0].image_url.url"),
    ("image_url missing", user_parts({"type": "image_url"}), "messages[0].content[0].image_url"),
    ("image in system", msgs({"role": "system", "content": [
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}),
     "messages[0].content[0].type"),
    ("name not str", msgs({"role": "user", "content": "x", "name": 1}), "messages[0].name"),
    ("tool_calls not list", msgs({"role": "assistant", "tool_calls": {}}),
     "messages[0].tool_calls"),
    ("tool call no id", msgs({"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
     "messages[0].tool_calls[0].id"),
    ("tool call no function", msgs({"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function"}]}), "messages[0].tool_calls[0].function"),
    ("tool call args object", msgs({"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}),
     "messages[0].tool_calls[0].function.arguments"),
    ("tool call bad type", msgs({"role": "assistant", "tool_calls": [
        {"id": "c", "type": "mcp"}]}), "messages[0].tool_calls[0].type"),
    ("reasoning_content not str", msgs({"role": "assistant", "content": "a",
                                        "reasoning_content": 1}),
     "messages[0].reasoning_content"),
    ("tool msg no call id", msgs(USER, {"role": "tool", "content": "r"}),
     "messages[1].tool_call_id"),
    ("tool msg no content", msgs(USER, {"role": "tool", "tool_call_id": "c"}),
     "messages[1].content"),
    ("tools not list", body(tools={}), "tools"),
    ("tool not object", body(tools=["f"]), "tools[0]"),
    ("tool bad type", body(tools=[{"type": "web_search"}]), "tools[0].type"),
    ("tool no function", body(tools=[{"type": "function"}]), "tools[0].function"),
    ("tool no name", body(tools=[{"type": "function", "function": {}}]), "tools[0].function.name"),
    ("tool params not object", body(tools=[{"type": "function", "function": {
        "name": "f", "parameters": "x"}}]), "tools[0].function.parameters"),
    ("tool strict not bool", body(tools=[{"type": "function", "function": {
        "name": "f", "strict": "yes"}}]), "tools[0].function.strict"),
    ("tool_choice bad str", body(tool_choice="any"), "tool_choice"),
    ("tool_choice bad type", body(tool_choice=1), "tool_choice"),
    ("tool_choice no name", body(tool_choice={"type": "function", "function": {}}),
     "tool_choice.function.name"),
    ("tool_choice bad kind", body(tool_choice={"type": "tool"}), "tool_choice.type"),
    ("parallel not bool", body(parallel_tool_calls="yes"), "parallel_tool_calls"),
    ("response_format not object", body(response_format="json"), "response_format"),
    ("response_format bad type", body(response_format={"type": "yaml"}), "response_format.type"),
    ("response_format no type", body(response_format={}), "response_format.type"),
    ("json_schema missing", body(response_format={"type": "json_schema"}),
     "response_format.json_schema"),
    ("json_schema no name", body(response_format={"type": "json_schema",
                                                  "json_schema": {"schema": {}}}),
     "response_format.json_schema.name"),
    ("stop not str", body(stop=5), "stop"),
    ("stop item not str", body(stop=["a", 1]), "stop[1]"),
    ("max_tokens str", body(max_tokens="10"), "max_tokens"),
    ("max_tokens zero", body(max_tokens=0), "max_tokens"),
    ("max_completion_tokens neg", body(max_completion_tokens=-1), "max_completion_tokens"),
    ("temperature str", body(temperature="hot"), "temperature"),
    ("temperature bool", body(temperature=True), "temperature"),
    ("temperature high", body(temperature=2.5), "temperature"),
    ("top_p high", body(top_p=1.5), "top_p"),
    ("seed float", body(seed=1.5), "seed"),
    ("n zero", body(n=0), "n"),
    ("n str", body(n="2"), "n"),
    ("user not str", body(user=1), "user"),
    ("logprobs not bool", body(logprobs=1), "logprobs"),
    ("top_logprobs without logprobs", body(top_logprobs=3), "top_logprobs"),
    ("top_logprobs too many", body(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("reasoning_effort not str", body(reasoning_effort=1), "reasoning_effort"),
    ("metadata not object", body(metadata=[]), "metadata"),
    ("prompt_cache_key not str", body(prompt_cache_key=1), "prompt_cache_key"),
    ("stream not bool", body(stream="yes"), "stream"),
    ("stream_options not object", body(stream=True, stream_options=True), "stream_options"),
    ("include_usage not bool", body(stream=True, stream_options={"include_usage": "y"}),
     "stream_options.include_usage"),
]


@pytest.mark.parametrize(("raw", "param"), [(b, p) for _, b, p in BAD_BODIES],
                         ids=[name for name, _, _ in BAD_BODIES])
def test_bad_bodies_are_rejected_naming_the_param(raw: object, param: str | None) -> None:
    with pytest.raises(BadRequest) as caught:
        openai_chat.decode(raw)
    assert caught.value.param == param
    assert caught.value.status == 400
    if param is not None:
        assert param in caught.value.message


# --- decode: what comes out -----------------------------------------------------------

def field(request: ChatRequest, path: str) -> Any:
    value: Any = request
    for name in path.split("."):
        value = getattr(value, name)
    return value


DECODED_FIELDS = [
    (body(), "stream", False),
    (body(stream=True), "stream", True),
    (body(stream=None), "stream", False),
    (body(max_tokens=10), "sampling.max_tokens", 10),
    (body(max_completion_tokens=20), "sampling.max_tokens", 20),
    (body(max_tokens=10, max_completion_tokens=20), "sampling.max_tokens", 20),
    (body(max_tokens=10.0), "sampling.max_tokens", 10),
    (body(temperature=0.5, top_p=1), "sampling.temperature", 0.5),
    (body(temperature=0.5, top_p=1), "sampling.top_p", 1),
    (body(top_k=40), "sampling.top_k", 40),
    (body(top_k=-1), "sampling.top_k", None),
    (body(seed=7), "sampling.seed", 7),
    (body(n=3), "sampling.n", 3),
    (body(), "sampling.n", 1),
    (body(stop="END"), "sampling.stop", ("END",)),
    (body(stop=["a", "b", "c", "d", "e"]), "sampling.stop", ("a", "b", "c", "d", "e")),
    (body(stop=None), "sampling.stop", ()),
    (body(user="u-1"), "user", "u-1"),
    (body(prompt_cache_key="pck"), "prompt_cache_key", "pck"),
    (body(metadata={"k": "v"}), "metadata", {"k": "v"}),
    (body(reasoning_effort="high"), "reasoning_effort", "high"),
    (body(logprobs=True), "logprobs", True),
    (body(logprobs=True), "top_logprobs", None),
    (body(logprobs=True, top_logprobs=5), "top_logprobs", 5),
    (body(logprobs=True, top_logprobs=0), "top_logprobs", 0),
    (body(), "tool_choice", None),
    (body(tool_choice="required"), "tool_choice", ToolChoice("required")),
    (body(tool_choice="none", parallel_tool_calls=True), "tool_choice", ToolChoice("none",
                                                                                    parallel=True)),
    (body(parallel_tool_calls=False), "tool_choice", ToolChoice("auto", parallel=False)),
    (body(tool_choice={"type": "function", "function": {"name": "f"}}), "tool_choice",
     ToolChoice("named", "f")),
    (body(tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "required",
                                                                  "tools": []}}),
     "tool_choice", ToolChoice("required")),
    (body(tools=[{"type": "function", "function": {
        "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}}]),
     "tools", (Tool("f", "d", {"type": "object"}, strict=True),)),
    (body(tools=[{"type": "function", "name": "flat", "parameters": {}}]), "tools",
     (Tool("flat", None, {}),)),
    (body(tools=[{"type": "custom", "custom": {"name": "patch", "description": "d"}}]), "tools",
     (Tool("patch", "d", kind="custom"),)),
    (body(response_format={"type": "json_object"}), "response_format",
     ResponseFormat("json_object")),
    (body(response_format={"type": "json_schema", "json_schema": {
        "name": "out", "schema": {"type": "object"}, "strict": True}}), "response_format",
     ResponseFormat("json_schema", {"type": "object"}, "out", True)),
    (body(unknown_field={"x": 1}), "model", "m"),
]


@pytest.mark.parametrize(("raw", "path", "expected"), DECODED_FIELDS)
def test_decoded_fields(raw: dict[str, Any], path: str, expected: Any) -> None:
    request = openai_chat.decode(raw)
    assert field(request, path) == expected
    assert request.raw is raw


def test_session_id_comes_from_header() -> None:
    assert openai_chat.decode(body(), {"x-session-id": "s1"}).session_id == "s1"
    assert openai_chat.decode(body(), {}).session_id is None


DECODED_MESSAGES = [
    ("system and developer stay in place",
     [{"role": "developer", "content": "d"}, USER, {"role": "system", "content": [
         {"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}]}],
     (Message("developer", (TextPart("d"),)), Message("user", (TextPart("hi"),)),
      Message("system", (TextPart("s1"), TextPart("s2"))))),
    ("name kept", [{"role": "user", "content": "x", "name": "ann"}],
     (Message("user", (TextPart("x"),), name="ann"),)),
    ("image by url", [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "https://e.com/a.png", "detail": "low"}}]}],
     (Message("user", (TextPart("look"), ImagePart(url="https://e.com/a.png", detail="low"))),)),
    ("image as data url", [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}],
     (Message("user", (ImagePart(data="iVBORw0KGgo=", media_type="image/png"),)),)),
    ("assistant tool calls with null content, then merged tool results",
     [USER, {"role": "assistant", "content": None, "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
         {"id": "c2", "type": "function", "function": {"name": "b", "arguments": ""}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "r1"},
      {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "r2"}]},
      {"role": "user", "content": "next"}],
     (Message("user", (TextPart("hi"),)),
      Message("assistant", (ToolCallPart("c1", "a", '{"x": 1}'), ToolCallPart("c2", "b", ""))),
      Message("user", (ToolResultPart("c1", (TextPart("r1"),)),
                       ToolResultPart("c2", (TextPart("r2"),)))),
      Message("user", (TextPart("next"),)))),
    ("reasoning_content before text",
     [USER, {"role": "assistant", "content": "answer", "reasoning_content": "thought"}],
     (Message("user", (TextPart("hi"),)),
      Message("assistant", (ReasoningPart("thought"), TextPart("answer"))))),
    ("assistant refusal part", [USER, {"role": "assistant", "content": [
        {"type": "refusal", "refusal": "no"}]}],
     (Message("user", (TextPart("hi"),)), Message("assistant", (TextPart("no"),)))),
    ("custom tool call", [USER, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "custom", "custom": {"name": "p", "input": "raw text"}}]}],
     (Message("user", (TextPart("hi"),)),
      Message("assistant", (ToolCallPart("c", "p", "raw text", "custom"),)))),
    ("trailing tool message", [USER, {"role": "tool", "tool_call_id": "c", "content": ""}],
     (Message("user", (TextPart("hi"),)),
      Message("user", (ToolResultPart("c", (TextPart(""),)),)))),
]


@pytest.mark.parametrize(("messages", "expected"), [(m, e) for _, m, e in DECODED_MESSAGES],
                         ids=[name for name, _, _ in DECODED_MESSAGES])
def test_decoded_messages(messages: list[Any], expected: tuple[Message, ...]) -> None:
    assert openai_chat.decode({"model": "m", "messages": messages}).messages == expected


# --- decode: property ------------------------------------------------------------------

texts = st.text(max_size=20)
ids = st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)
arguments = st.dictionaries(st.text(max_size=5), st.integers() | texts, max_size=3).map(
    lambda d: json.dumps(d, ensure_ascii=False))
content = texts | st.lists(texts.map(lambda t: {"type": "text", "text": t}), min_size=1,
                           max_size=3)
text_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user",
                                                               "assistant"]),
                                      "content": content})
call = st.builds(lambda i, n, a: {"id": i, "type": "function",
                                  "function": {"name": n, "arguments": a}}, ids, ids, arguments)
call_message = st.builds(lambda calls, c: {"role": "assistant", "content": c, "tool_calls": calls},
                         st.lists(call, min_size=1, max_size=3), st.none() | texts)
tool_message = st.builds(lambda i, c: {"role": "tool", "tool_call_id": i, "content": c},
                         ids, content)


def wire_items(messages: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for m in messages:
        c = m.get("content")
        pieces = [] if c is None else [c] if isinstance(c, str) else [p["text"] for p in c]
        if m["role"] == "tool":
            out.append(("result", m["tool_call_id"], *pieces))
            continue
        out.extend(("text", m["role"], t) for t in pieces)
        for tc in m.get("tool_calls", ()):
            out.append(("call", tc["id"], tc["function"]["name"], tc["function"]["arguments"]))
    return out


def canonical_items(messages: tuple[Message, ...]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for m in messages:
        for p in m.parts:
            if isinstance(p, TextPart):
                out.append(("text", m.role, p.text))
            elif isinstance(p, ToolCallPart):
                out.append(("call", p.id, p.name, p.arguments))
            elif isinstance(p, ToolResultPart):
                out.append(("result", p.call_id, *(c.text for c in p.content)))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(text_message | call_message | tool_message, min_size=1, max_size=8))
def test_decode_keeps_texts_call_ids_and_arguments(messages: list[dict[str, Any]]) -> None:
    request = openai_chat.decode({"model": "m", "messages": messages})
    assert canonical_items(request.messages) == wire_items(messages)
    # tool messages never stand alone: each run of them is one user message
    runs = sum(1 for k, m in enumerate(messages)
               if m["role"] == "tool" and (k == 0 or messages[k - 1]["role"] != "tool"))
    assert sum(1 for m in request.messages
               if any(isinstance(p, ToolResultPart) for p in m.parts)) == runs


# --- the real SDK as the judge of our output ----------------------------------------------

def sdk_client(payload: bytes, content_type: str) -> openai.OpenAI:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=payload, headers={"content-type": content_type})

    return openai.OpenAI(api_key="test", base_url="http://127.0.0.1:9/v1", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
                         _strict_response_validation=True)


# --- encode_completion ---------------------------------------------------------------------

def completion(*events: Any) -> Completion:
    return fold([Start(), *events])


def encode(c: Completion, **request_fields: Any) -> dict[str, Any]:
    request = openai_chat.decode(body(**request_fields))
    return openai_chat.encode_completion(c, request, response_id="chatcmpl-1", created=99,
                                         model="m")


ENCODED = [
    ("text", completion(TextDelta("Hel"), TextDelta("lo"), Finish("stop")), {},
     {"role": "assistant", "content": "Hello", "refusal": None}, "stop", None),
    ("stop sequence", completion(TextDelta("x"), Finish("stop_sequence", "END")), {},
     {"role": "assistant", "content": "x", "refusal": None}, "stop", None),
    ("length", completion(TextDelta("x"), Finish("length")), {},
     {"role": "assistant", "content": "x", "refusal": None}, "length", None),
    ("content filter", completion(Finish("content_filter")), {},
     {"role": "assistant", "content": "", "refusal": None}, "content_filter", None),
    ("no finish", completion(TextDelta("x")), {},
     {"role": "assistant", "content": "x", "refusal": None}, "stop", None),
    ("tool calls only, finish stop", completion(
        ToolCallStart(0, "c1", "f"), ToolCallDelta(0, '{"a":'), ToolCallDelta(0, "1}"),
        ToolCallEnd(0), ToolCallStart(1, "c2", "g"), ToolCallEnd(1), Finish("stop")), {},
     {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
         {"id": "c2", "type": "function", "function": {"name": "g", "arguments": ""}}]},
     "tool_calls", None),
    ("text and tool call", completion(TextDelta("let me"), ToolCallStart(5, "c", "f"),
                                      ToolCallDelta(5, "{}"), Finish("tool_calls")), {},
     {"role": "assistant", "content": "let me", "refusal": None, "tool_calls": [
         {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
     "tool_calls", None),
    ("reasoning", completion(ReasoningDelta("thin"), ReasoningDelta("k"), ReasoningEnd("sig"),
                             TextDelta("42"), Finish("stop")), {},
     {"role": "assistant", "content": "42", "refusal": None, "reasoning_content": "think"},
     "stop", None),
    ("logprobs", completion(TextDelta("é"), Logprobs((TokenLogprob(
        "é", -0.5, top=(("é", -0.5), ("e", -1.5))),)), Finish("stop")), {"logprobs": True},
     {"role": "assistant", "content": "é", "refusal": None}, "stop",
     {"content": [{"token": "é", "logprob": -0.5, "bytes": [195, 169], "top_logprobs": [
         {"token": "é", "logprob": -0.5, "bytes": [195, 169]},
         {"token": "e", "logprob": -1.5, "bytes": [101]}]}], "refusal": None}),
    ("logprobs not asked", completion(TextDelta("a"), Logprobs((TokenLogprob("a", -1.0),))), {},
     {"role": "assistant", "content": "a", "refusal": None}, "stop", None),
]


@pytest.mark.parametrize(("c", "fields", "message", "finish", "logprobs"),
                         [e[1:] for e in ENCODED], ids=[e[0] for e in ENCODED])
def test_encode_completion(c: Completion, fields: dict[str, Any], message: dict[str, Any],
                           finish: str, logprobs: Any) -> None:
    out = encode(c, **fields)
    assert out["id"] == "chatcmpl-1" and out["object"] == "chat.completion"
    assert out["created"] == 99 and out["model"] == "m"
    assert out["choices"] == [{"index": 0, "message": message, "logprobs": logprobs,
                               "finish_reason": finish}]
    parsed = sdk_client(json.dumps(out).encode(), "application/json").chat.completions.create(
        model="m", messages=[USER])
    assert parsed.choices[0].finish_reason == finish
    assert parsed.choices[0].message.content == message["content"]


def test_encode_completion_usage() -> None:
    c = completion(TextDelta("x"), Usage(input_tokens=10, cached_tokens=4),
                   Usage(output_tokens=7, reasoning_tokens=3), Finish("stop"))
    assert encode(c)["usage"] == {
        "prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 3}}
    assert encode(completion())["usage"]["total_tokens"] == 0


# --- stream encoder ----------------------------------------------------------------------------

def run_stream(events: list[Any], *, end: Any = "close", **request_fields: Any) -> bytes:
    request = openai_chat.decode(body(stream=True, **request_fields))
    enc = openai_chat.StreamEncoder(request, response_id="chatcmpl-s", created=7, model="m")
    out = b"".join(enc.feed(e) for e in events)
    out += enc.close() if end == "close" else enc.fail(end)
    assert enc.close() == b"" and enc.feed(TextDelta("late")) == b""  # ended means ended
    return out


def payloads(stream: bytes) -> list[Any]:
    """Every frame is ``data: ...\\n\\n``; JSON lines parsed, ``[DONE]`` kept as text."""
    frames = stream.split(b"\n\n")
    assert frames[-1] == b""
    out: list[Any] = []
    for frame in frames[:-1]:
        assert frame.startswith(b"data: ") and b"\n" not in frame
        data = frame[6:]
        out.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return out


def deltas(stream: bytes) -> list[tuple[dict[str, Any], Any, Any]]:
    out = []
    for p in payloads(stream)[:-1]:
        assert p["id"] == "chatcmpl-s" and p["object"] == "chat.completion.chunk"
        assert p["created"] == 7 and p["model"] == "m"
        if p["choices"]:
            (choice,) = p["choices"]
            assert choice["index"] == 0
            out.append((choice["delta"], choice["finish_reason"], choice["logprobs"]))
    return out


ROLE = ({"role": "assistant", "content": ""}, None, None)

STREAMS = [
    ("text", [Start(), TextDelta("Hel"), TextDelta("lo"), Finish("stop")],
     [ROLE, ({"content": "Hel"}, None, None), ({"content": "lo"}, None, None),
      ({}, "stop", None)]),
    ("no finish means stop", [Start(), TextDelta("x")],
     [ROLE, ({"content": "x"}, None, None), ({}, "stop", None)]),
    ("empty stream", [], [ROLE, ({}, "stop", None)]),
    ("length", [Start(), TextDelta("x"), Finish("length")],
     [ROLE, ({"content": "x"}, None, None), ({}, "length", None)]),
    ("reasoning then text", [Start(), ReasoningDelta("hm"), ReasoningEnd("sig"), TextDelta("a"),
                             Finish("stop")],
     [ROLE, ({"reasoning_content": "hm"}, None, None), ({"content": "a"}, None, None),
      ({}, "stop", None)]),
    ("parallel tool calls with worker indexes", [
        Start(), ToolCallStart(4, "c1", "f"), ToolCallStart(9, "c2", "g"),
        ToolCallDelta(9, '{"b":2}'), ToolCallDelta(4, '{"a":1}'), ToolCallDelta(3, "lost"),
        ToolCallEnd(4), ToolCallEnd(9), Finish("stop")],
     [ROLE,
      ({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                        "function": {"name": "f", "arguments": ""}}]}, None, None),
      ({"tool_calls": [{"index": 1, "id": "c2", "type": "function",
                        "function": {"name": "g", "arguments": ""}}]}, None, None),
      ({"tool_calls": [{"index": 1, "function": {"arguments": '{"b":2}'}}]}, None, None),
      ({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":1}'}}]}, None, None),
      ({}, "tool_calls", None)]),
    ("logprobs ignored when not asked", [Start(), TextDelta("a"),
                                         Logprobs((TokenLogprob("a", -1.0),))],
     [ROLE, ({"content": "a"}, None, None), ({}, "stop", None)]),
]


@pytest.mark.parametrize(("events", "expected"), [s[1:] for s in STREAMS],
                         ids=[s[0] for s in STREAMS])
def test_stream_frames(events: list[Any], expected: list[Any]) -> None:
    stream = run_stream(events)
    assert deltas(stream) == expected
    assert stream.endswith(b"data: [DONE]\n\n")


def test_stream_logprobs_when_asked() -> None:
    stream = run_stream([Start(), TextDelta("a"), Logprobs((TokenLogprob("a", -1.0, bytes=(97,),
                                                                         top=(("a", -1.0),)),)),
                         Finish("stop")], logprobs=True, top_logprobs=1)
    assert deltas(stream)[2] == ({}, None, {"content": [{
        "token": "a", "logprob": -1.0, "bytes": [97],
        "top_logprobs": [{"token": "a", "logprob": -1.0, "bytes": [97]}]}], "refusal": None})


@pytest.mark.parametrize("include_usage", [True, False, None])
def test_stream_usage_chunk_only_when_asked(include_usage: bool | None) -> None:
    options = {} if include_usage is None else {"stream_options": {"include_usage": include_usage}}
    stream = run_stream([Start(), Usage(input_tokens=5), TextDelta("x"), Finish("stop"),
                         Usage(output_tokens=2, cached_tokens=1)], **options)
    frames = payloads(stream)
    assert frames[-1] == "[DONE]"
    if include_usage:
        assert frames[-2]["choices"] == [] and frames[-2]["usage"] == {
            "prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 1},
            "completion_tokens_details": {"reasoning_tokens": 0}}
        assert frames[-3]["choices"][0]["finish_reason"] == "stop"
    else:
        assert all("usage" not in f for f in frames[:-1])
        assert frames[-2]["choices"][0]["finish_reason"] == "stop"


def test_stream_fail_sends_error_frame_then_done() -> None:
    stream = run_stream([Start(), TextDelta("par")], end=UpstreamUnavailable("worker died"))
    frames = payloads(stream)
    assert frames[-2] == {"error": {"message": "worker died", "type": "api_error", "param": None,
                                    "code": "upstream_error"}}
    assert frames[-1] == "[DONE]"
    assert all(f.get("choices", [{}])[0].get("finish_reason") is None for f in frames[:-2])


def test_ping_is_an_sse_comment() -> None:
    enc = openai_chat.StreamEncoder(openai_chat.decode(body()), response_id="r", created=1,
                                    model="m")
    assert enc.ping() == b": ping\n\n"


def test_sdk_reads_a_tool_call_stream() -> None:
    events = [Start(), ReasoningDelta("plan"), TextDelta("Checking"), ToolCallStart(2, "c1", "f"),
              ToolCallDelta(2, '{"city": '), ToolCallStart(5, "c2", "g"),
              ToolCallDelta(2, '"Paris"}'), ToolCallDelta(5, "{}"), Finish("tool_calls"),
              Usage(input_tokens=3, output_tokens=4)]
    stream = run_stream(events, stream_options={"include_usage": True})
    client = sdk_client(stream, "text/event-stream")
    with client.chat.completions.stream(model="m", messages=[USER]) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Checking"
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("c1", "f", '{"city": "Paris"}'), ("c2", "g", "{}")]
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.usage is not None and final.usage.total_tokens == 7


def test_sdk_reads_text_stream_with_logprobs() -> None:
    events = [Start(), TextDelta("a"), Logprobs((TokenLogprob("a", -0.25),)), TextDelta("b"),
              Logprobs((TokenLogprob("b", -0.5),)), Finish("stop")]
    stream = run_stream(events, logprobs=True)
    chunks = list(sdk_client(stream, "text/event-stream").chat.completions.create(
        model="m", messages=[USER], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "ab"
    assert [t.logprob for c in chunks if c.choices[0].logprobs
            for t in c.choices[0].logprobs.content] == [-0.25, -0.5]


def test_sdk_raises_on_error_frame() -> None:
    stream = run_stream([Start(), TextDelta("x")], end=UpstreamUnavailable("worker died"))
    client = sdk_client(stream, "text/event-stream")
    with pytest.raises(openai.APIError, match="worker died"):
        for _ in client.chat.completions.create(model="m", messages=[USER], stream=True):
            pass


def test_stream_with_pings_survives_any_split() -> None:
    request = openai_chat.decode(body(stream=True))
    enc = openai_chat.StreamEncoder(request, response_id="r", created=1, model="m")
    stream = (enc.feed(Start()) + enc.ping() + enc.feed(TextDelta("a\n\nb")) + enc.ping()
              + enc.feed(Finish("stop")) + enc.close())
    whole = [e.data for e in SSEDecoder().feed(stream)]
    assert len(whole) == 4 and whole[-1] == "[DONE]"
    assert json.loads(whole[1])["choices"][0]["delta"] == {"content": "a\n\nb"}
    for cut in range(1, len(stream)):
        decoder = SSEDecoder()
        events = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) + decoder.close()
        assert [e.data for e in events] == whole
