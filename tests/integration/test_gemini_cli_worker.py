"""A Gemini client (the real google-genai SDK) served by a ``cli`` worker (the
fake ``claude`` CLI of tests/fakes/fake_claude.py, supervised): a turn, the
next turn in the same CLI session, and a client tool round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from google import genai
from google.genai import types

from app.factory import create_app
from app.settings import ServerSettings, Settings
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import claude_home, fake_claude_worker, spawns, user_lines
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

TOKEN = "sk-ant-oat01-team-account"
MODEL = "claude-sonnet-4-6"
KEY = "sk-team-a"
CALL = '[[tool:mcp__gw__get_weather {"city": "Paris"}]]'  # the model sees the MCP name


@pytest.fixture
def served(tmp_path: Path):
    log = tmp_path / "claude.log"
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                    upstream.anthropic_url, log)
        settings = Settings(server=ServerSettings(api_keys={"team-a": KEY}), workers=(worker,))
        with ServerThread(create_app(settings)) as srv:
            with genai.Client(api_key=KEY, http_options=types.HttpOptions(
                    base_url=srv.url, api_version="v1beta")) as client:
                yield client, upstream, log


def test_turns_reuse_the_cli_session(served):
    client, upstream, log = served
    first = types.Content(role="user", parts=[types.Part(text="first question")])
    out = client.models.generate_content(
        model=MODEL, contents=[first],
        config=types.GenerateContentConfig(system_instruction="Be terse."))
    assert out.text == "echo: first question"
    assert out.candidates[0].finish_reason == types.FinishReason.STOP
    chunks = list(client.models.generate_content_stream(
        model=MODEL, config=types.GenerateContentConfig(system_instruction="Be terse."),
        contents=[first, out.candidates[0].content,
                  types.Content(role="user", parts=[types.Part(text="second question")])]))
    assert "".join(c.text or "" for c in chunks) == "echo: second question"
    sent = user_lines(log)
    assert [m["message"]["content"] for m in sent] == ["first question", "second question"]
    assert len(spawns(log)) == 1  # the second turn went to the same CLI
    assert upstream.requests[0].body["system"] == [{"type": "text", "text": "Be terse."}]


def test_client_tool_round_trip(served):
    client, upstream, log = served
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(
            name="get_weather", description="The weather in a city.",
            parameters_json_schema={"type": "object",
                                    "properties": {"city": {"type": "string"}}})])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    ask = types.Content(role="user", parts=[types.Part(text=f"weather please {CALL}")])
    first = client.models.generate_content(model=MODEL, contents=[ask], config=config)
    [call] = first.function_calls
    assert (call.name, call.args) == ("get_weather", {"city": "Paris"})
    answer = types.Content(role="user", parts=[types.Part.from_function_response(
        name="get_weather", response={"output": "Sunny 21C"})])
    second = client.models.generate_content(
        model=MODEL, contents=[ask, first.candidates[0].content, answer], config=config)
    assert second.text == "tool said: Sunny 21C"
    # the held tool call was answered in the same CLI: no new user turn, no new process
    assert len(user_lines(log)) == 1 and len(spawns(log)) == 1
