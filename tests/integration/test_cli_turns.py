"""No lost or wrong turns (issue 20, section 6): text a client sends with its
tool results reaches the CLI, and Qwen answers a repeated tool call with its
own result. Fake ``claude`` and ``qwen`` CLIs in real worker children behind
a real poolgate, driven by the real SDKs."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import (claude_home, fake_claude_worker, spawns, user_lines,
                                        wait_for)
from tests.support.cli_fakes import (anthropic_client, fake_cli_worker, openai_client, processes,
                                     serve, stdin_of, worker_info)

pytestmark = pytest.mark.slow

QWEN_KEY = "sk-qwen-account-a"
QWEN_MODEL = "qwen-coder"
CLAUDE_TOKEN = "sk-ant-oat01-team-account"
CLAUDE_MODEL = "claude-sonnet-4-6"
WEATHER = [{"name": "get_weather", "description": "The weather in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
WEATHER_OPENAI = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
NOTE = "Also: answer in French from now on."


def _mentions(upstream: FakeUpstream, text: str) -> bool:
    return text in json.dumps(upstream.last.body)


def _tool_round(ant, model: str, messages: list, answer: str, note: str | None = None) -> str:
    """One tool call of the model answered by the client (with ``note`` after the
    result, as Claude Code sends it); the text of the model's next answer."""
    first = ant.messages.create(model=model, max_tokens=256, messages=messages, tools=WEATHER)
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    content: list = [{"type": "tool_result", "tool_use_id": use.id, "content": answer}]
    if note:
        content.append({"type": "text", "text": note})
    messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                 {"role": "user", "content": content}]
    second = ant.messages.create(model=model, max_tokens=256, messages=messages, tools=WEATHER)
    assert second.stop_reason == "end_turn"
    messages.append({"role": "assistant", "content": [b.model_dump() for b in second.content]})
    return second.content[0].text


@pytest.fixture
def claude(tmp_path: Path):
    with FakeUpstream(api_key=CLAUDE_TOKEN, models=(CLAUDE_MODEL,)) as upstream:
        log = tmp_path / "claude.log"
        worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", CLAUDE_TOKEN),
                                    upstream.anthropic_url, log)
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            wait_for(lambda: worker_info(http)["claude-a"]["state"] == "ready")
            yield srv, upstream, log


@pytest.fixture
def qwen(tmp_path: Path):
    with FakeUpstream(api_key=QWEN_KEY, models=(QWEN_MODEL,)) as upstream:
        log = tmp_path / "qwen.log"
        worker = fake_cli_worker("qwen", "qwen-a", tmp_path / "a", upstream.url, log,
                                 api_key=QWEN_KEY)
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            wait_for(lambda: worker_info(http)["qwen-a"]["state"] == "ready")
            yield srv, upstream, log


def test_claude_gets_the_text_sent_with_tool_results(claude):
    srv, upstream, log = claude
    messages = [{"role": "user", "content": 'weather [[tool:mcp__gw__get_weather {"city": "Paris"}]]'}]
    with anthropic_client(srv) as ant:
        said = _tool_round(ant, CLAUDE_MODEL, messages, "Sunny 21C", NOTE)
        assert said.startswith("tool said: Sunny 21C") and _mentions(upstream, NOTE)
        # the conversation the gateway believes in is the CLI's: the next turn is a hit
        messages.append({"role": "user", "content": "thanks"})
        out = ant.messages.create(model=CLAUDE_MODEL, max_tokens=256, messages=messages,
                                  tools=WEATHER)
    assert out.content[0].text == "echo: thanks"
    assert len(spawns(log)) == 1 and len(user_lines(log)) == 2


def test_qwen_gets_the_text_sent_with_tool_results(qwen):
    srv, upstream, log = qwen
    messages = [{"role": "user", "content": 'weather [[tool:mcp__gw__get_weather {"city": "Oslo"}]]'}]
    with anthropic_client(srv) as ant:
        said = _tool_round(ant, QWEN_MODEL, messages, "Snow -2C", NOTE)
    assert said.startswith("tool said: Snow -2C") and _mentions(upstream, NOTE)
    assert len(processes(log)) == 1


def _mcp_answers(log: Path) -> list[str]:
    out = []
    for msg in stdin_of(log):
        result = ((msg.get("response") or {}).get("response") or {}).get("mcp_response", {})
        if msg.get("type") == "control_response" and "content" in result.get("result", {}):
            out.append(result["result"]["content"][0]["text"])
    return out


def test_qwen_answers_a_repeated_tool_call_with_its_own_result(qwen):
    srv, upstream, log = qwen
    call = '[[tool:mcp__gw__get_weather {"city": "Paris"}]]'
    messages = [{"role": "user", "content": f"weather {call}"}]
    with anthropic_client(srv) as ant:
        assert _tool_round(ant, QWEN_MODEL, messages, "Sunny 21C") == "tool said: Sunny 21C"
        messages.append({"role": "user", "content": f"and now? {call}"})
        assert _tool_round(ant, QWEN_MODEL, messages, "Rainy 9C") == "tool said: Rainy 9C"
    assert _mcp_answers(log) == ["Sunny 21C", "Rainy 9C"] and len(processes(log)) == 1


def test_qwen_answers_two_identical_calls_of_one_step_each_with_its_own_result(qwen):
    srv, upstream, log = qwen
    same = 'mcp__gw__get_weather {"city": "Rome"}'
    with openai_client(srv) as oai:
        messages = [{"role": "user", "content": f"twice [[tools:{same} {same}]]"}]
        first = oai.chat.completions.create(model=QWEN_MODEL, messages=messages,
                                            tools=WEATHER_OPENAI)
        calls = first.choices[0].message.tool_calls
        assert len(calls) == 2 and calls[0].id != calls[1].id
        messages += [first.choices[0].message.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": c.id, "content": f"answer {i}"}
            for i, c in enumerate(calls)]
        oai.chat.completions.create(model=QWEN_MODEL, messages=messages, tools=WEATHER_OPENAI)
    assert sorted(_mcp_answers(log)) == ["answer 0", "answer 1"]
