"""Tools a worker already ran (agent-mode CLIs): the canonical ``ExecutedTool``
event and ``ExecutedToolPart`` through every dialect's encoder (streamed and
not, read by the real SDKs), back through the decoders as history, across the
worker protocol, and into the CLI session-reuse hash the same from every
dialect."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from app.dialects import anthropic_messages as anthropic_dialect
from app.dialects import openai_chat as chat_dialect
from app.dialects import openai_responses as responses_dialect
from pool import wire
from pool.accumulate import fold
from pool.cli.history import request_prefix_hash
from pool.model import (ChatRequest, ExecutedTool, ExecutedToolPart, Finish, Message, Start,
                        TextDelta, TextPart, Usage, executed_text)
from tests.unit import test_anthropic_dialect as ant_helpers
from tests.unit import test_openai_responses_dialect as rsp_helpers

READ = ExecutedTool("toolu_1", "Read", '{"file_path":"a.txt"}', "line one\nline two", False,
                    "claude")
FAILED = ExecutedTool("call_2", "shell", '{"command":"cat b"}', "cat: b: No such file", True,
                      "codex")
SILENT = ExecutedTool("toolu_3", "Write", '{"path":"c"}', "", False, None)

CASES = [
    pytest.param([Start(), TextDelta("Let me look."), READ, TextDelta("It says two lines."),
                  Usage(5, 7), Finish("stop")], id="text-tool-text"),
    pytest.param([Start(), READ, FAILED, Finish("stop")], id="two-tools-one-failed"),
    pytest.param([Start(), SILENT, TextDelta("done"), Finish("stop")], id="no-output"),
]


def _pairs(events: list[Any]) -> list[ExecutedTool]:
    return [e for e in events if type(e) is ExecutedTool]


# --- the model and the worker protocol ---------------------------------------------------

@pytest.mark.parametrize("events", CASES)
def test_fold_keeps_executed_tools_in_order_and_they_cross_the_worker_protocol(events):
    completion = fold(events)
    kinds = [type(p).__name__ for p in completion.parts]
    assert kinds.count("ExecutedToolPart") == len(_pairs(events))
    for event in events:
        assert wire.event_from_dict(orjson.loads(orjson.dumps(wire.event_to_dict(event)))) == event
    for part in completion.parts:
        assert wire.decode(orjson.loads(orjson.dumps(wire.encode(part)))) == part


# --- Anthropic -----------------------------------------------------------------------------

@pytest.mark.parametrize("events", CASES)
def test_anthropic_stream_and_body_show_mcp_blocks_and_end_the_turn(events):
    stream = ant_helpers.run(events)
    frames = ant_helpers.parse(stream)
    ant_helpers.check_grammar(frames)
    starts = [n for n in ant_helpers.names(frames) if n.startswith("start:mcp")]
    assert starts == ["start:mcp_tool_use", "start:mcp_tool_result"] * len(_pairs(events))
    whole = anthropic_dialect.encode_completion(fold(events), ant_helpers.REQUEST,
                                                response_id="msg_1", created=1, model="claude-x")
    assert whole["stop_reason"] == "end_turn"  # nothing for the client to answer
    blocks = [b for b in whole["content"] if b["type"].startswith("mcp_")]
    for event, (use, result) in zip(_pairs(events), zip(blocks[::2], blocks[1::2])):
        assert use == {"type": "mcp_tool_use", "id": event.id, "name": event.name,
                       "server_name": event.server or "worker",
                       "input": orjson.loads(event.arguments)}
        assert result == {"type": "mcp_tool_result", "tool_use_id": event.id,
                          "is_error": event.is_error,
                          "content": [{"type": "text", "text": event.output}] if event.output
                          else []}
    # the real SDK's stream accumulator ends with the very blocks of the body
    message = ant_helpers.sdk_final_message(stream)
    assert [b.to_dict(exclude_none=True) for b in message.content] == whole["content"]
    assert message.stop_reason == "end_turn"


@pytest.mark.parametrize("events", CASES)
def test_anthropic_decoder_takes_the_blocks_back_as_executed_parts(events):
    whole = anthropic_dialect.encode_completion(fold(events), ant_helpers.REQUEST,
                                                response_id="msg_1", created=1, model="claude-x")
    request = anthropic_dialect.decode({
        "model": "m", "max_tokens": 9, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": whole["content"]},
            {"role": "user", "content": "next"}]})
    parts = [p for p in request.messages[1].parts if type(p) is ExecutedToolPart]
    expected = [p for p in fold(events).parts if type(p) is ExecutedToolPart]
    # the server label only matters to the client; "worker" stands in for none
    assert [(p.id, p.name, orjson.loads(p.arguments), p.output, p.is_error) for p in parts] == [
        (p.id, p.name, orjson.loads(p.arguments), p.output, p.is_error) for p in expected]


def test_anthropic_result_without_its_use_is_left_out_and_bad_blocks_name_the_param():
    request = anthropic_dialect.decode({"model": "m", "max_tokens": 9, "messages": [
        {"role": "assistant", "content": [
            {"type": "mcp_tool_result", "tool_use_id": "nope", "content": "x"}]},
        {"role": "user", "content": "hi"}]})
    assert request.messages[0].parts == ()
    with pytest.raises(Exception) as info:
        anthropic_dialect.decode({"model": "m", "max_tokens": 9, "messages": [
            {"role": "assistant", "content": [{"type": "mcp_tool_use", "id": "t", "name": "R"}]},
            {"role": "user", "content": "hi"}]})
    assert info.value.param == "messages[0].content[0].input"  # type: ignore[attr-defined]


# --- OpenAI Responses ----------------------------------------------------------------------

@pytest.mark.parametrize("events", CASES)
def test_responses_stream_and_body_show_mcp_call_items(events):
    raw, enc = rsp_helpers.run(events)
    got = rsp_helpers.check_stream(raw)
    names = [name for name, _ in got]
    outcomes = ["response.mcp_call.failed" if e.is_error else "response.mcp_call.completed"
                for e in _pairs(events)]
    assert [n for n in names if n.startswith("response.mcp_call.")
            and n != "response.mcp_call.in_progress"] == outcomes
    assert names[-1] == "response.completed"
    final = enc.response()
    whole = responses_dialect.encode_completion(fold(events), rsp_helpers.REQUEST,
                                                response_id="resp_X", created=7, model="m")
    assert final == whole
    calls = [i for i in whole["output"] if i["type"] == "mcp_call"]
    for event, item in zip(_pairs(events), calls):
        assert (item["name"], item["arguments"], item["output"], item["server_label"]) == (
            event.name, event.arguments, event.output, event.server or "worker")
        assert item["status"] == ("failed" if event.is_error else "completed")
        assert (item["error"] is not None) == event.is_error
    done = [d["item"] for n, d in got if n == "response.output_item.done"
            and d["item"]["type"] == "mcp_call"]
    assert done == calls
    # the real SDK (strict validation) reads the stream and the body
    client = rsp_helpers.sdk(raw, "text/event-stream")
    with client.responses.stream(model="m", input="hi") as stream:
        parsed = stream.get_final_response()
    assert [o.type for o in parsed.output] == [i["type"] for i in whole["output"]]
    body = rsp_helpers.sdk(orjson.dumps(whole), "application/json").responses.create(
        model="m", input="hi")
    assert [getattr(o, "output", None) for o in body.output if o.type == "mcp_call"] == [
        e.output for e in _pairs(events)]


@pytest.mark.parametrize("events", CASES)
def test_responses_decoder_takes_mcp_call_items_back(events):
    whole = responses_dialect.encode_completion(fold(events), rsp_helpers.REQUEST,
                                                response_id="resp_X", created=7, model="m")
    request = responses_dialect.decode({"model": "m", "input": [
        {"role": "user", "content": "go"}, *whole["output"], {"role": "user", "content": "next"}]})
    assert [m.role for m in request.messages] == ["user", "assistant", "user"]
    parts = [p for p in request.messages[1].parts if type(p) is ExecutedToolPart]
    # an mcp_call is named by its item id (derived from the response's, like every item)
    assert parts == [ExecutedToolPart(item["id"], e.name, e.arguments, e.output, e.is_error,
                                      e.server or "worker")
                     for e, item in zip(_pairs(events), [i for i in whole["output"]
                                                         if i["type"] == "mcp_call"])]


# --- OpenAI chat completions ---------------------------------------------------------------

@pytest.mark.parametrize("events", CASES)
def test_chat_completions_render_executed_tools_as_text_streamed_and_not(events):
    request = chat_dialect.decode({"model": "m", "messages": [{"role": "user", "content": "go"}]})
    enc = chat_dialect.StreamEncoder(request, response_id="c1", created=1, model="m")
    raw = b"".join(enc.feed(e) for e in events) + enc.close()
    streamed = "".join(
        (orjson.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for line in raw.split(b"\n") if line.startswith(b"data: {"))
    whole = chat_dialect.encode_completion(fold(events), request, response_id="c1", created=1,
                                           model="m")
    message = whole["choices"][0]["message"]
    assert message["content"] == streamed and not message.get("tool_calls")
    assert whole["choices"][0]["finish_reason"] == "stop"
    for event in _pairs(events):
        assert executed_text(event) in streamed


# --- one conversation, whichever dialect sends it back ---------------------------------------

def test_the_session_hash_of_the_history_is_the_same_in_every_dialect():
    events = CASES[0].values[0]
    completion = fold(events)
    tail = [{"role": "user", "content": "next"}]
    ant = anthropic_dialect.encode_completion(completion, ant_helpers.REQUEST,
                                              response_id="msg_1", created=1, model="m")
    rsp = responses_dialect.encode_completion(completion, rsp_helpers.REQUEST,
                                              response_id="resp_X", created=7, model="m")
    chat = chat_dialect.encode_completion(completion, rsp_helpers.REQUEST, response_id="c",
                                          created=1, model="m")
    requests: list[ChatRequest] = [
        anthropic_dialect.decode({"model": "m", "max_tokens": 9, "messages": [
            {"role": "user", "content": "go"}, {"role": "assistant", "content": ant["content"]},
            *tail]}),
        responses_dialect.decode({"model": "m", "input": [
            {"role": "user", "content": "go"}, *rsp["output"], *tail]}),
        chat_dialect.decode({"model": "m", "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": chat["choices"][0]["message"]["content"]},
            *tail]}),
    ]
    hashes = {request_prefix_hash(r) for r in requests}
    # what the host keys the conversation by after the first turn: the folded answer
    host_side = ChatRequest(model="m", dialect="anthropic", messages=(
        Message("user", (TextPart("go"),)), Message("assistant", tuple(completion.parts)),
        Message("user", (TextPart("next"),))))
    assert hashes == {request_prefix_hash(host_side)}


def test_token_estimates_count_an_executed_tool_as_its_text():
    from pool.tokens import estimate_tokens

    def request(*parts: Any) -> ChatRequest:
        return ChatRequest(model="m", dialect="anthropic", messages=(
            Message("user", (TextPart("go"),)), Message("assistant", parts),
            Message("user", (TextPart("next"),))))

    part = ExecutedToolPart("t", "Read", '{"file_path":"a.txt"}', "x" * 4000)
    with_tool = estimate_tokens(request(TextPart("ok"), part))
    assert with_tool > estimate_tokens(request(TextPart("ok"))) + 400


def test_workers_without_an_executed_form_show_the_model_its_text():
    from pool.local.chat import template_messages
    from pool.remote import anthropic_messages, openai_chat

    part = ExecutedToolPart("t", "Read", '{"file_path":"a.txt"}', "contents", False, "claude")
    request = ChatRequest(model="m", dialect="openai_chat", messages=(
        Message("user", (TextPart("go"),)),
        Message("assistant", (TextPart("ok "), part, TextPart("done"))),
        Message("user", (TextPart("next"),))))
    shown = "ok " + executed_text(part) + "done"
    assert openai_chat.build_body(request)["messages"][1]["content"] == shown
    blocks = anthropic_messages.build_body(request)["messages"][1]["content"]
    assert "".join(b["text"] for b in blocks) == shown
    assert template_messages(request.messages)[1]["content"] == shown
