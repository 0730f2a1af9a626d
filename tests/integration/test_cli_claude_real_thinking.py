"""The real Claude Code binary (2.1.332) resumes a rebuilt transcript that
carries the account's signed thinking and sends that thinking upstream as it
was (with its own adaptive thinking on): so a rebuilt conversation keeps it,
and the gateway must leave out what another account signed (the fake
upstream refuses a signature it did not give)."""

from __future__ import annotations

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


def test_a_rebuilt_tool_turn_gets_the_clients_tool_result(served):
    client, upstream = served
    answer = client.messages.create(
        model=MODEL, max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 1024},
        tools=[WEATHER], messages=[
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": THOUGHT, "signature": signature_for(THOUGHT)},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01",
                                          "content": "Sunny 21C"}]}])
    assert _sent(upstream)["messages"][1]["content"][0]["signature"] == signature_for(THOUGHT)
    assert answer.content[-1].text.startswith("tool said: Sunny 21C")
