"""Qwen Code's stream-json → neutral events (lines shaped as 0.15.10 prints them)."""

from __future__ import annotations

import pytest

from pool.cli.driver import DriverError
from pool.cli.events import (
    LoginRequired, PendingToolCall, RateLimited, SessionStarted, TextChunk, ToolExecuted, ToolOutput, TurnFailed,
    TurnFinished, TurnUsage,
)
from pool.cli.jsonrpc_options import JsonRpcOptions
from pool.cli.qwen_events import QwenTurnParser


def _delta(text: str) -> dict:
    return {"type": "stream_event", "event": {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "text_delta", "text": text}}}


def _start(mid: str = "m1") -> dict:
    return {"type": "stream_event", "event": {"type": "message_start", "message": {"id": mid}}}


def _assistant(text: str, mid: str = "m1", usage: dict | None = None) -> dict:
    return {"type": "assistant", "message": {"id": mid, "content": [{"type": "text", "text": text}],
                                             "usage": usage or {}}}


def _result(total_in: int, total_out: int) -> dict:
    return {"type": "result", "subtype": "success", "is_error": False, "result": "",
            "usage": {"input_tokens": total_in, "output_tokens": total_out,
                      "cache_read_input_tokens": 0}}


def _feed(parser: QwenTurnParser, *objs: dict) -> list:
    return [event for obj in objs for event in parser.feed(obj)]


def test_a_turn_streams_text_and_counts_usage_as_a_difference_of_totals():
    parser = QwenTurnParser({"input_tokens": 1207, "output_tokens": 3, "cache_read_input_tokens": 0})
    events = _feed(parser,
                   {"type": "system", "subtype": "init", "session_id": "s1", "model": "m"},
                   _start(), _delta("echo: "), _delta("[second]"), _assistant("echo: [second]"),
                   _result(2443, 6))
    assert events == [SessionStarted("s1", "m"), TextChunk("echo: "), TextChunk("[second]"),
                      TurnUsage(input_tokens=1236, output_tokens=3), TurnFinished("end_turn")]
    assert parser.done and parser.totals["input_tokens"] == 2443


def test_text_only_in_assistant_is_not_lost_and_not_doubled():
    parser = QwenTurnParser()
    events = _feed(parser, _assistant("no partials"), _result(10, 2))
    assert [e for e in events if isinstance(e, TextChunk)] == [TextChunk("no partials")]


@pytest.mark.parametrize("split", [1, 3, 11, 12, 20])
def test_an_api_error_401_split_anywhere_is_login_required_and_never_text(split):
    marker = "[API Error: 401 Incorrect API key provided]"
    parser = QwenTurnParser()
    events = _feed(parser, _start(), _delta(marker[:split]), _delta(marker[split:]),
                   _assistant(marker), _result(0, 0))
    assert not [e for e in events if isinstance(e, TextChunk)]
    assert events[-1] == LoginRequired("qwen: Incorrect API key provided")


def test_an_api_error_429_is_rate_limited_then_failed():
    parser = QwenTurnParser()
    events = _feed(parser, _start(), _delta("[API Error: 429 slow down]"), _result(0, 0))
    assert isinstance(events[0], RateLimited)
    assert events[-1] == TurnFailed("overloaded", "qwen: slow down", status=429)


def test_a_bracket_that_is_not_the_marker_is_released():
    parser = QwenTurnParser()
    events = _feed(parser, _start(), _delta("["), _delta("[a] b"), _result(1, 1))
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == "[[a] b"


def test_missing_api_key_result_is_login_required():
    parser = QwenTurnParser()
    events = _feed(parser, {"type": "result", "subtype": "error_during_execution", "is_error": True,
                            "error": {"message": "Missing API key for OpenAI-compatible auth."}})
    assert events == [LoginRequired("qwen: Missing API key for OpenAI-compatible auth.")]


def test_agent_mode_tools_are_reported_as_executed():
    parser = QwenTurnParser()
    events = _feed(parser, {"type": "assistant", "message": {"id": "m1", "content": [
        {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a"}}]}},
        {"type": "user", "message": {"content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "hello"}]}})
    assert events == [ToolExecuted("t1", "read_file", '{"path": "a"}'), ToolOutput("t1", "hello")]


def test_client_tools_are_pending_calls_and_their_results_are_not_echoed():
    parser = QwenTurnParser(client_tool_prefix="mcp__gw__")
    events = _feed(parser, {"type": "assistant", "message": {"id": "m1", "content": [
        {"type": "tool_use", "id": "c1", "name": "mcp__gw__get_weather", "input": {"city": "Oslo"}},
        {"type": "tool_use", "id": "c2", "name": "read_file", "input": {}}]}})
    assert events == [PendingToolCall("c1", "get_weather", '{"city": "Oslo"}'),
                      ToolExecuted("c2", "read_file", "{}")]
    assert parser.pending and not parser.done
    events = _feed(parser, {"type": "user", "message": {"content": [
        {"type": "tool_result", "tool_use_id": "c1", "content": "Sunny"},
        {"type": "tool_result", "tool_use_id": "c2", "content": "file"}]}}, _result(9, 3))
    assert events[0] == ToolOutput("c2", "file") and events[-1] == TurnFinished("end_turn")
    assert not parser.pending and parser.done


def test_totals_that_restart_fall_back_to_the_calls_of_this_turn():
    parser = QwenTurnParser({"input_tokens": 5000, "output_tokens": 50, "cache_read_input_tokens": 0})
    events = _feed(parser, _assistant("x", usage={"input_tokens": 40, "output_tokens": 2}),
                   _result(40, 2))
    assert TurnUsage(input_tokens=40, output_tokens=2) in events


def test_jsonrpc_options_name_the_bad_option():
    assert JsonRpcOptions.parse({}).send_prompt == "session/prompt"
    assert JsonRpcOptions.parse({"end_session": "chat/end", "cancel": ""}).cancel is None
    with pytest.raises(DriverError, match="cli_options.send_promt"):
        JsonRpcOptions.parse({"send_promt": "x"})
    with pytest.raises(DriverError, match="cli_options.auth_error_code"):
        JsonRpcOptions.parse({"auth_error_code": "401"})
    with pytest.raises(DriverError, match="cli_options.send_prompt"):
        JsonRpcOptions.parse({"send_prompt": ""})
