"""The real Claude Code binary (2.1.332) resumes a rebuilt transcript that
carries the account's signed thinking and sends that thinking upstream as it
was (with its own adaptive thinking on): so a rebuilt conversation keeps it,
and the gateway must leave out what another account signed (the fake
upstream refuses a signature it did not give). A rebuilt conversation that
ends in the model's tool calls gets the client's results (pool/cli/claude_resume.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import anthropic
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.scripted import reasoning_for, signature_for
from tests.fakes.upstreams import FakeUpstream
from tests.integration.clis import CLAUDE_CODE, NPM_PREFIX, _base_env, ensure_cli
from tests.support.cli_accounts import claude_home
from tests.support.server import ServerThread

pytestmark = [pytest.mark.cli, pytest.mark.slow]

TOKEN = "sk-ant-oat01-planted-for-tests"
MODEL = "claude-sonnet-4-6"
KEY = "sk-poolgate-team"
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
THOUGHT = reasoning_for("weather")


@pytest.fixture(scope="module")
def claude_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Claude Code")
    assert ensure_cli(*CLAUDE_CODE) is not None
    native = NPM_PREFIX / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    assert native.exists()
    return str(native)


@pytest.fixture
def served(tmp_path: Path, claude_bin: str) -> Iterator[tuple[anthropic.Anthropic, FakeUpstream]]:
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        upstream.check_thinking = True
        env = _base_env(tmp_path / "os-home")
        env.update(ANTHROPIC_BASE_URL=upstream.anthropic_url, ANTHROPIC_SMALL_FAST_MODEL=MODEL,
                   ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL)
        worker = WorkerSettings(
            name="claude-real", kind="cli", cli="claude", models=(MODEL,),
            home=str(claude_home(tmp_path / "account", TOKEN)), command=(claude_bin,), env=env,
            ready_timeout=60, health_interval=1.0)
        settings = Settings(server=ServerSettings(api_keys={"team": KEY}), workers=(worker,))
        with ServerThread(create_app(settings)) as srv, \
                anthropic.Anthropic(base_url=srv.url, api_key=KEY, max_retries=0) as client:
            yield client, upstream


def _sent(upstream: FakeUpstream) -> dict[str, Any]:
    return [r.body for r in upstream.requests if r.body and r.path == "/v1/messages"][-1]


def test_a_rebuilt_transcript_sends_its_signed_thinking_as_it_was(served):
    client, upstream = served
    answer = client.messages.create(
        model=MODEL, max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "weather in Paris?"},
                  {"role": "assistant", "content": [
                      {"type": "thinking", "thinking": THOUGHT, "signature": signature_for(THOUGHT)},
                      {"type": "text", "text": "Sunny, I think."}]},
                  {"role": "user", "content": "and tomorrow"}])
    assert answer.content[-1].text.startswith("echo: and tomorrow")
    assert _sent(upstream)["messages"][1]["content"][0] == {
        "type": "thinking", "thinking": THOUGHT, "signature": signature_for(THOUGHT)}


def _tool_history(thinking: bool, calls: dict[str, str]) -> list[dict[str, Any]]:
    opened = [{"type": "thinking", "thinking": THOUGHT, "signature": signature_for(THOUGHT)}] \
        if thinking else []
    return [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": [*opened, *({
                "type": "tool_use", "id": call, "name": "get_weather", "input": {"city": city}}
                for call, city in calls.items())]}]


def _results(body: dict[str, Any]) -> dict[str, str]:
    """The client's text in each tool result of the last user message (the CLI adds
    its reminders as blocks of their own after it, and a newline to it)."""
    return {b["tool_use_id"]: (b["content"] if isinstance(b["content"], str)
                               else b["content"][0]["text"]).strip()
            for b in body["messages"][-1]["content"] if b["type"] == "tool_result"}


def _nothing_made_up(body: dict[str, Any]) -> None:
    text = json.dumps(body["messages"])
    for made_up in ("Tool call interrupted", "No response requested.", "(no content)"):
        assert made_up not in text


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_a_rebuilt_tool_turn_gets_the_clients_tool_result(served, thinking):
    """Written up to the client's results and resumed as an interrupted turn, the
    session goes upstream with the results as sent (the CLI adds its meta prompt
    after them), the answer comes back, and the conversation goes on."""
    client, upstream = served
    extra: dict[str, Any] = {"thinking": {"type": "enabled", "budget_tokens": 1024}} \
        if thinking else {}
    messages = [*_tool_history(thinking, {"toolu_01": "Paris"}), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny 21C"}]}]
    answer = client.messages.create(model=MODEL, max_tokens=4096, tools=[WEATHER],
                                    messages=messages, **extra)
    sent = _sent(upstream)
    if thinking:
        assert sent["messages"][1]["content"][0]["signature"] == signature_for(THOUGHT)
    assert _results(sent) == {"toolu_01": "Sunny 21C"}
    assert [t["name"] for t in sent["tools"]] == ["mcp__gw__get_weather"]  # it may call again
    assert sent["messages"][-1]["content"][-1]["text"] == "Continue from where you left off."
    _nothing_made_up(sent)
    assert answer.content[-1].text.startswith("tool said: Sunny 21C")
    messages += [{"role": "assistant", "content": [b.model_dump() for b in answer.content]},
                 {"role": "user", "content": "and tomorrow"}]
    again = client.messages.create(model=MODEL, max_tokens=4096, tools=[WEATHER],
                                   messages=messages, **extra)
    assert again.content[-1].text.startswith("echo: and tomorrow")
    assert len([r for r in upstream.requests if r.path == "/v1/messages" and r.body]) == 2


def test_parallel_results_and_a_note_reach_the_model(served):
    client, upstream = served
    answer = client.messages.create(
        model=MODEL, max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 1024},
        tools=[WEATHER], messages=[
            *_tool_history(True, {"toolu_01": "Paris", "toolu_02": "Rome"}),
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny 21C"},
                {"type": "tool_result", "tool_use_id": "toolu_02", "content": "Rain 12C"},
                {"type": "text", "text": "in Celsius please"}]}])
    sent = _sent(upstream)
    assert _results(sent) == {"toolu_01": "Sunny 21C", "toolu_02": "Rain 12C"}
    assert {"type": "text", "text": "in Celsius please"} in sent["messages"][-1]["content"]
    _nothing_made_up(sent)
    assert answer.content[-1].text.startswith("tool said: Rain 12C")
