"""The real Claude Code binary (npm, pinned) as a cli worker, offline: a
planted ``.credentials.json`` in its home (OAuth, as a logged-in account has)
and ``ANTHROPIC_BASE_URL`` pointed at a fake Anthropic upstream, driven
through poolgate by the real SDKs. Claude Code is also a *client* here:
``claude -p`` against poolgate, served by the claude cli worker."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.upstreams import FakeUpstream
from tests.integration.clis import (CLAUDE_CODE, NPM_PREFIX, PINNED_VERSIONS, _base_env,
                                    ensure_cli, result_event, run_claude)
from tests.support.cli_accounts import claude_home
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

pytestmark = [pytest.mark.cli, pytest.mark.slow]

TOKEN = "sk-ant-oat01-planted-for-tests"
MODEL = "claude-sonnet-4-6"
ADMIN = {"authorization": "Bearer admin-token"}
GATEWAY_KEY = "sk-poolgate-team"


@pytest.fixture(scope="module")
def claude_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Claude Code")
    assert ensure_cli(*CLAUDE_CODE) is not None
    # the native binary, not the node shim in front of it
    native = NPM_PREFIX / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    assert native.exists()
    return str(native)


@pytest.fixture
def served(tmp_path: Path, claude_bin: str):
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        env = _base_env(tmp_path / "os-home")
        env.update(ANTHROPIC_BASE_URL=upstream.anthropic_url, ANTHROPIC_SMALL_FAST_MODEL=MODEL,
                   ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL)
        worker = WorkerSettings(
            name="claude-real", kind="cli", cli="claude", models=(MODEL,),
            home=str(claude_home(tmp_path / "account", TOKEN)), command=(claude_bin,), env=env,
            ready_timeout=60, health_interval=1.0)
        settings = Settings(server=ServerSettings(admin_token="admin-token",
                                                  api_keys={"team": GATEWAY_KEY}),
                            workers=(worker,))
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60, headers=ADMIN) as http:
            yield srv, http, upstream


def _bodies(upstream: FakeUpstream) -> list[dict]:
    return [r.body for r in upstream.requests if r.body and r.path == "/v1/messages"]


def _last_text(upstream: FakeUpstream) -> str:
    blocks = _bodies(upstream)[-1]["messages"][-1]["content"]
    return [b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"][-1]


def _counts(http: httpx.Client, expected: dict[str, int]) -> dict[str, int]:
    """The worker's session counts once they equal ``expected`` (polled from the
    child just after each answer), else the last seen."""
    deadline = time.monotonic() + 5
    while True:
        seen = http.get("/internal/stats").json()["cli_sessions"]["workers"]["claude-real"]
        if seen == expected or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


def test_turns_streamed_and_reused_through_the_real_claude(served):
    srv, http, upstream = served
    oai = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key=GATEWAY_KEY, max_retries=0))
    history = [{"role": "system", "content": "Answer briefly."},
               {"role": "user", "content": "hello real claude"}]
    first = oai.chat.completions.create(model=MODEL, messages=history)
    assert first.choices[0].message.content == "echo: hello real claude"
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "second turn"}]
    chunks = [c.choices[0].delta.content or "" for c in oai.chat.completions.create(
        model=MODEL, messages=history, stream=True) if c.choices]
    assert "".join(chunks) == "echo: second turn"
    bodies = _bodies(upstream)
    # chat mode: no tools, the client's system prompt; one CLI conversation growing
    assert all("tools" not in b or b["tools"] == [] for b in bodies)
    assert any("Answer briefly." in json.dumps(b["system"]) for b in bodies)
    assert [len(b["messages"]) for b in bodies] == [1, 3]
    assert bodies[1]["messages"][1]["content"][0]["text"] == "echo: hello real claude"
    assert _counts(http, {"hits": 1, "misses": 1, "rebuilds": 0}) == {"hits": 1, "misses": 1, "rebuilds": 0}
    info = http.get("/internal/workers").json()["workers"][0]
    assert (info["cli"], info["version"], info["login"]) == ("claude", PINNED_VERSIONS["@anthropic-ai/claude-code"], "ready")


def test_client_tool_round_trip_through_the_real_claude(served):
    srv, http, upstream = served
    ant = closed_at_end(anthropic.Anthropic(base_url=srv.url, api_key=GATEWAY_KEY, max_retries=0))
    tools = [{"name": "get_weather", "description": "The weather in a city.",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}]
    messages = [{"role": "user",
                 "content": 'weather [[tool:mcp__gw__get_weather {"city": "Paris"}]]'}]
    first = ant.messages.create(model=MODEL, max_tokens=512, messages=messages, tools=tools)
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": "Sunny 21C"}]}]
    with ant.messages.stream(model=MODEL, max_tokens=512, messages=messages, tools=tools) as s:
        text = "".join(s.text_stream)
    # 2.1.332 adds a <system-reminder> (tokens left) after a tool's result
    assert text.startswith("tool said: Sunny 21C")
    bodies = _bodies(upstream)
    assert [t["name"] for t in bodies[0]["tools"]] == ["mcp__gw__get_weather"]
    # the CLI sent the tool result the client gave, in the same conversation
    result = bodies[-1]["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == use.id
    assert _counts(http, {"hits": 1, "misses": 1, "rebuilds": 0}) == {"hits": 1, "misses": 1, "rebuilds": 0}


def test_a_history_the_cli_never_saw_is_rebuilt_with_resume(served):
    srv, http, upstream = served
    oai = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key=GATEWAY_KEY, max_retries=0))
    history = [{"role": "user", "content": "made up opening"},
               {"role": "assistant", "content": "made up answer"},
               {"role": "user", "content": "and now"}]
    out = oai.chat.completions.create(model=MODEL, messages=history)
    assert out.choices[0].message.content == "echo: and now"
    [body] = _bodies(upstream)
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] in ("made up answer",
                                              [{"type": "text", "text": "made up answer"}])
    assert _counts(http, {"hits": 0, "misses": 0, "rebuilds": 1}) == {"hits": 0, "misses": 0, "rebuilds": 1}


def test_claude_code_as_a_client_served_by_a_claude_cli_worker(served, tmp_path):
    srv, http, upstream = served
    workdir = tmp_path / "client-work"
    workdir.mkdir()
    events = run_claude(srv.url, GATEWAY_KEY, "say hello through the pool", model=MODEL,
                        cwd=workdir, home=tmp_path / "client-home")
    result = result_event(events)
    assert not result["is_error"] and "say hello through the pool" in result["result"]
    assert len(_bodies(upstream)) >= 1


def test_client_disconnect_interrupts_the_real_claude(served):
    srv, http, upstream = served
    body = {"model": MODEL, "max_tokens": 512, "stream": True,
            "messages": [{"role": "user", "content": "[[hang-after:4]] a long answer"}]}
    with httpx.stream("POST", srv.url + "/v1/messages", json=body, timeout=60,
                      headers={"x-api-key": GATEWAY_KEY, "anthropic-version": "2023-06-01"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if "text_delta" in line:
                break  # the client leaves mid-answer
    deadline = time.monotonic() + 15
    while upstream.disconnects < 1:  # the CLI aborted its upstream call
        assert time.monotonic() < deadline, "the CLI kept streaming"
        time.sleep(0.05)
    oai = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key=GATEWAY_KEY, max_retries=0))
    out = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "next"}])
    assert out.choices[0].message.content == "echo: next"


def test_a_revoked_token_logs_the_real_account_out_at_the_first_retry(tmp_path, claude_bin):
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        env = _base_env(tmp_path / "os-home")
        env.update(ANTHROPIC_BASE_URL=upstream.anthropic_url)
        worker = WorkerSettings(
            name="claude-revoked", kind="cli", cli="claude", models=(MODEL,),
            home=str(claude_home(tmp_path / "account", "sk-ant-oat01-revoked")),
            command=(claude_bin,), env=env, ready_timeout=60)
        settings = Settings(server=ServerSettings(admin_token="admin-token"), workers=(worker,))
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60, headers=ADMIN) as http:
            oai = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0))
            started = time.monotonic()
            with pytest.raises(openai.APIStatusError) as err:
                oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
            assert time.monotonic() - started < 5
            assert err.value.status_code == 503 and "logged out" in str(err.value)
            info = http.get("/internal/workers").json()["workers"][0]
            assert (info["login"], info["state"]) == ("logged_out", "unhealthy")


PIXEL = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5"
         "ErkJggg==")


def test_an_image_reaches_the_upstream_through_the_real_claude(served):
    srv, http, upstream = served
    oai = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key=GATEWAY_KEY, max_retries=0))
    out = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
        {"type": "text", "text": "describe"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}]}])
    # the fake echoes the last text block: 2.1.332 adds "[Image: source: <a file>]" after it
    assert out.choices[0].message.content in ("echo: describe", "echo: " + _last_text(upstream))
    [body] = _bodies(upstream)
    assert any(b.get("text") == "describe" for m in body["messages"] for b in m["content"]
               if isinstance(b, dict))
    images = [b for m in body["messages"] for b in m["content"] if isinstance(b, dict)
              and b.get("type") == "image"]
    assert len(images) == 1 and images[0]["source"]["type"] == "base64"
