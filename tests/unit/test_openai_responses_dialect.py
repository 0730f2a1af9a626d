"""The OpenAI Responses dialect: decode, encode, stream events; and the remote
workers' custom-tool mapping that lets a chat-only upstream serve custom tools.

Encoded output is also fed to the real ``openai`` SDK through an in-memory
transport (strict response validation on), so "valid" means "the SDK parses it".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.dialects import openai_responses as responses
from app.dialects.openai_responses_decode import NAMESPACE_SEPARATOR
from pool.accumulate import fold
from pool.errors import BadRequest, UpstreamUnavailable
from pool.model import (
    ChatRequest, Completion, Event, Finish, ImagePart, Message, ReasoningDelta, ReasoningEnd,
    ReasoningPart, ResponseFormat, Start, TextDelta, TextPart, Tool, ToolCallDelta, ToolCallEnd,
    ToolCallPart, ToolCallStart, ToolChoice, ToolResultPart, Usage,
)
from pool.remote import anthropic_messages as am
from pool.remote import openai_chat as oc
from pool.sse import SSEDecoder

from tests.support.paths import FIXTURES

TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
USER = {"role": "user", "content": "hi"}
WEATHER = {"type": "function", "name": "weather", "description": "Weather by city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
           "strict": False}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
AGENTS = {"type": "namespace", "name": "agents", "description": "Sub-agents",
          "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object"}}]}


def body(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "m", "input": [USER]}
    out.update(fields)
    return out


def responses_fixtures() -> list[Path]:
    return [p for p in sorted(FIXTURES.glob("*.json"))
            if json.loads(p.read_text()).get("path") == "/v1/responses"]


# --- decode: recorded client requests -------------------------------------------------

@pytest.mark.parametrize("path", responses_fixtures(), ids=lambda p: p.stem)
def test_every_recorded_responses_request_decodes(path: Path) -> None:
    record = json.loads(path.read_text())
    raw = record["body"]
    request = responses.decode(raw, record["headers"])
    assert request.raw is raw
    assert request.dialect == "openai_responses"
    assert request.model == raw["model"] and request.stream is bool(raw.get("stream"))
    offered = []  # (name, kind); a namespace's members flattened to "<namespace>__<member>"
    for tool in raw.get("tools", ()):
        if tool["type"] in ("function", "custom"):
            offered.append((tool["name"], tool["type"]))
        elif tool["type"] == "namespace":
            offered += [(tool["name"] + NAMESPACE_SEPARATOR + m["name"], m.get("type", "function"))
                        for m in tool.get("tools", ()) if m.get("type", "function")
                        in ("function", "custom")]
    assert [(t.name, t.kind) for t in request.tools] == offered
    assert request.messages and all(m.parts for m in request.messages)
    items = raw["input"] if isinstance(raw["input"], list) else [raw["input"]]
    calls = [i for i in items if isinstance(i, dict)
             and i.get("type") in ("function_call", "custom_tool_call")]
    decoded = [p for m in request.messages for p in m.parts if type(p) is ToolCallPart]
    assert [c.id for c in decoded] == [c["call_id"] for c in calls]
    if raw.get("prompt_cache_key"):
        assert request.prompt_cache_key == raw["prompt_cache_key"]
    if record["path"] and "session-id" in record["headers"]:
        assert request.session_id == record["headers"]["session-id"]


def test_recorded_responses_fixtures_exist() -> None:
    assert len(responses_fixtures()) >= 9


def test_codex_reasoning_turn_keeps_encrypted_content_on_the_assistant_turn() -> None:
    raw = json.loads((FIXTURES / "codex-responses-reasoning-02-POST-v1_responses.json")
                     .read_text())["body"]
    request = responses.decode(raw)
    assistant, results = request.messages[-2:]
    reasoning, call = assistant.parts
    assert reasoning == ReasoningPart("**Thinking**\n\nLet me think about this.",
                                      encrypted_content=raw["input"][4]["encrypted_content"],
                                      id="rs_abfbbc2c79a74315b64f065a")
    assert call == ToolCallPart(raw["input"][5]["call_id"], "exec_command",
                                '{"cmd": "cat hello.txt"}')
    assert results.role == "user" and type(results.parts[0]) is ToolResultPart
    assert [m.role for m in request.messages[:2]] == ["developer", "developer"]
    assert request.reasoning_effort is None and request.tool_choice == ToolChoice("auto",
                                                                                  parallel=True)


# --- decode: tables -------------------------------------------------------------------------

DECODED = [
    ("string input and instructions",
     {"model": "m", "input": "Say hi", "instructions": "Be brief"},
     [Message("system", (TextPart("Be brief"),)), Message("user", (TextPart("Say hi"),))]),
    ("parts, images, developer, assistant history",
     body(input=[
         {"type": "message", "role": "developer", "content": [{"type": "input_text",
                                                              "text": "dev"}]},
         {"role": "user", "content": [
             {"type": "input_text", "text": "look"},
             {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "low"},
             {"type": "input_image", "image_url": "https://x.test/a.png"}]},
         {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
          "content": [{"type": "output_text", "text": "A cat.", "annotations": []}]}]),
     [Message("developer", (TextPart("dev"),)),
      Message("user", (TextPart("look"), ImagePart(data="iVBO", media_type="image/png",
                                                   detail="low"),
                       ImagePart(url="https://x.test/a.png"))),
      Message("assistant", (TextPart("A cat."),))]),
    ("reasoning, calls of both kinds, outputs grouped",
     body(input=[
         USER,
         {"type": "reasoning", "id": "rs_1", "encrypted_content": "ENC",
          "summary": [{"type": "summary_text", "text": "a"},
                      {"type": "summary_text", "text": "b"}]},
         {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
         {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "P"},
         {"type": "function_call", "call_id": "c3", "name": "spawn", "namespace": "agents",
          "arguments": "{}"},
         {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
         {"type": "custom_tool_call_output", "call_id": "c2",
          "output": [{"type": "input_text", "text": "ok"}]},
         {"type": "web_search_call", "id": "ws_1", "status": "completed"},
         {"role": "user", "content": "thanks"}]),
     [Message("user", (TextPart("hi"),)),
      Message("assistant", (ReasoningPart("a\n\nb", encrypted_content="ENC", id="rs_1"),
                            ToolCallPart("c1", "weather", "{}"),
                            ToolCallPart("c2", "apply_patch", "P", "custom"),
                            ToolCallPart("c3", "agents__spawn", "{}"))),
      Message("user", (ToolResultPart("c1", (TextPart("sunny"),)),
                       ToolResultPart("c2", (TextPart("ok"),)))),
      Message("user", (TextPart("thanks"),))]),
    ("Anthropic thinking carried in encrypted_content comes back out of it",
     body(input=[
         USER,
         {"type": "reasoning", "id": "rs_1", "encrypted_content": "anthropic-thinking:SIG==",
          "summary": [{"type": "summary_text", "text": "hm"}]},
         {"type": "reasoning", "id": "rs_2", "encrypted_content": "anthropic-redacted:RED",
          "summary": []},
         {"role": "assistant", "content": "ok"}]),
     [Message("user", (TextPart("hi"),)),
      Message("assistant", (ReasoningPart("hm", signature="SIG==", id="rs_1"),
                            ReasoningPart("", redacted_data="RED", id="rs_2"),
                            TextPart("ok")))]),
]


@pytest.mark.parametrize("raw, expected", [c[1:] for c in DECODED], ids=[c[0] for c in DECODED])
def test_decode_messages(raw: dict[str, Any], expected: list[Message]) -> None:
    assert list(responses.decode(raw).messages) == expected


def test_decode_tools_options_and_history() -> None:
    raw = body(tools=[WEATHER, PATCH, AGENTS, {"type": "web_search"}, {"type": "mcp"}],
               tool_choice={"type": "custom", "name": "apply_patch"},
               parallel_tool_calls=False, text={"format": {"type": "json_schema", "name": "a",
                                                           "schema": {"type": "object"},
                                                           "strict": True},
                                                "verbosity": "low"},
               reasoning={"effort": "high", "summary": "auto"}, max_output_tokens=99,
               temperature=0.5, top_p=0.9, metadata={"k": "v"}, include=["x"], user="u",
               prompt_cache_key="pck", store=False, previous_response_id="resp_1",
               truncation="auto", service_tier="auto", client_metadata={"session_id": "s1"},
               something_new={"a": 1})
    history = [{"type": "message", "role": "user", "id": "msg_0",
                "content": [{"type": "input_text", "text": "before"}]},
               {"type": "message", "role": "assistant", "id": "msg_a", "status": "completed",
                "content": [{"type": "output_text", "text": "earlier", "annotations": []}]}]
    request = responses.decode(raw, {}, history=history)
    assert request.tools == (
        Tool("weather", "Weather by city", WEATHER["parameters"], strict=False),
        Tool("apply_patch", "Apply a patch\n\nThe input must match this lark grammar:\n"
             "start: /.+/", kind="custom"),
        Tool("agents__spawn", "Sub-agents", {"type": "object"}))
    assert request.tool_choice == ToolChoice("named", "apply_patch", False)
    assert request.response_format == ResponseFormat("json_schema", {"type": "object"}, "a", True)
    assert request.reasoning_effort == "high"
    s = request.sampling
    assert (s.max_tokens, s.temperature, s.top_p) == (99, 0.5, 0.9)
    assert (request.user, request.prompt_cache_key, request.session_id) == ("u", "pck", "s1")
    assert request.metadata == {"k": "v"}
    assert request.messages == (Message("user", (TextPart("before"),)),
                                Message("assistant", (TextPart("earlier"),)),
                                Message("user", (TextPart("hi"),)))


def items(*entries: Any) -> dict[str, Any]:
    return body(input=list(entries))


BAD_BODIES = [
    ("not an object", [1], None),
    ("no model", {"input": "x"}, "model"),
    ("empty model", body(model=""), "model"),
    ("no input", {"model": "m"}, "input"),
    ("input wrong type", body(input=5), "input"),
    ("item not object", items(USER, "x"), "input[1]"),
    ("item without type or role", items({"content": "x"}), "input[0].type"),
    ("unknown item type", items({"type": "teleport"}), "input[0].type"),
    ("bad role", items({"role": "robot", "content": "x"}), "input[0].role"),
    ("no content", items({"role": "user"}), "input[0].content"),
    ("content wrong type", items({"role": "user", "content": 3}), "input[0].content"),
    ("part without type", items({"role": "user", "content": [{"text": "x"}]}),
     "input[0].content[0].type"),
    ("text not string", items({"role": "user", "content": [{"type": "input_text", "text": 1}]}),
     "input[0].content[0].text"),
    ("image by file id", items({"role": "user", "content": [{"type": "input_image",
                                                             "file_id": "file-1"}]}),
     "input[0].content[0].file_id"),
    ("image bad url", items({"role": "user", "content": [{"type": "input_image",
                                                          "image_url": "ftp://x"}]}),
     "input[0].content[0].image_url"),
    ("image in system", items({"role": "system", "content": [{"type": "input_image",
                                                              "image_url": "https://x"}]}),
     "input[0].content[0]"),
    ("file part", items({"role": "user", "content": [{"type": "input_file"}]}),
     "input[0].content[0]"),
    ("call without call_id", items(USER, USER, USER,
                                   {"type": "function_call", "name": "f", "arguments": "{}"}),
     "input[3].call_id"),
    ("call arguments not string", items({"type": "function_call", "call_id": "c", "name": "f",
                                         "arguments": {}}), "input[0].arguments"),
    ("custom call without input", items({"type": "custom_tool_call", "call_id": "c",
                                         "name": "f"}), "input[0].input"),
    ("output without call_id", items({"type": "function_call_output", "output": "x"}),
     "input[0].call_id"),
    ("output wrong type", items({"type": "function_call_output", "call_id": "c", "output": 1}),
     "input[0].output"),
    ("reasoning summary not list", items({"type": "reasoning", "summary": "x"}),
     "input[0].summary"),
    ("reasoning encrypted not string", items({"type": "reasoning", "summary": [],
                                              "encrypted_content": 1}),
     "input[0].encrypted_content"),
    ("instructions not string", body(instructions=["x"]), "instructions"),
    ("tools not list", body(tools={}), "tools"),
    ("tool not object", body(tools=["x"]), "tools[0]"),
    ("tool without type", body(tools=[{"name": "f"}]), "tools[0].type"),
    ("function without name", body(tools=[{"type": "function"}]), "tools[0].name"),
    ("parameters not object", body(tools=[{"type": "function", "name": "f", "parameters": 1}]),
     "tools[0].parameters"),
    ("namespace member without name", body(tools=[{"type": "namespace", "name": "n",
                                                   "tools": [{"type": "function"}]}]),
     "tools[0].tools[0].name"),
    ("bad tool_choice string", body(tool_choice="always"), "tool_choice"),
    ("forcing a hosted tool", body(tool_choice={"type": "web_search"}), "tool_choice"),
    ("named choice without name", body(tool_choice={"type": "function"}), "tool_choice.name"),
    ("parallel_tool_calls not bool", body(parallel_tool_calls="yes"), "parallel_tool_calls"),
    ("text.format bad type", body(text={"format": {"type": "yaml"}}), "text.format.type"),
    ("json_schema without name", body(text={"format": {"type": "json_schema", "schema": {}}}),
     "text.format.name"),
    ("reasoning not object", body(reasoning="high"), "reasoning"),
    ("effort not string", body(reasoning={"effort": 3}), "reasoning.effort"),
    ("max_output_tokens zero", body(max_output_tokens=0), "max_output_tokens"),
    ("temperature too high", body(temperature=3), "temperature"),
    ("top_p wrong type", body(top_p="1"), "top_p"),
    ("metadata not object", body(metadata=[]), "metadata"),
    ("include not list", body(include="x"), "include"),
    ("store not bool", body(store="no"), "store"),
    ("stream not bool", body(stream=1), "stream"),
    ("previous_response_id not string", body(previous_response_id=1), "previous_response_id"),
]


@pytest.mark.parametrize("raw, param", [c[1:] for c in BAD_BODIES], ids=[c[0] for c in BAD_BODIES])
def test_bad_bodies_name_the_parameter(raw: Any, param: str | None) -> None:
    with pytest.raises(BadRequest) as info:
        responses.decode(raw)
    assert info.value.param == param
    assert info.value.message


def test_input_items_keep_and_generate_ids() -> None:
    given = {"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f",
             "arguments": "{}"}
    raw = body(input=[given, {"role": "user", "content": "x"},
                      {"type": "function_call_output", "call_id": "c", "output": "o"}])
    listed = responses.input_items(raw)
    assert listed[0] is given
    assert listed[1]["type"] == "message" and listed[1]["id"].startswith("msg_")
    assert listed[2]["id"].startswith("fco_") and listed[2]["output"] == "o"
    assert "id" not in raw["input"][1]  # the client's body is never touched
    (only,) = responses.input_items({"model": "m", "input": "hey"})
    assert only["content"] == [{"type": "input_text", "text": "hey"}]
    assert only["id"] != responses.input_items({"model": "m", "input": "hey"})[0]["id"]
    # what the store keeps decodes again as history
    request = responses.decode({"model": "m", "input": "next"}, history=listed)
    assert [m.role for m in request.messages] == ["assistant", "user", "user", "user"]


# --- encode_completion ----------------------------------------------------------------------

REQUEST = responses.decode(body(tools=[WEATHER, PATCH, AGENTS], max_output_tokens=50,
                                store=False, reasoning={"effort": "low"}))
USAGE = Usage(input_tokens=10, output_tokens=5, cached_tokens=4, reasoning_tokens=2)


def encode(completion: Completion, request: ChatRequest = REQUEST) -> dict[str, Any]:
    return responses.encode_completion(completion, request, response_id="resp_X", created=7,
                                       model="m")


ENCODED = [
    ("text", Completion(parts=[TextPart("Hello")], finish=Finish("stop"), usage=USAGE),
     "completed", [{"type": "message", "id": "msg_X_0", "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}]),
    ("function and namespaced calls",
     Completion(parts=[ToolCallPart("call_1", "weather", '{"city":"P"}'),
                       ToolCallPart("call_2", "agents__spawn", "{}")],
                finish=Finish("tool_calls")),
     "completed", [{"type": "function_call", "id": "fc_X_0", "call_id": "call_1",
                    "name": "weather", "arguments": '{"city":"P"}', "status": "completed"},
                   {"type": "function_call", "id": "fc_X_1", "call_id": "call_2",
                    "name": "spawn", "arguments": "{}", "status": "completed",
                    "namespace": "agents"}]),
    ("custom tool call by name",
     Completion(parts=[ToolCallPart("call_3", "apply_patch", "*** Begin Patch")]),
     "completed", [{"type": "custom_tool_call", "id": "ctc_X_0", "call_id": "call_3",
                    "name": "apply_patch", "input": "*** Begin Patch"}]),
    ("reasoning with encrypted content; Anthropic's carried in it; empty ones left out",
     Completion(parts=[ReasoningPart("why", encrypted_content="ENC"),
                       ReasoningPart(redacted_data="R"), ReasoningPart(""),
                       ReasoningPart("", encrypted_content="E2"),
                       ReasoningPart("hm", signature="SIG=="), TextPart("ok")]),
     "completed", [{"type": "reasoning", "id": "rs_X_0",
                    "summary": [{"type": "summary_text", "text": "why"}],
                    "encrypted_content": "ENC"},
                   {"type": "reasoning", "id": "rs_X_1", "summary": [],
                    "encrypted_content": "anthropic-redacted:R"},
                   {"type": "reasoning", "id": "rs_X_2", "summary": [],
                    "encrypted_content": "E2"},
                   {"type": "reasoning", "id": "rs_X_3",
                    "summary": [{"type": "summary_text", "text": "hm"}],
                    "encrypted_content": "anthropic-thinking:SIG=="},
                   {"type": "message", "id": "msg_X_4", "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "ok", "annotations": []}]}]),
    ("incomplete", Completion(parts=[TextPart("Hel")], finish=Finish("length")),
     "incomplete", [{"type": "message", "id": "msg_X_0", "status": "completed",
                     "role": "assistant",
                     "content": [{"type": "output_text", "text": "Hel", "annotations": []}]}]),
]


@pytest.mark.parametrize("completion, status, output", [c[1:] for c in ENCODED],
                         ids=[c[0] for c in ENCODED])
def test_encode_completion(completion: Completion, status: str, output: list[Any]) -> None:
    out = encode(completion)
    assert out["status"] == status and out["output"] == output
    assert out["id"] == "resp_X" and out["object"] == "response" and out["created_at"] == 7
    assert out["output_text"] == completion.text
    assert out["incomplete_details"] == ({"reason": "max_output_tokens"}
                                         if status == "incomplete" else None)
    assert out["tools"] == REQUEST.raw["tools"] and out["store"] is False
    assert out["max_output_tokens"] == 50 and out["reasoning"] == {"effort": "low"}
    assert out["error"] is None and out["parallel_tool_calls"] is True


def test_encode_usage() -> None:
    out = encode(Completion(parts=[TextPart("a")], usage=USAGE))
    assert out["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4,
                                                                     "cache_write_tokens": 0},
                            "output_tokens": 5,
                            "output_tokens_details": {"reasoning_tokens": 2},
                            "total_tokens": 15}


# --- stream ---------------------------------------------------------------------------------

def frames(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for event in SSEDecoder().feed(raw):
        data = json.loads(event.data)
        assert event.event == data["type"]
        out.append((event.event, data))
    return out


def run(events: list[Event], request: ChatRequest = REQUEST, *,
        fail: Exception | None = None) -> tuple[bytes, responses.StreamEncoder]:
    enc = responses.StreamEncoder(request, response_id="resp_X", created=7, model="m")
    out = b"".join(enc.feed(e) for e in events)
    out += enc.fail(fail) if fail is not None else enc.close()  # type: ignore[arg-type]
    assert enc.feed(TextDelta("late")) == b"" and enc.close() == b""
    return out, enc


def check_stream(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    got = frames(raw)
    assert [d["sequence_number"] for _, d in got] == list(range(len(got)))
    terminal = [name for name, _ in got if name in TERMINAL]
    assert len(terminal) == 1 and got[-1][0] == terminal[0]
    assert [name for name, _ in got[:2]] == ["response.created", "response.in_progress"]
    return got


def recorded(stem: str) -> list[str]:
    return json.loads((FIXTURES / f"{stem}-POST-v1_responses.json").read_text())[
        "recorder_response"]["sse_events"]


def dedupe(names: list[str]) -> list[str]:
    """Runs of one delta event collapsed: how many deltas come is the model's business."""
    return [n for i, n in enumerate(names) if i == 0 or n != names[i - 1]
            or not n.endswith(".delta")]


TEXT = [Start("x"), TextDelta("Hel"), TextDelta("lo"), Usage(3, 2), Finish("stop")]
CALL = [Start(), ToolCallStart(0, "call_1", "weather"), ToolCallDelta(0, '{"city":'),
        ToolCallDelta(0, '"P"}'), ToolCallEnd(0), Finish("tool_calls")]
REASONED = [Start(), ReasoningDelta("hmm"), ReasoningEnd(encrypted_content="ENC"),
            TextDelta("a"), TextDelta("b"), Finish("stop")]

RECORDED_ORDER = [("text", TEXT, "codex-responses-hi-02"),
                  ("function call", CALL, "codex-responses-tool-02"),
                  ("reasoning then text", REASONED, "codex-responses-reasoning-02")]


@pytest.mark.parametrize("events, stem", [c[1:] for c in RECORDED_ORDER],
                         ids=[c[0] for c in RECORDED_ORDER])
def test_stream_order_matches_recorded_codex_streams(events: list[Event], stem: str) -> None:
    raw, _ = run(events)
    assert dedupe([name for name, _ in check_stream(raw)]) == dedupe(recorded(stem))


def test_stream_text_payloads() -> None:
    raw, enc = run(TEXT)
    got = dict((name, data) for name, data in check_stream(raw))
    delta = got["response.output_text.delta"]
    assert (delta["item_id"], delta["output_index"], delta["content_index"],
            delta["logprobs"]) == ("msg_X_0", 0, 0, [])
    assert got["response.output_text.done"]["text"] == "Hello"
    done = got["response.completed"]["response"]
    assert done == enc.response() and done["output_text"] == "Hello"
    assert done["usage"]["total_tokens"] == 5
    assert got["response.created"]["response"]["status"] == "in_progress"
    assert got["response.created"]["response"]["output"] == []


STREAMS = [
    ("custom tool call", [Start(), ToolCallStart(0, "c", "apply_patch"),
                          ToolCallDelta(0, "*** Begin"), ToolCallDelta(0, " Patch"),
                          Finish("tool_calls")],
     ["response.output_item.added", "response.custom_tool_call_input.delta",
      "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
      "response.output_item.done", "response.completed"]),
    ("custom by kind", [Start(), ToolCallStart(0, "c", "other", "custom"), ToolCallEnd(0)],
     ["response.output_item.added", "response.custom_tool_call_input.done",
      "response.output_item.done", "response.completed"]),
    ("incomplete", [Start(), TextDelta("a"), Finish("length")],
     ["response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done", "response.incomplete"]),
    ("encrypted reasoning without text", [Start(), ReasoningEnd(encrypted_content="E")],
     ["response.output_item.added", "response.output_item.done", "response.completed"]),
    ("nothing at all", [], ["response.completed"]),
]


@pytest.mark.parametrize("events, names", [c[1:] for c in STREAMS], ids=[c[0] for c in STREAMS])
def test_stream_event_sequences(events: list[Event], names: list[str]) -> None:
    raw, enc = run(events)
    got = check_stream(raw)
    assert [name for name, _ in got[2:]] == names
    assert got[-1][1]["response"] == enc.response()
    assert enc.response() == responses.encode_completion(
        fold(events), REQUEST, response_id="resp_X", created=7, model="m")


def test_stream_failure_ends_with_response_failed_only() -> None:
    raw, enc = run([Start(), TextDelta("par")], fail=UpstreamUnavailable("worker died"))
    got = check_stream(raw)
    assert [n for n, _ in got][-2:] == ["response.output_text.delta", "response.failed"]
    failed = got[-1][1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "worker died"}
    assert failed == enc.response() and failed["output_text"] == "par"
    assert enc.fail(UpstreamUnavailable("again")) == b"" and enc.ping().startswith(b":")


def test_response_before_the_end_is_an_error() -> None:
    enc = responses.StreamEncoder(REQUEST, response_id="resp_X", created=7, model="m")
    with pytest.raises(RuntimeError):
        enc.response()


# --- property: one terminal event, response() == encode_completion(fold(events)) -----------

def _events() -> st.SearchStrategy[list[Event]]:
    text = st.text(max_size=4)
    step = st.one_of(
        text.map(TextDelta), text.map(ReasoningDelta),
        st.builds(ReasoningEnd, encrypted_content=st.none() | st.just("E")),
        st.builds(ReasoningEnd, redacted_data=st.just("R")),
        st.tuples(st.just("start"), st.sampled_from(["weather", "apply_patch", "agents__spawn",
                                                     "x"]), st.booleans()),
        st.tuples(st.just("delta"), st.integers(0, 4), text),
        st.tuples(st.just("end"), st.integers(0, 4)),
        st.builds(Usage, input_tokens=st.none() | st.integers(0, 9),
                  output_tokens=st.none() | st.integers(0, 9)))
    return st.lists(step, max_size=25)


def _concrete(steps: list[Any]) -> list[Event]:
    out: list[Event] = [Start("w")]
    started = 0
    for s in steps:
        if type(s) is not tuple:
            out.append(s)
        elif s[0] == "start":
            out.append(ToolCallStart(started, f"call_{started}", s[1],
                                     "custom" if s[2] and s[1] == "x" else "function"))
            started += 1
        elif s[0] == "delta":
            out.append(ToolCallDelta(s[1], s[2]))
        else:
            out.append(ToolCallEnd(s[1]))
    return out


@settings(max_examples=300, deadline=None)
@given(steps=_events(), finish=st.none() | st.sampled_from(["stop", "length", "tool_calls"]),
       fails=st.booleans())
def test_any_event_sequence_has_one_terminal_and_a_consistent_response(
        steps: list[Any], finish: str | None, fails: bool) -> None:
    events = _concrete(steps) + ([Finish(finish)] if finish else [])  # type: ignore[arg-type]
    error = UpstreamUnavailable("boom") if fails else None
    raw, enc = run(events, fail=error)
    got = check_stream(raw)
    expected = responses.encode_completion(fold(events), REQUEST, response_id="resp_X",
                                           created=7, model="m", error=error)
    assert enc.response() == expected == got[-1][1]["response"]
    added = [d["output_index"] for n, d in got if n == "response.output_item.added"]
    assert added == list(range(len(added)))
    if not fails:  # every item was closed, and closed as the final object shows it
        done = {d["output_index"]: d["item"] for n, d in got if n == "response.output_item.done"}
        assert [done[i] for i in sorted(done)] == expected["output"]
        assert len(added) == len(expected["output"])


# --- the real SDK reads what we write -------------------------------------------------------

def sdk(payload: bytes, content_type: str) -> openai.OpenAI:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=payload, headers={"content-type": content_type})

    return openai.OpenAI(api_key="test", base_url="http://127.0.0.1:9/v1", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
                         _strict_response_validation=True)


SDK_REQUEST = responses.decode(body(tools=[WEATHER, PATCH]))
SDK_EVENTS = [Start(), ReasoningDelta("think"), ReasoningEnd(encrypted_content="ENC"),
              TextDelta("Hi "), TextDelta("there"),
              ToolCallStart(0, "call_1", "weather"), ToolCallDelta(0, '{"city":"P"}'),
              ToolCallStart(1, "call_2", "apply_patch"), ToolCallDelta(1, "*** Begin"),
              Usage(4, 6), Finish("tool_calls")]


def test_sdk_parses_the_stream_and_builds_the_final_response() -> None:
    raw, enc = run(SDK_EVENTS, SDK_REQUEST)
    client = sdk(raw, "text/event-stream")
    seen = [e.type for e in client.responses.create(model="m", input="hi", stream=True)]
    assert seen == [name for name, _ in frames(raw)]
    with client.responses.stream(model="m", input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "Hi there" and final.status == "completed"
    kinds = [item.type for item in final.output]
    assert kinds == ["reasoning", "message", "function_call", "custom_tool_call"]
    assert final.output[2].arguments == '{"city":"P"}'  # type: ignore[union-attr]
    assert final.output[3].input == "*** Begin"  # type: ignore[union-attr]
    assert final.output[0].encrypted_content == "ENC"  # type: ignore[union-attr]
    assert final.usage is not None and final.usage.total_tokens == 10
    assert final.id == enc.response()["id"]


def test_sdk_parses_the_body_and_a_failed_stream() -> None:
    completion = fold(SDK_EVENTS)
    out = responses.encode_completion(completion, SDK_REQUEST, response_id="resp_Y",
                                      created=1, model="m")
    parsed = sdk(orjson.dumps(out), "application/json").responses.create(model="m", input="hi")
    assert parsed.output_text == "Hi there" and parsed.output[3].type == "custom_tool_call"
    raw, _ = run([Start(), TextDelta("a")], SDK_REQUEST, fail=UpstreamUnavailable("died"))
    events = list(sdk(raw, "text/event-stream").responses.create(model="m", input="hi",
                                                                 stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error is not None  # type: ignore[union-attr]
    assert events[-1].response.error.message == "died"  # type: ignore[union-attr]


# --- remote workers: custom tools to chat-only upstreams ------------------------------------

CUSTOM_REQUEST = ChatRequest(
    model="up", dialect="openai_responses",
    tools=(Tool("apply_patch", "Apply\n\ngrammar", kind="custom"),),
    messages=(Message("user", (TextPart("x"),)),
              Message("assistant", (ReasoningPart("r", encrypted_content="ENC"),
                                    ToolCallPart("c1", "apply_patch", 'raw "text"', "custom"))),
              Message("user", (ToolResultPart("c1", (TextPart("done"),)),))))
CUSTOM = frozenset({"apply_patch"})


def test_openai_upstream_gets_custom_tools_as_functions() -> None:
    out = oc.build_body(CUSTOM_REQUEST)
    assert out["tools"] == [{"type": "function", "function": {
        "name": "apply_patch", "description": "Apply\n\ngrammar",
        "parameters": {"type": "object", "properties": {"input": {"type": "string"}},
                       "required": ["input"]}}}]
    assert out["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "apply_patch", "arguments": '{"input":"raw \\"text\\""}'}}]}
    assert out["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "done"}


def _chunk(call: dict[str, Any], finish: str | None = None) -> str:
    return orjson.dumps({"id": "c", "model": "up", "choices": [
        {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": finish}]}).decode()


def test_openai_stream_unwraps_a_custom_call_once_it_ends() -> None:
    parser = oc.StreamParser(CUSTOM)
    got: list[Event] = []
    for data in [
        _chunk({"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "apply_patch", "arguments": '{"inp'}}),
        _chunk({"index": 0, "function": {"arguments": 'ut": "*** Begin\\n"}'}}),
        _chunk({"index": 1, "id": "call_2", "type": "function",
                "function": {"name": "weather", "arguments": "{}"}}),
        orjson.dumps({"id": "c", "choices": [{"index": 0, "delta": {},
                                              "finish_reason": "tool_calls"}]}).decode(),
        "[DONE]",
    ]:
        got.extend(parser.feed(data))
    assert got == [Start("c", "up"), ToolCallStart(0, "call_1", "apply_patch", "custom"),
                   ToolCallStart(1, "call_2", "weather"), ToolCallDelta(1, "{}"),
                   ToolCallDelta(0, "*** Begin\n"), ToolCallEnd(0), ToolCallEnd(1),
                   Finish("tool_calls")]


BODY_CASES = [
    ("openai", oc.body_events,
     {"id": "c", "model": "m", "choices": [{"finish_reason": "tool_calls", "message": {
         "role": "assistant", "tool_calls": [
             {"id": "call_1", "type": "function",
              "function": {"name": "apply_patch", "arguments": '{"input": "P"}'}}]}}]}),
    ("anthropic", am.body_events,
     {"id": "c", "model": "m", "stop_reason": "tool_use", "content": [
         {"type": "tool_use", "id": "call_1", "name": "apply_patch", "input": {"input": "P"}}]}),
]


@pytest.mark.parametrize("convert, answer", [c[1:] for c in BODY_CASES],
                         ids=[c[0] for c in BODY_CASES])
def test_body_events_unwrap_custom_calls(convert: Any, answer: dict[str, Any]) -> None:
    events = convert(answer, CUSTOM)
    assert events[1:4] == [ToolCallStart(0, "call_1", "apply_patch", "custom"),
                           ToolCallDelta(0, "P"), ToolCallEnd(0)]
    plain = convert(answer)  # without the names: an ordinary function call
    assert plain[1] == ToolCallStart(0, "call_1", "apply_patch")


def test_anthropic_stream_unwraps_a_custom_call_at_block_stop() -> None:
    parser = am.StreamParser(CUSTOM)
    got: list[Event] = []
    for obj in [
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "tool_use", "id": "t1", "name": "apply_patch", "input": {}}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "input_json_delta", "partial_json": '{"input": "a'}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "input_json_delta", "partial_json": 'b"}'}},
        {"type": "content_block_stop", "index": 0},
    ]:
        got.extend(parser.feed(orjson.dumps(obj).decode()))
    assert got == [ToolCallStart(0, "t1", "apply_patch", "custom"), ToolCallDelta(0, "ab"),
                   ToolCallEnd(0)]


def test_encrypted_reasoning_is_dropped_by_both_builders() -> None:
    assert "reasoning" not in orjson.dumps(oc.build_body(CUSTOM_REQUEST)).decode()
    anthropic = am.build_body(CUSTOM_REQUEST)
    assert anthropic["messages"][1]["content"] == [
        {"type": "tool_use", "id": "c1", "name": "apply_patch", "input": {"input": 'raw "text"'}}]


UNWRAP = [('{"input": "x"}', "x"), ('{"patch": "y"}', "y"), ("plain text", "plain text"),
          ('{"a": 1}', '{"a": 1}'), ('"just a string"', '"just a string"'), ("", "")]


@pytest.mark.parametrize("given, raw", UNWRAP)
def test_unwrap_custom_input(given: str, raw: str) -> None:
    assert am.unwrap_custom_input(given) == raw
