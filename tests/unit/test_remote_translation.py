"""Canonical ⇄ upstream translation of the ``remote`` workers (pure, table-driven)."""

from __future__ import annotations

import copy
import email.utils
import time
from typing import Any

import orjson
import pytest

from pool.errors import (
    BadRequest, UpstreamCredentialsRefused, UpstreamError, UpstreamTimeout, UpstreamUnavailable,
)
from pool.model import (
    ChatRequest, Finish, ImagePart, Logprobs, Message, ReasoningDelta, ReasoningEnd,
    ReasoningPart, ResponseFormat, Sampling, Start, TextDelta, TextPart, TokenLogprob, Tool,
    ToolCallDelta, ToolCallEnd, ToolCallPart, ToolCallStart, ToolChoice, ToolResultPart, Usage,
)
from pool.remote import anthropic_messages as am
from pool.remote import openai_chat as oc
from pool.remote.errors import error_from_body, error_from_object, parse_retry_after, scrub
from pool.remote.policy import PassPolicy
from pool.sse import SSEDecoder


def req(*messages: Message, **kw: Any) -> ChatRequest:
    kw.setdefault("dialect", "native")
    return ChatRequest(model="up-model", messages=messages, **kw)


def user(*parts: Any) -> Message:
    return Message("user", tuple(TextPart(p) if isinstance(p, str) else p for p in parts))


def assistant(*parts: Any) -> Message:
    return Message("assistant", tuple(TextPart(p) if isinstance(p, str) else p for p in parts))


WEATHER = Tool("weather", "Weather by city", {"type": "object",
                                              "properties": {"city": {"type": "string"}}})
PNG = ImagePart(data="iVBORw0KGgo=", media_type="image/png")
URL_IMAGE = ImagePart(url="https://example.com/cat.jpg", detail="low")
CALL = ToolCallPart("call_1", "weather", '{"city": "Paris"}')
SIGNED = ReasoningPart("let me think", signature="c2lnbmF0dXJl")


# --- canonical -> OpenAI ----------------------------------------------------------

OPENAI_BODIES = [
    ("plain text",
     req(user("hi")),
     {"model": "up-model", "messages": [{"role": "user", "content": "hi"}]}),
    ("system and developer become system, in place",
     req(Message("system", (TextPart("be brief"),)), user("hi"),
         Message("developer", (TextPart("use French"),))),
     {"model": "up-model", "messages": [
         {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
         {"role": "system", "content": "use French"}]}),
    ("images by URL and inline",
     req(user("what is this?", URL_IMAGE, PNG)),
     {"model": "up-model", "messages": [{"role": "user", "content": [
         {"type": "text", "text": "what is this?"},
         {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg",
                                             "detail": "low"}},
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}),
    ("assistant: reasoning dropped, text and tool calls kept",
     req(user("weather?"), assistant(SIGNED, "Checking.", CALL)),
     {"model": "up-model", "messages": [
         {"role": "user", "content": "weather?"},
         {"role": "assistant", "content": "Checking.", "tool_calls": [
             {"id": "call_1", "type": "function",
              "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]}]}),
    ("assistant with only a tool call has null content",
     req(assistant(CALL)),
     {"model": "up-model", "messages": [
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_1", "type": "function",
              "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]}]}),
    ("tool results go first as tool messages; their images move to the user message",
     req(user("and now?", ToolResultPart("call_1", (TextPart("sunny"),)),
              ToolResultPart("call_2", (TextPart("boom"), PNG), is_error=True))),
     {"model": "up-model", "messages": [
         {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
         {"role": "tool", "tool_call_id": "call_2", "content": "boom"},
         {"role": "user", "content": [
             {"type": "text", "text": "and now?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}),
    ("a user message of tool results only leaves no empty user message",
     req(user(ToolResultPart("call_1", (TextPart("sunny"),)))),
     {"model": "up-model", "messages": [
         {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}),
    ("tools, named choice, no parallel calls",
     req(user("x"), tools=(WEATHER,), tool_choice=ToolChoice("named", "weather", False)),
     {"model": "up-model", "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {
          "name": "weather", "description": "Weather by city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
      "tool_choice": {"type": "function", "function": {"name": "weather"}},
      "parallel_tool_calls": False}),
    ("required choice and a strict custom tool",
     req(user("x"), tools=(Tool("grep", parameters={"type": "object"}, strict=True),
                           Tool("patch", "apply a patch", kind="custom")),
         tool_choice=ToolChoice("required")),
     {"model": "up-model", "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"},
                                                   "strict": True}},
                # chat servers rarely know ``type: custom``: a function with one string argument
                {"type": "function", "function": {
                    "name": "patch", "description": "apply a patch",
                    "parameters": {"type": "object", "properties": {"input": {"type": "string"}},
                                   "required": ["input"]}}}],
      "tool_choice": "required"}),
    ("tool choice is not sent without tools",
     req(user("x"), tool_choice=ToolChoice("none")),
     {"model": "up-model", "messages": [{"role": "user", "content": "x"}]}),
    ("sampling, format, logprobs, user, streaming",
     req(user("x"), sampling=Sampling(max_tokens=50, temperature=0.2, top_p=0.9, top_k=40,
                                      stop=("END",), seed=7, n=2),
         response_format=ResponseFormat("json_schema", {"type": "object"}, "answer", True),
         logprobs=True, top_logprobs=3, user="u-1", prompt_cache_key="pck", stream=True),
     {"model": "up-model", "messages": [{"role": "user", "content": "x"}],
      "max_tokens": 50, "temperature": 0.2, "top_p": 0.9, "stop": ["END"], "seed": 7, "n": 2,
      "response_format": {"type": "json_schema", "json_schema": {
          "name": "answer", "schema": {"type": "object"}, "strict": True}},
      "logprobs": True, "top_logprobs": 3, "user": "u-1", "prompt_cache_key": "pck",
      "stream": True, "stream_options": {"include_usage": True}}),
    ("reasoning effort asks for max_completion_tokens",
     req(user("x"), sampling=Sampling(max_tokens=500), reasoning_effort="high",
         response_format=ResponseFormat("json_object"), thinking_budget=2000),
     {"model": "up-model", "messages": [{"role": "user", "content": "x"}],
      "max_completion_tokens": 500, "reasoning_effort": "high",
      "response_format": {"type": "json_object"}}),
]


@pytest.mark.parametrize("request_, expected", [c[1:] for c in OPENAI_BODIES],
                         ids=[c[0] for c in OPENAI_BODIES])
def test_openai_body(request_: ChatRequest, expected: dict[str, Any]) -> None:
    body = oc.build_body(request_)
    assert body == expected
    orjson.dumps(body)  # serialisable as is


# --- canonical -> Anthropic -------------------------------------------------------

def _text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


ANTHROPIC_BODIES = [
    ("plain text gets the default max_tokens",
     req(user("hi")),
     {"model": "up-model", "max_tokens": 4096,
      "messages": [{"role": "user", "content": [_text("hi")]}]}),
    ("system and developer anywhere go to system, in order",
     req(Message("system", (TextPart("be brief"),)), Message("developer", (TextPart("dev"),)),
         user("hi"), Message("system", (TextPart("late"),))),
     {"model": "up-model", "max_tokens": 4096,
      "system": [_text("be brief"), _text("dev"), _text("late")],
      "messages": [{"role": "user", "content": [_text("hi")]}]}),
    ("images by URL and inline",
     req(user("what?", URL_IMAGE, PNG)),
     {"model": "up-model", "max_tokens": 4096, "messages": [{"role": "user", "content": [
         _text("what?"),
         {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                      "data": "iVBORw0KGgo="}}]}]}),
    ("assistant: signed and redacted reasoning kept, unsigned dropped, arguments parsed",
     req(user("weather?"),
         assistant(SIGNED, ReasoningPart("private"), ReasoningPart(redacted_data="RED=="),
                   "Checking.", CALL, ToolCallPart("call_2", "now", ""),
                   ToolCallPart("call_3", "patch", "*** Begin Patch", "custom"))),
     {"model": "up-model", "max_tokens": 4096, "messages": [
         {"role": "user", "content": [_text("weather?")]},
         {"role": "assistant", "content": [
             {"type": "thinking", "thinking": "let me think", "signature": "c2lnbmF0dXJl"},
             {"type": "redacted_thinking", "data": "RED=="},
             _text("Checking."),
             {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
             {"type": "tool_use", "id": "call_2", "name": "now", "input": {}},
             {"type": "tool_use", "id": "call_3", "name": "patch",
              "input": {"input": "*** Begin Patch"}}]}]}),
    ("tool results first, is_error kept, consecutive user messages merged",
     req(user("and now?", ToolResultPart("call_1", (TextPart("boom"), PNG), is_error=True)),
         user("really?")),
     {"model": "up-model", "max_tokens": 4096, "messages": [{"role": "user", "content": [
         {"type": "tool_result", "tool_use_id": "call_1", "is_error": True, "content": [
             _text("boom"),
             {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                          "data": "iVBORw0KGgo="}}]},
         _text("and now?"), _text("really?")]}]}),
    ("tools, required choice without parallel calls, custom tool schema",
     req(user("x"), tools=(WEATHER, Tool("patch", kind="custom"), Tool("noargs")),
         tool_choice=ToolChoice("required", parallel=False)),
     {"model": "up-model", "max_tokens": 4096,
      "messages": [{"role": "user", "content": [_text("x")]}],
      "tools": [{"name": "weather", "description": "Weather by city",
                 "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
                {"name": "patch", "input_schema": {
                    "type": "object", "properties": {"input": {"type": "string"}},
                    "required": ["input"]}},
                {"name": "noargs", "input_schema": {"type": "object", "properties": {}}}],
      "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}),
    ("named and none choices",
     req(user("x"), tools=(WEATHER,), tool_choice=ToolChoice("named", "weather")),
     {"model": "up-model", "max_tokens": 4096,
      "messages": [{"role": "user", "content": [_text("x")]}],
      "tools": [{"name": "weather", "description": "Weather by city",
                 "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
      "tool_choice": {"type": "tool", "name": "weather"}}),
    ("sampling, user, thinking, stream; OpenAI-only knobs dropped",
     req(user("x"), sampling=Sampling(max_tokens=8000, temperature=1.0, top_p=0.9, top_k=40,
                                      stop=("END",), seed=7),
         logprobs=True, top_logprobs=2, user="u-1", thinking_budget=2048,
         reasoning_effort="high", stream=True),
     {"model": "up-model", "max_tokens": 8000,
      "messages": [{"role": "user", "content": [_text("x")]}],
      "stop_sequences": ["END"], "temperature": 1.0, "top_p": 0.9, "top_k": 40,
      "thinking": {"type": "enabled", "budget_tokens": 2048},
      "metadata": {"user_id": "u-1"}, "stream": True}),
    ("a thinking budget above max_tokens is clamped below it",
     req(user("x"), sampling=Sampling(max_tokens=8000), thinking_budget=32000),
     {"model": "up-model", "max_tokens": 8000,
      "messages": [{"role": "user", "content": [_text("x")]}],
      "thinking": {"type": "enabled", "budget_tokens": 7999}}),
    ("no thinking when max_tokens leaves no room for it",
     req(user("x"), sampling=Sampling(max_tokens=1000), thinking_budget=2000),
     {"model": "up-model", "max_tokens": 1000,
      "messages": [{"role": "user", "content": [_text("x")]}]}),
    ("strict JSON schema: instruction and output_config",
     req(user("x"), response_format=ResponseFormat("json_schema", {"type": "object"}, "a", True)),
     {"model": "up-model", "max_tokens": 4096,
      "messages": [{"role": "user", "content": [_text("x")]}],
      "system": [_text(am.JSON_SCHEMA_INSTRUCTION + '{"type":"object"}')],
      "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}),
    ("loose JSON schema and json_object: instruction only",
     req(Message("system", (TextPart("sys"),)), user("x"),
         response_format=ResponseFormat("json_object")),
     {"model": "up-model", "max_tokens": 4096,
      "messages": [{"role": "user", "content": [_text("x")]}],
      "system": [_text("sys"), _text(am.JSON_INSTRUCTION)]}),
    ("empty text blocks and empty messages are left out",
     req(user(""), assistant("", "ok"), user("go")),
     {"model": "up-model", "max_tokens": 4096, "messages": [
         {"role": "assistant", "content": [_text("ok")]},
         {"role": "user", "content": [_text("go")]}]}),
]


@pytest.mark.parametrize("request_, expected", [c[1:] for c in ANTHROPIC_BODIES],
                         ids=[c[0] for c in ANTHROPIC_BODIES])
def test_anthropic_body(request_: ChatRequest, expected: dict[str, Any]) -> None:
    body = am.build_body(request_)
    assert body == expected
    orjson.dumps(body, default=dict)


# --- same-dialect pass-through ----------------------------------------------------

OPENAI_RAW = {"model": "alias", "messages": [{"role": "user", "content": "hi"}],
              "frequency_penalty": 0.5, "logit_bias": {"50256": -100}, "service_tier": "flex",
              "stream": True, "stream_options": {"include_obfuscation": False}}
ANTHROPIC_RAW = {"model": "alias", "max_tokens": 64000, "stream": True,
                 "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
                 "messages": [{"role": "user", "content": "hi"}],
                 "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
                 "output_config": {"effort": "high"}, "thinking": {"type": "adaptive"}}

# service_tier is not passed on by default (the worker's pass_fields can allow it)
_OPENAI_KEPT = {k: v for k, v in OPENAI_RAW.items() if k != "service_tier"}
PASSTHROUGH = [
    ("openai streaming", oc.build_body, "openai_chat", OPENAI_RAW, True,
     {**_OPENAI_KEPT, "model": "up-model",
      "stream_options": {"include_obfuscation": False, "include_usage": True}}),
    ("openai non-streaming drops stream_options", oc.build_body, "openai_chat", OPENAI_RAW, False,
     {k: v for k, v in _OPENAI_KEPT.items() if k != "stream_options"}
     | {"model": "up-model", "stream": False}),
    ("anthropic streaming", am.build_body, "anthropic", ANTHROPIC_RAW, True,
     {**ANTHROPIC_RAW, "model": "up-model"}),
    ("anthropic non-streaming", am.build_body, "anthropic", ANTHROPIC_RAW, False,
     {**ANTHROPIC_RAW, "model": "up-model", "stream": False}),
]


@pytest.mark.parametrize("build, dialect, raw, stream, expected", [c[1:] for c in PASSTHROUGH],
                         ids=[c[0] for c in PASSTHROUGH])
def test_same_dialect_passes_raw_through(build: Any, dialect: str, raw: dict[str, Any],
                                         stream: bool, expected: dict[str, Any]) -> None:
    before = copy.deepcopy(raw)
    request = req(user("ignored: raw wins"), dialect=dialect, raw=raw, stream=stream)
    assert build(request) == expected
    assert raw == before  # never mutated


ANTHROPIC_EXTRAS = {"mcp_servers": [{"type": "url", "url": "https://mcp.example/sse", "name": "x"}],
                    "service_tier": "auto", "container": "c1", "inference_geo": "us"}


def test_pass_through_drops_what_the_operator_did_not_allow() -> None:
    raw = {**ANTHROPIC_RAW, **ANTHROPIC_EXTRAS}
    body = am.build_body(req(user("x"), dialect="anthropic", raw=raw, stream=True))
    assert body == {**ANTHROPIC_RAW, "model": "up-model"}
    widened = PassPolicy(pass_fields=frozenset({"service_tier", "mcp_servers"}))
    body = am.build_body(req(user("x"), dialect="anthropic", raw=raw, stream=True), widened)
    assert body["service_tier"] == "auto" and body["mcp_servers"] == raw["mcp_servers"]
    assert "container" not in body
    raw = {**OPENAI_RAW, "store": True, "metadata": {"a": "b"}, "web_search_options": {}}
    body = oc.build_body(req(user("x"), dialect="openai_chat", raw=raw, stream=True))
    assert not {"store", "metadata", "service_tier", "web_search_options"} & body.keys()
    searching = PassPolicy(server_tools=frozenset({"web_search"}))
    body = oc.build_body(req(user("x"), dialect="openai_chat", raw=raw, stream=True), searching)
    assert "web_search_options" in body and "store" not in body


@pytest.mark.parametrize("tool_type", ["web_fetch_20250910", "code_execution_20250825",
                                       "web_search_20250305", "mcp_toolset"])
def test_server_tools_need_the_operators_consent(tool_type: str) -> None:
    raw = {**ANTHROPIC_RAW, "tools": [{"name": "f", "input_schema": {"type": "object"}},
                                      {"type": tool_type, "name": "s"}]}
    request = req(user("x"), dialect="anthropic", raw=raw)
    with pytest.raises(BadRequest) as info:
        am.build_body(request)
    assert info.value.param == "tools[1].type" and tool_type in info.value.message
    base = tool_type.rsplit("_", 1)[0] if tool_type[-1].isdigit() else tool_type
    allowed = PassPolicy(server_tools=frozenset({base}))
    assert am.build_body(request, allowed)["tools"] == raw["tools"]
    openai_raw = {**OPENAI_RAW, "tools": [{"type": "web_search"}]}
    with pytest.raises(BadRequest):
        oc.build_body(req(user("x"), dialect="openai_chat", raw=openai_raw))


def test_betas_are_filtered_to_the_allowed_ones() -> None:
    claude_code = ("claude-code-20250219,context-1m-2025-08-07,interleaved-thinking-2025-05-14,"
                   "thinking-token-count-2026-05-13,context-management-2025-06-27,"
                   "prompt-caching-scope-2026-01-05,mid-conversation-system-2026-04-07,"
                   "effort-2025-11-24")
    policy = PassPolicy()
    assert policy.betas(claude_code) == claude_code
    assert policy.betas("web-fetch-2025-09-10,code-execution-2025-08-25,mcp-client-2025-04-04,"
                        "effort-2025-11-24") == "effort-2025-11-24"
    assert policy.betas("files-api-2025-04-14") is None
    assert PassPolicy(pass_betas=frozenset({"web-fetch"})).betas("web-fetch-2025-09-10") == \
        "web-fetch-2025-09-10"


def test_other_dialect_is_translated_not_passed_through() -> None:
    request = req(user("hi"), dialect="anthropic", raw=ANTHROPIC_RAW)
    assert "context_management" not in oc.build_body(request)
    request = req(user("hi"), dialect="openai_chat", raw=OPENAI_RAW)
    assert "logit_bias" not in am.build_body(request)


# --- upstream streams -> events ----------------------------------------------------

def _sse(*payloads: Any, event: bool = False) -> bytes:
    out = b""
    for p in payloads:
        data = p if isinstance(p, bytes) else orjson.dumps(p)
        name = b"event: " + p["type"].encode() + b"\n" if event and isinstance(p, dict) else b""
        out += name + b"data: " + data + b"\n\n"
    return out


def _chunk(delta: dict[str, Any] | None = None, **choice: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                            "model": "up-model"}
    body["choices"] = [] if delta is None else [{"index": 0, "delta": delta,
                                                 "finish_reason": None, **choice}]
    return body


TOP = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105]}
OPENAI_STREAM = (
    b": keep-alive\r\n\r\n"
    + _sse(_chunk({"role": "assistant", "content": ""}),
           _chunk({"reasoning_content": "Hmm, "}),
           _chunk({"reasoning": "ok."}),
           _chunk({"content": "Hi"}, logprobs={"content": [
               {**TOP, "top_logprobs": [TOP, {"token": "Hey", "logprob": -2.5, "bytes": None}]}]}),
           _chunk({"content": " \u00e9t\u00e9 \U0001F600"}),
           _chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                   "function": {"name": "weather", "arguments": ""}}]}),
           _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
           _chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                   "function": {"name": "time", "arguments": "{}"}}]}),
           _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
           _chunk({}, finish_reason="tool_calls"))
    + _sse({**_chunk(), "usage": {"prompt_tokens": 12, "completion_tokens": 9,
                                  "prompt_tokens_details": {"cached_tokens": 4},
                                  "completion_tokens_details": {"reasoning_tokens": 3}}})
    + b"data: [DONE]\n\n"
)
OPENAI_EVENTS = [
    Start("chatcmpl-1", "up-model"),
    ReasoningDelta("Hmm, "), ReasoningDelta("ok."),
    TextDelta("Hi"),
    Logprobs((TokenLogprob("Hi", -0.1, bytes=(72, 105), top=(("Hi", -0.1), ("Hey", -2.5))),)),
    TextDelta(" \u00e9t\u00e9 \U0001F600"),
    ToolCallStart(0, "call_a", "weather"), ToolCallDelta(0, '{"city":'),
    ToolCallStart(1, "call_b", "time"), ToolCallDelta(1, "{}"),
    ToolCallDelta(0, '"Paris"}'),
    ToolCallEnd(0), ToolCallEnd(1), Finish("tool_calls"),
    Usage(input_tokens=12, output_tokens=9, cached_tokens=4, reasoning_tokens=3),
]


def _ev(kind: str, **data: Any) -> dict[str, Any]:
    return {"type": kind, **data}


def _delta(index: int, **delta: Any) -> dict[str, Any]:
    return _ev("content_block_delta", index=index, delta=delta)


SIG = "EqQBCkYIBxgCKkCq+/=="
ANTHROPIC_STREAM = _sse(
    _ev("message_start", message={
        "id": "msg_1", "type": "message", "role": "assistant", "model": "up-model",
        "content": [], "stop_reason": None,
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 100,
                  "cache_creation_input_tokens": 20, "output_tokens": 1}}),
    _ev("ping"),
    _ev("content_block_start", index=0,
        content_block={"type": "thinking", "thinking": "", "signature": ""}),
    _delta(0, type="thinking_delta", thinking="Let me "),
    _delta(0, type="thinking_delta", thinking="see."),
    _delta(0, type="signature_delta", signature=SIG[:8]),
    _delta(0, type="signature_delta", signature=SIG[8:]),
    _ev("content_block_stop", index=0),
    _ev("content_block_start", index=1,
        content_block={"type": "redacted_thinking", "data": "UkVEQUNURUQ="}),
    _ev("content_block_stop", index=1),
    _ev("content_block_start", index=2, content_block={"type": "text", "text": ""}),
    _delta(2, type="text_delta", text="Caf\u00e9 \U0001F600"),
    _delta(2, type="citations_delta", citation={}),
    _ev("content_block_stop", index=2),
    _ev("content_block_start", index=3, content_block={
        "type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}),
    _delta(3, type="input_json_delta", partial_json=""),
    _delta(3, type="input_json_delta", partial_json='{"city": '),
    _delta(3, type="input_json_delta", partial_json='"Paris"}'),
    _ev("content_block_stop", index=3),
    _ev("content_block_start", index=4, content_block={
        "type": "tool_use", "id": "toolu_2", "name": "now", "input": {}}),
    _ev("content_block_stop", index=4),
    _ev("message_delta", delta={"stop_reason": "tool_use", "stop_sequence": None},
        usage={"output_tokens": 42}),
    _ev("message_stop"),
    event=True,
)
ANTHROPIC_EVENTS = [
    Start("msg_1", "up-model"),
    Usage(input_tokens=130, output_tokens=1, cached_tokens=100, cache_creation_tokens=20),
    ReasoningDelta("Let me "), ReasoningDelta("see."), ReasoningEnd(signature=SIG),
    ReasoningEnd(redacted_data="UkVEQUNURUQ="),
    TextDelta("Caf\u00e9 \U0001F600"),
    ToolCallStart(3, "toolu_1", "weather"), ToolCallDelta(3, '{"city": '),
    ToolCallDelta(3, '"Paris"}'), ToolCallEnd(3),
    ToolCallStart(4, "toolu_2", "now"), ToolCallDelta(4, "{}"), ToolCallEnd(4),
    Finish("tool_calls"), Usage(output_tokens=42),
]


def parse(parser_cls: Any, chunks: list[bytes]) -> tuple[list[Any], bool]:
    parser, decoder, events = parser_cls(), SSEDecoder(), []
    for chunk in [*chunks, b""]:
        for frame in decoder.feed(chunk) if chunk else decoder.close():
            if not parser.done:
                events.extend(parser.feed(frame.data))
    return events, parser.done


STREAMS = [("openai", oc.StreamParser, OPENAI_STREAM, OPENAI_EVENTS),
           ("anthropic", am.StreamParser, ANTHROPIC_STREAM, ANTHROPIC_EVENTS)]


@pytest.mark.parametrize("parser_cls, raw, expected", [s[1:] for s in STREAMS],
                         ids=[s[0] for s in STREAMS])
def test_stream_split_at_every_byte_boundary(parser_cls: Any, raw: bytes,
                                             expected: list[Any]) -> None:
    assert parse(parser_cls, [raw]) == (expected, True)
    for cut in range(1, len(raw)):
        assert parse(parser_cls, [raw[:cut], raw[cut:]]) == (expected, True), cut
    one_by_one = [raw[i:i + 1] for i in range(len(raw))]
    assert parse(parser_cls, one_by_one) == (expected, True)


@pytest.mark.parametrize("parser_cls, raw", [(s[1], s[2]) for s in STREAMS],
                         ids=[s[0] for s in STREAMS])
def test_stream_without_terminal_event_is_not_done(parser_cls: Any, raw: bytes) -> None:
    terminal = b"data: [DONE]\n\n" if parser_cls is oc.StreamParser else _sse(
        _ev("message_stop"), event=True)
    events, done = parse(parser_cls, [raw.replace(terminal, b"")])
    assert events and not done


PARSER_CASES = [
    ("openai: arguments before the name are held back",
     oc.StreamParser,
     [_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}),
      _chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f",
                                                                  "arguments": ":1}"}}]}),
      b"[DONE]"],
     [Start("chatcmpl-1", "up-model"), ToolCallStart(0, "c1", "f"), ToolCallDelta(0, '{"a"'),
      ToolCallDelta(0, ":1}"), ToolCallEnd(0)]),
    ("openai: vLLM names the matched stop string",
     oc.StreamParser,
     [_chunk({"content": "a"}, finish_reason="stop", stop_reason="END"), b"[DONE]"],
     [Start("chatcmpl-1", "up-model"), TextDelta("a"), Finish("stop_sequence", "END")]),
    ("openai: finish reasons",
     oc.StreamParser,
     [_chunk({}, finish_reason="length"), _chunk({}, finish_reason="content_filter"),
      _chunk({}, finish_reason="function_call"), _chunk({}, finish_reason="stop")],
     [Start("chatcmpl-1", "up-model"), Finish("length"), Finish("content_filter"),
      Finish("tool_calls"), Finish("stop")]),
    ("anthropic: stop reasons",
     am.StreamParser,
     [_ev("message_delta", delta={"stop_reason": r, "stop_sequence": s})
      for r, s in [("end_turn", None), ("max_tokens", None), ("stop_sequence", "###"),
                   ("refusal", None), ("pause_turn", None)]],
     [Finish("stop"), Finish("length"), Finish("stop_sequence", "###"),
      Finish("content_filter"), Finish("stop")]),
    ("anthropic: text in block starts and unknown events",
     am.StreamParser,
     [_ev("content_block_start", index=0, content_block={"type": "text", "text": "pre"}),
      _ev("content_block_start", index=1, content_block={"type": "web_search_tool_result"}),
      _ev("content_block_stop", index=1), _ev("some_future_event")],
     [TextDelta("pre")]),
]


@pytest.mark.parametrize("parser_cls, payloads, expected", [c[1:] for c in PARSER_CASES],
                         ids=[c[0] for c in PARSER_CASES])
def test_parser_cases(parser_cls: Any, payloads: list[Any], expected: list[Any]) -> None:
    parser, events = parser_cls(), []
    for p in payloads:
        events.extend(parser.feed(p.decode() if isinstance(p, bytes) else orjson.dumps(p).decode()))
    assert events == expected


STREAM_ERRORS = [
    ("anthropic overloaded", am.StreamParser,
     _ev("error", error={"type": "overloaded_error", "message": "Overloaded"}),
     UpstreamError, 529, "overloaded", "Overloaded"),
    ("anthropic rate limit", am.StreamParser,
     _ev("error", error={"type": "rate_limit_error", "message": "slow down"}),
     UpstreamError, 429, "rate_limit", "slow down"),
    ("anthropic api error hides the text", am.StreamParser,
     _ev("error", error={"type": "api_error", "message": "db at 10.0.0.3 down"}),
     UpstreamUnavailable, 502, "upstream", "upstream reported api_error"),
    ("anthropic timeout", am.StreamParser,
     _ev("error", error={"type": "timeout_error", "message": "t"}),
     UpstreamTimeout, 504, "timeout", "upstream timed out (HTTP 504)"),
    ("openai error chunk with a numeric code (vLLM)", oc.StreamParser,
     {"error": {"message": "too long", "type": "BadRequestError", "code": 400}},
     UpstreamError, 400, "invalid_request", "too long"),
    ("openai server error chunk", oc.StreamParser,
     {"error": {"message": "CUDA OOM", "type": "server_error", "code": None}},
     UpstreamUnavailable, 502, "upstream", "upstream reported server_error"),
]


@pytest.mark.parametrize("parser_cls, payload, cls, status, kind, message",
                         [c[1:] for c in STREAM_ERRORS], ids=[c[0] for c in STREAM_ERRORS])
def test_errors_inside_a_stream_raise(parser_cls: Any, payload: Any, cls: type, status: int,
                                      kind: str, message: str) -> None:
    with pytest.raises(cls) as info:
        parser_cls().feed(orjson.dumps(payload).decode())
    assert (info.value.status, info.value.kind, info.value.message) == (status, kind, message)


@pytest.mark.parametrize("parser_cls", [oc.StreamParser, am.StreamParser])
@pytest.mark.parametrize("data", ["{not json", "[1, 2]"])
def test_garbage_in_a_stream_is_an_upstream_failure(parser_cls: Any, data: str) -> None:
    with pytest.raises(UpstreamUnavailable):
        parser_cls().feed(data)


# --- non-streaming bodies -> events ------------------------------------------------

BODIES = [
    ("openai text with reasoning and logprobs", oc.body_events,
     {"id": "chatcmpl-9", "model": "up-model", "choices": [{
         "index": 0, "finish_reason": "stop",
         "message": {"role": "assistant", "content": "Hi", "reasoning_content": "think"},
         "logprobs": {"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                                   "top_logprobs": []}]}}],
      "usage": {"prompt_tokens": 5, "completion_tokens": 1}},
     [Start("chatcmpl-9", "up-model"), ReasoningDelta("think"), TextDelta("Hi"),
      Logprobs((TokenLogprob("Hi", -0.5, bytes=(72, 105)),)),
      Usage(input_tokens=5, output_tokens=1), Finish("stop")]),
    ("openai tool calls", oc.body_events,
     {"id": "c", "model": "m", "choices": [{"finish_reason": "tool_calls", "message": {
         "role": "assistant", "content": None, "tool_calls": [
             {"id": "call_1", "type": "function",
              "function": {"name": "f", "arguments": '{"x":1}'}},
             {"id": "call_2", "type": "custom", "custom": {"name": "patch", "input": "diff"}}]}}]},
     [Start("c", "m"), ToolCallStart(0, "call_1", "f"), ToolCallDelta(0, '{"x":1}'),
      ToolCallEnd(0), ToolCallStart(1, "call_2", "patch", "custom"), ToolCallDelta(1, "diff"),
      ToolCallEnd(1), Finish("tool_calls")]),
    ("anthropic everything", am.body_events,
     {"id": "msg_9", "type": "message", "model": "up-model", "content": [
         {"type": "thinking", "thinking": "hmm", "signature": SIG},
         {"type": "redacted_thinking", "data": "UkVE"},
         {"type": "text", "text": "Let me check."},
         {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}],
      "stop_reason": "tool_use", "stop_sequence": None,
      "usage": {"input_tokens": 3, "cache_read_input_tokens": 7, "output_tokens": 11}},
     [Start("msg_9", "up-model"), ReasoningDelta("hmm"), ReasoningEnd(signature=SIG),
      ReasoningEnd(redacted_data="UkVE"), TextDelta("Let me check."),
      ToolCallStart(3, "toolu_1", "weather"), ToolCallDelta(3, '{"city":"Paris"}'),
      ToolCallEnd(3), Usage(input_tokens=10, output_tokens=11, cached_tokens=7),
      Finish("tool_calls")]),
    ("anthropic stop sequence", am.body_events,
     {"id": "msg_8", "model": "m", "content": [{"type": "text", "text": "a"}],
      "stop_reason": "stop_sequence", "stop_sequence": "END", "usage": {}},
     [Start("msg_8", "m"), TextDelta("a"), Finish("stop_sequence", "END")]),
]


@pytest.mark.parametrize("convert, body, expected", [c[1:] for c in BODIES],
                         ids=[c[0] for c in BODIES])
def test_body_events(convert: Any, body: dict[str, Any], expected: list[Any]) -> None:
    assert convert(body) == expected


def test_error_bodies_raise() -> None:
    with pytest.raises(UpstreamError) as info:
        am.body_events({"type": "error", "error": {"type": "not_found_error", "message": "nope"}})
    assert (info.value.status, info.value.kind) == (404, "not_found")
    with pytest.raises(UpstreamUnavailable):
        oc.body_events(["not", "an", "object"])


# --- HTTP refusals -> exceptions -----------------------------------------------------

KEY = "sk-secret-123456"
REFUSALS = [
    ("openai 400 names param and code", 400,
     {"error": {"message": "bad", "type": "invalid_request_error", "param": "messages[0]",
                "code": "context_length_exceeded"}}, {},
     UpstreamError, 400, "invalid_request", "bad", "messages[0]", None),
    ("anthropic 404", 404, {"type": "error", "error": {"type": "not_found_error",
                                                       "message": "model: x"}}, {},
     UpstreamError, 404, "not_found", "model: x", None, None),
    ("401 is the gateway's credentials, not the client's", 401,
     {"error": {"message": f"Incorrect API key provided: {KEY}"}}, {},
     UpstreamCredentialsRefused, 502, "upstream", "upstream credentials refused", None, None),
    ("403 likewise", 403, {"type": "error", "error": {"type": "permission_error",
                                                      "message": "sk-ant-****wxyz denied"}}, {},
     UpstreamCredentialsRefused, 502, "upstream", "upstream credentials refused", None, None),
    ("400 message is scrubbed of the key and of masked keys", 400,
     {"error": {"message": f"bad {KEY}; also sk-proj-******abcd. and Bearer zz9"}}, {},
     UpstreamError, 400, "invalid_request", "bad ***; also ***. and ***", None, None),
    ("429 with retry-after", 429, {"error": {"message": "slow"}}, {"retry-after": "7"},
     UpstreamError, 429, "rate_limit", "slow", None, 7.0),
    ("529 with retry-after-ms", 529, {"type": "error", "error": {
        "type": "overloaded_error", "message": "Overloaded"}}, {"retry-after-ms": "1500"},
     UpstreamError, 529, "overloaded", "Overloaded", None, 1.5),
    ("FastAPI detail", 422, {"detail": "field required"}, {},
     UpstreamError, 422, "invalid_request", "field required", None, None),
    ("no envelope", 404, b"<html>not here</html>", {},
     UpstreamError, 404, "not_found", "upstream u refused the request (HTTP 404)", None, None),
    ("5xx hides the body", 500, {"error": {"message": f"trace with {KEY}"}}, {},
     UpstreamUnavailable, 502, "upstream", "upstream u failed (HTTP 500)", None, None),
    ("503 keeps retry-after", 503, b"busy", {"retry-after": "2"},
     UpstreamUnavailable, 502, "upstream", "upstream u failed (HTTP 503)", None, 2.0),
]


@pytest.mark.parametrize("status, body, headers, cls, out_status, kind, message, param, retry",
                         [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_refusals(status: int, body: Any, headers: dict[str, str], cls: type, out_status: int,
                  kind: str, message: str, param: str | None, retry: float | None) -> None:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    exc = error_from_body(status, raw, headers, upstream="upstream u", secret=KEY)
    assert type(exc) is cls
    assert (exc.status, exc.kind, exc.message, exc.param, exc.retry_after) == (
        out_status, kind, message, param, retry)
    assert KEY not in str(exc)


def test_retry_after_as_http_date() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= parse_retry_after({"retry-after": when}) <= 31
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


def test_scrub_and_object_errors() -> None:
    assert scrub("key sk-1 and sk-1", "sk-1") == "key *** and ***"
    assert scrub("nothing", None) == "nothing"
    exc = error_from_object({"error": "plain string"})
    assert type(exc) is UpstreamUnavailable


def test_in_stream_errors_are_scrubbed_and_credential_ones_are_ours() -> None:
    refused = error_from_object({"error": {"message": "Incorrect API key provided: sk-pro****abcd",
                                           "type": "invalid_request_error",
                                           "code": "invalid_api_key"}})
    assert type(refused) is UpstreamCredentialsRefused and refused.status == 502
    assert type(error_from_object({"type": "error", "error": {
        "type": "permission_error", "message": "key sk-ant-api03-xx** lacks access"}})) \
        is UpstreamCredentialsRefused
    exc = error_from_object({"type": "error", "error": {
        "type": "invalid_request_error", "message": "bad sk-ant-api03-AbC***wxyz here"}})
    assert exc.status == 400 and exc.message == "bad *** here" and "sk-" not in str(exc)
