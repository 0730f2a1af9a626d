"""A Claude cli worker rebuilds a conversation that ends in the model's tool
calls (a history its CLI never saw: another account's, a restart's, a client
that sends a tool loop to a fresh session), and the client's tool results
reach the model as sent, with thinking on and off, from the real anthropic
and openai SDKs through a real poolgate. The fake ``claude`` resumes a
session as Claude Code 2.1.332 does (tests/fakes/fake_claude_resume.py):
a trailing tool call it would record as interrupted, and the model would
get "(no content)" instead of the results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings
from tests.fakes.scripted import reasoning_for, signature_for
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import (claude_home, fake_claude_worker, spawns, user_lines,
                                        wait_for)
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

ADMIN = {"authorization": "Bearer admin-token"}
TOKEN = "sk-ant-oat01-team-account"
MODEL = "claude-sonnet-4-6"
KEYS = {"team-a": "sk-team-a", "team-b": "sk-team-b"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "Weather for a city", "input_schema": SCHEMA}
WEATHER_OPENAI = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city", "parameters": SCHEMA}}]
THOUGHT = reasoning_for("weather")
THINK = {"type": "enabled", "budget_tokens": 1024}
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as fake:
        fake.check_thinking = True  # refuses what the real API refuses
        yield fake


@pytest.fixture
def served(tmp_path: Path, upstream: FakeUpstream) -> Iterator[tuple[str, httpx.Client, Path]]:
    log = tmp_path / "claude.log"
    worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                upstream.anthropic_url, log)
    settings = Settings(server=ServerSettings(admin_token="admin-token", api_keys=KEYS),
                        workers=(worker,))
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        yield srv.url, http, log


def _sessions(http: httpx.Client, expected: dict[str, int]) -> dict[str, int]:
    seen: dict[str, int] = {}

    def current() -> bool:
        nonlocal seen
        seen = http.get("/internal/stats", headers=ADMIN).json()["cli_sessions"]["workers"][
            "claude-a"]
        return seen == expected

    try:
        wait_for(current, timeout=5)
    except AssertionError:
        pass
    return seen


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _results(body: dict[str, Any]) -> dict[str, str]:
    """The tool results the upstream got in the last user message, by call id."""
    last = _blocks(body["messages"][-1])
    return {b["tool_use_id"]: "".join(c["text"] for c in b["content"]) if isinstance(
        b["content"], list) else b["content"] for b in last if b["type"] == "tool_result"}


def _nothing_made_up(body: dict[str, Any]) -> None:
    """No call recorded as interrupted, no made-up reply, no empty prompt."""
    text = json.dumps(body["messages"])
    for made_up in ("Tool call interrupted", "No response requested.", "(no content)"):
        assert made_up not in text


def _history(thinking: bool, calls: dict[str, str]) -> list[dict[str, Any]]:
    opened = [{"type": "thinking", "thinking": THOUGHT, "signature": signature_for(THOUGHT)}] \
        if thinking else []
    return [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [*opened, *({
                "type": "tool_use", "id": call, "name": "get_weather", "input": {"city": city}}
                for call, city in calls.items())]}]


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_anthropic_a_rebuilt_tool_turn_gets_the_clients_result(served, upstream, thinking):
    url, http, log = served
    extra: dict[str, Any] = {"thinking": THINK} if thinking else {}
    messages = [*_history(thinking, {"toolu_01": "Paris"}), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny 21C"}]}]
    with anthropic.Anthropic(base_url=url, api_key=KEYS["team-a"], max_retries=0) as client:
        answer = client.messages.create(model=MODEL, max_tokens=4096, tools=[WEATHER],
                                        messages=messages, **extra)
        assert answer.content[-1].text == "tool said: Sunny 21C"
        sent = upstream.last.body
        assert _results(sent) == {"toolu_01": "Sunny 21C"}
        _nothing_made_up(sent)
        assert sent["messages"][1]["content"][0]["type"] == ("thinking" if thinking else "tool_use")
        assert ("thinking" in sent) is thinking
        assert user_lines(log) == []  # the results were in the session the CLI resumed
        # the conversation goes on in the same CLI
        messages += [{"role": "assistant", "content": [b.model_dump() for b in answer.content]},
                     {"role": "user", "content": "thanks"}]
        again = client.messages.create(model=MODEL, max_tokens=4096, tools=[WEATHER],
                                       messages=messages, **extra)
    assert again.content[-1].text == "echo: thanks"
    assert len(spawns(log)) == 1 and "--resume" in spawns(log)[0]["argv"]
    assert _sessions(http, {"hits": 1, "misses": 0, "rebuilds": 1}) == {
        "hits": 1, "misses": 0, "rebuilds": 1}


def test_anthropic_parallel_results_and_a_note_all_reach_the_model(served, upstream):
    url, _http, _log = served
    messages = [*_history(True, {"toolu_01": "Paris", "toolu_02": "Rome"}),
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny 21C"},
                    {"type": "tool_result", "tool_use_id": "toolu_02", "content": "Rain 12C"},
                    {"type": "text", "text": "in Celsius please"}]}]
    with anthropic.Anthropic(base_url=url, api_key=KEYS["team-a"], max_retries=0) as client:
        with client.messages.stream(model=MODEL, max_tokens=4096, tools=[WEATHER],
                                    thinking=THINK, messages=messages) as stream:
            text = "".join(stream.text_stream)
    assert text == "tool said: Rain 12C"
    sent = upstream.last.body
    assert _results(sent) == {"toolu_01": "Sunny 21C", "toolu_02": "Rain 12C"}
    assert {"type": "text", "text": "in Celsius please"} in _blocks(sent["messages"][-1])
    _nothing_made_up(sent)


@pytest.mark.parametrize("effort", [None, "high"], ids=["no-effort", "effort-high"])
def test_openai_chat_a_rebuilt_tool_turn_gets_the_clients_result(served, upstream, effort):
    url, http, log = served
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Snow -3C"}]
    extra: dict[str, Any] = {"reasoning_effort": effort} if effort else {}
    with openai.OpenAI(base_url=url + "/v1", api_key=KEYS["team-a"], max_retries=0) as client:
        answer = client.chat.completions.create(model=MODEL, messages=messages,
                                                tools=WEATHER_OPENAI, **extra)
    assert answer.choices[0].message.content == "tool said: Snow -3C"
    assert answer.choices[0].finish_reason == "stop"
    sent = upstream.last.body
    assert _results(sent) == {"call_1": "Snow -3C"}
    _nothing_made_up(sent)
    assert (f"--effort={effort}" in spawns(log)[0]["argv"]) is (effort is not None)
    assert _sessions(http, {"hits": 0, "misses": 0, "rebuilds": 1})["rebuilds"] == 1


def test_openai_responses_tool_loop_sent_to_a_fresh_session_keeps_its_thinking(served, upstream):
    """The first turn's signed thinking comes back (encrypted_content) in a
    history another key sends: a session that key never had, rebuilt with the
    thinking and then the client's output."""
    url, _http, log = served
    asked = [{"role": "user",
              "content": '[[think]] weather? [[tool:mcp__gw__get_weather {"city": "Rome"}]]'}]
    tools = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
              "parameters": SCHEMA}]
    with openai.OpenAI(base_url=url + "/v1", api_key=KEYS["team-a"], max_retries=0) as first_key:
        first = first_key.responses.create(model=MODEL, input=asked, tools=tools, store=False,
                                           include=["reasoning.encrypted_content"])
    reasoning = next(item for item in first.output if item.type == "reasoning")
    call = next(item for item in first.output if item.type == "function_call")
    follow = [*asked, *(item.model_dump(exclude_none=True) for item in first.output),
              {"type": "function_call_output", "call_id": call.call_id, "output": "Hot 35C"}]
    with openai.OpenAI(base_url=url + "/v1", api_key=KEYS["team-b"], max_retries=0) as other:
        answer = other.responses.create(model=MODEL, input=follow, tools=tools, store=False)
    assert answer.output_text == "tool said: Hot 35C"
    sent = upstream.last.body
    assert _results(sent) == {call.call_id: "Hot 35C"}
    assert sent["messages"][1]["content"][0]["type"] == "thinking"
    assert sent["messages"][1]["content"][0]["thinking"] == reasoning.summary[0].text
    _nothing_made_up(sent)
    assert "--resume" in spawns(log)[-1]["argv"]



def test_results_with_an_image_rebuild_the_held_conversation_and_reach_the_model(served, upstream):
    """An image after the results cannot go through the held call (MCP takes
    text): the CLI holding it is let go and the conversation rebuilt, results
    and image in the session."""
    url, http, log = served
    asked = [{"role": "user", "content": 'weather? [[tool:mcp__gw__get_weather {"city": "Nice"}]]'}]
    with anthropic.Anthropic(base_url=url, api_key=KEYS["team-a"], max_retries=0) as client:
        first = client.messages.create(model=MODEL, max_tokens=4096, tools=[WEATHER],
                                       messages=asked)
        [use] = [b for b in first.content if b.type == "tool_use"]
        answer = client.messages.create(model=MODEL, max_tokens=4096, tools=[WEATHER], messages=[
            *asked, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "Windy 18C"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": PIXEL}}]}])
    assert answer.content[-1].text == "tool said: Windy 18C"
    sent = upstream.last.body
    assert _results(sent) == {use.id: "Windy 18C"}
    assert {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": PIXEL}} in _blocks(sent["messages"][-1])
    _nothing_made_up(sent)
    assert len(spawns(log)) == 2 and "--resume" in spawns(log)[1]["argv"]
    assert _sessions(http, {"hits": 0, "misses": 1, "rebuilds": 1}) == {
        "hits": 0, "misses": 1, "rebuilds": 1}
