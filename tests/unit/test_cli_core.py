"""cli workers, the pure parts: Claude's stream-json as neutral events, which
conversation a request continues, the transcript ``--resume`` loads, the
upstream session index."""

from __future__ import annotations

import asyncio
import json

import pytest

from pool.cli.claude_events import ClaudeStream
from pool.cli.claude_transcript import project_dir, write_transcript
from pool.cli.events import (LoginRequired, PendingToolCall, RateLimited, Retrying,
                             SessionStarted, TextChunk, ThinkingChunk, ToolExecuted, ToolOutput,
                             ToolsPending, TurnFailed, TurnFinished, TurnUsage)
from pool.cli.history import conversation_hash, flatten, request_prefix_hash, split
from pool.cli.registry import make_driver
from pool.cli.driver import DriverConfig, DriverError
from pool.model import ChatRequest, Message, TextPart, Tool, ToolCallPart, ToolResultPart
from sessions.upstream import MemoryUpstreamSessions


def _delta(index: int, **delta: object) -> dict:
    return {"type": "stream_event", "event": {"type": "content_block_delta", "index": index,
                                              "delta": delta}}


def _event(**event: object) -> dict:
    return {"type": "stream_event", "event": event}


def _feed(lines: list[dict]) -> list[object]:
    stream = ClaudeStream()
    return [ev for line in lines for ev in stream.feed(line)]


def test_a_plain_turn():
    events = _feed([
        {"type": "system", "subtype": "init", "session_id": "s1", "model": "m"},
        _event(type="message_start", message={"usage": {"input_tokens": 12,
                                                        "cache_read_input_tokens": 4}}),
        _event(type="content_block_start", index=0, content_block={"type": "thinking"}),
        _delta(0, type="thinking_delta", thinking="hmm"),
        _delta(0, type="signature_delta", signature="sig"),
        _delta(1, type="text_delta", text="Hello "), _delta(1, type="text_delta", text="there"),
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "Hello there"}]}},
        _event(type="message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 3}),
        _event(type="message_stop"),
        {"type": "result", "subtype": "success", "is_error": False, "stop_reason": "end_turn",
         "usage": {"input_tokens": 999, "output_tokens": 999}},
    ])
    assert events == [SessionStarted("s1", "m"), TurnUsage(input_tokens=12, cached_tokens=4),
                      ThinkingChunk("hmm"), ThinkingChunk(signature="sig"),
                      TextChunk("Hello "), TextChunk("there"), TurnUsage(output_tokens=3),
                      TurnFinished("end_turn")]  # result.usage only when no per-call usage came


def test_client_tool_calls_pause_and_cli_tools_are_reported():
    events = _feed([
        _event(type="message_start", message={}),
        _event(type="content_block_start", index=0,
               content_block={"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}),
        _delta(0, type="input_json_delta", partial_json='{"path": "a"}'),
        _event(type="content_block_stop", index=0),
        _event(type="content_block_start", index=1,
               content_block={"type": "tool_use", "id": "toolu_2", "name": "mcp__gw__get_weather"}),
        _delta(1, type="input_json_delta", partial_json='{"city":'),
        _delta(1, type="input_json_delta", partial_json=' "Paris"}'),
        _event(type="content_block_stop", index=1),
        _event(type="message_stop"),
        {"type": "user", "message": {"content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "file text"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "the client's"}]}},
    ])
    assert events == [ToolExecuted("toolu_1", "Read", '{"path": "a"}'),
                      PendingToolCall("toolu_2", "get_weather", '{"city": "Paris"}'),
                      ToolsPending(), ToolOutput("toolu_1", "file text")]


@pytest.mark.parametrize("lines, last", [
    # the not-logged-in pair
    ([{"type": "assistant", "error": "authentication_failed",
       "message": {"model": "<synthetic>", "content": [{"type": "text", "text": "Not logged in"}]}},
      {"type": "result", "subtype": "success", "is_error": True,
       "result": "Not logged in · Please run /login"}], LoginRequired),
    # a 401 is reported at the first retry, not after ten
    ([{"type": "system", "subtype": "api_retry", "attempt": 1, "max_retries": 10,
       "error_status": 401, "error": "authentication_failed"}], LoginRequired),
    ([{"type": "result", "subtype": "success", "is_error": True, "api_error_status": 429,
       "result": "API Error: 429"}], TurnFailed),
    ([{"type": "result", "subtype": "error_max_turns", "is_error": True}], TurnFailed),
])
def test_failures(lines, last):
    events = _feed(lines)
    assert isinstance(events[-1], last)
    if events[-1] == TurnFailed("rate_limit", "API Error: 429", 429):
        assert isinstance(events[-2], RateLimited)


def test_retries_and_rate_limits_and_interrupts():
    stream = ClaudeStream()
    assert stream.feed({"type": "system", "subtype": "api_retry", "attempt": 2,
                        "error_status": 529, "error": "overloaded"}) == [
        Retrying(2, None, 529, "overloaded")]
    assert stream.feed({"type": "rate_limit_event", "rate_limit_info": {"status": "allowed"}}) == []
    [limited] = stream.feed({"type": "rate_limit_event",
                             "rate_limit_info": {"status": "rejected", "resetsAt": 1900000000}})
    assert limited == RateLimited("the account's rate limit was reached", 1900000000.0)
    stream.interrupting = True
    assert stream.feed({"type": "result", "subtype": "error_during_execution", "is_error": True,
                        "usage": {}}) == [TurnFailed("interrupted", "the turn was interrupted")]


def _request(*messages: Message, key: str | None = "team-a", tools=()) -> ChatRequest:
    return ChatRequest(model="m", messages=messages, dialect="openai_chat", key_name=key,
                       tools=tools)


def test_history_split_and_hash_match_what_a_client_sends_back():
    user1 = Message("user", (TextPart("hi"),))
    call = ToolCallPart("c1", "get_weather", '{"city": "Paris"}')
    answer = Message("assistant", (TextPart("let me see"), call))
    result = Message("user", (ToolResultPart("c1", (TextPart("sunny"),)),))
    request = _request(Message("system", (TextPart("S"),)), user1, answer, result)
    history, new = split(request)
    assert history == (user1, answer) and new == (result,)
    tools = ()
    produced = conversation_hash("team-a", "m", "S", tools, (user1, Message(
        "assistant", (TextPart("let me see"), ToolCallPart("c1", "get_weather", '{"city":"Paris"}')))))
    # a client re-serialises arguments and splits text differently: still the same conversation
    assert request_prefix_hash(request) == produced
    resent = Message("assistant", (TextPart("let "), TextPart("me see"), call))
    assert request_prefix_hash(_request(Message("system", (TextPart("S"),)), user1, resent,
                                        result)) == produced
    # another key, system prompt or tool set is another conversation
    assert request_prefix_hash(_request(Message("system", (TextPart("S"),)), user1, answer,
                                        result, key="team-b")) != produced
    assert request_prefix_hash(_request(user1, answer, result)) != produced
    assert request_prefix_hash(_request(Message("system", (TextPart("S"),)), user1, answer, result,
                                        tools=(Tool("x"),))) != produced
    assert request_prefix_hash(_request(user1)) is None  # a first turn continues nothing


def test_flatten_keeps_every_turn_in_order():
    history = (Message("user", (TextPart("q1"),)),
               Message("assistant", (TextPart("a1"), ToolCallPart("c1", "t", "{}"))))
    new = (Message("user", (ToolResultPart("c1", (TextPart("r1"),)), TextPart("q2"))),)
    [text] = flatten(history, new).parts
    positions = [text.text.index(s) for s in ("q1", "a1", "called tool t", "r1", "q2")]
    assert positions == sorted(positions)


def test_transcript_resume_layout(tmp_path):
    history = (Message("user", (TextPart("hello"),)),
               Message("assistant", (TextPart("hi"), ToolCallPart("toolu_1", "get_weather", "{}"))),
               Message("user", (ToolResultPart("toolu_1", (TextPart("sun"),)),)))
    cwd = "/srv/acct.a/work_space"
    path = write_transcript(str(tmp_path), cwd, "sid-1", "m", history, ["get_weather"])
    assert path == str(tmp_path / "projects" / "-srv-acct-a-work-space" / "sid-1.jsonl")
    assert project_dir(str(tmp_path), cwd) == str(tmp_path / "projects" / "-srv-acct-a-work-space")
    with open(path, encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh]
    assert [r["type"] for r in records] == ["user", "assistant", "user"]
    assert records[0]["parentUuid"] is None
    assert [r["parentUuid"] for r in records[1:]] == [r["uuid"] for r in records[:-1]]
    assert {r["sessionId"] for r in records} == {"sid-1"} and {r["cwd"] for r in records} == {cwd}
    assert records[1]["message"]["content"][1] == {
        "type": "tool_use", "id": "toolu_1", "name": "mcp__gw__get_weather", "input": {}}
    # as Claude Code records a result: its text as a block (the CLI's reminders then
    # go in blocks of their own), no is_error unless it is one
    assert records[2]["message"]["content"] == [
        {"tool_use_id": "toolu_1", "type": "tool_result", "content": [{"type": "text", "text": "sun"}]}]


def test_transcript_records_a_failed_or_empty_tool_result(tmp_path):
    history = (Message("assistant", (ToolCallPart("toolu_1", "t", "{}"),
                                     ToolCallPart("toolu_2", "t", "{}"))),
               Message("user", (ToolResultPart("toolu_1", (TextPart("boom"),), is_error=True),
                                ToolResultPart("toolu_2", ()))))
    path = write_transcript(str(tmp_path), "/w", "sid-1", "m", history, ["t"])
    with open(path, encoding="utf-8") as fh:
        results = [json.loads(line) for line in fh][1]["message"]["content"]
    assert results == [{"tool_use_id": "toolu_1", "type": "tool_result", "is_error": True,
                        "content": [{"type": "text", "text": "boom"}]},
                       {"tool_use_id": "toolu_2", "type": "tool_result", "content": ""}]


def test_memory_index_bounds_and_drops():
    now = [0.0]
    index = MemoryUpstreamSessions(max_entries=2, max_age=10, clock=lambda: now[0])

    async def run() -> None:
        await index.put("a", "w1")
        await index.put("b", "w2")
        await index.put("c", "w1")  # evicts a
        assert await index.get("a") is None and await index.get("b") == "w2"
        await index.drop_worker("w1")
        assert await index.get("c") is None
        now[0] = 11
        assert await index.get("b") is None  # too old
        await index.put("d", "w2")
        await index.drop("d")
        assert await index.get("d") is None

    asyncio.run(run())
    stats = index.stats()
    assert (stats["entries"], stats["evicted"], stats["expired"], stats["hits"]) == (0, 1, 1, 1)


def test_registry_names_an_unknown_cli():
    assert type(make_driver(DriverConfig(name="w", cli="claude", home="/h", cwd="/h/w"))).__name__ \
        == "ClaudeDriver"
    with pytest.raises(DriverError, match="no driver for cli 'cursor'"):
        make_driver(DriverConfig(name="w", cli="cursor", home="/h", cwd="/h/w"))
