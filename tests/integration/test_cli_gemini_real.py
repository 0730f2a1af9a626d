"""The real Gemini CLI 0.61.0 (npm, in .cache/npm-gemini) behind a real
poolgate as a ``gemini`` cli worker on an API key, against a fake Gemini API
(``GOOGLE_GEMINI_BASE_URL``), driven by the real SDKs."""

from __future__ import annotations

import json
import os
import time
import shutil
from pathlib import Path

import httpx
import openai
import pytest

from app.settings import WorkerSettings
from tests.fakes.gemini_cli_upstream import GeminiCliUpstream
from tests.integration.clis import GEMINI_CLI, GEMINI_PREFIX, ensure_cli
from tests.support.cli_accounts import wait_for
from tests.support.cli_fakes import anthropic_client, openai_client, serve, worker_info

pytestmark = [pytest.mark.cli, pytest.mark.slow]

KEY = "gemini-real-account-key"
MODEL = "gemini-2.5-pro"


@pytest.fixture(scope="module")
def gemini_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Gemini CLI")
    path = ensure_cli(*GEMINI_CLI, prefix=GEMINI_PREFIX)
    assert path is not None
    return path


def _worker(home: Path, gemini_bin: str, upstream: GeminiCliUpstream, **extra) -> WorkerSettings:
    return WorkerSettings(
        name="gemini-real", kind="cli", cli="gemini", models=(MODEL,), home=str(home),
        command=(gemini_bin,), ready_timeout=60, health_interval=2.0, health_timeout=5.0,
        env={"GOOGLE_GEMINI_BASE_URL": upstream.url, "GEMINI_API_KEY": KEY,
             "PATH": os.environ.get("PATH", "/usr/bin:/bin")}, **extra)


def test_real_gemini_turns_through_poolgate(tmp_path: Path, gemini_bin: str):
    with GeminiCliUpstream(api_key=KEY) as upstream:
        with serve(_worker(tmp_path / "acct", gemini_bin, upstream)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http:
            info = wait_for(lambda: (w := worker_info(http)["gemini-real"])["state"] == "ready"
                            and w, timeout=60)
            assert (info["cli"], info["version"], info["login"]) == ("gemini", "0.61.0", "ready")
            history = [{"role": "system", "content": "Answer briefly."},
                       {"role": "user", "content": "hello real gemini"}]
            with openai_client(srv) as oai:
                out = oai.chat.completions.create(model=MODEL, messages=history, timeout=90,
                                                  max_tokens=64)
            assert out.choices[0].message.content == "echo: hello real gemini"
            assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == 4
            history.append({"role": "assistant", "content": out.choices[0].message.content})
            with anthropic_client(srv) as ant, ant.messages.stream(
                    model=MODEL, max_tokens=64, system="Answer briefly.", timeout=90,
                    messages=history[1:] + [{"role": "user", "content": "and a second turn"}],
            ) as stream:
                chunks = list(stream.text_stream)
            assert "".join(chunks) == "echo: and a second turn" and len(chunks) > 1
    generations = upstream.generations()
    assert len(generations) == 2
    first, second = generations[0].body, generations[1].body
    # chat mode: the client's system prompt replaces the CLI's, none of its tools
    assert first["systemInstruction"]["parts"][0]["text"] == "Answer briefly."
    assert [d for t in first.get("tools", []) for d in t["functionDeclarations"]] == []
    assert len(str(first)) < 4000
    # the second turn went to the same CLI session: the history grew in one conversation
    assert [c["role"] for c in second["contents"]] == ["user", "model", "user"]
    assert generations[0].headers["x-goog-api-key"] == KEY


def test_real_gemini_client_tool_round_trip(tmp_path: Path, gemini_bin: str):
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    messages = [{"role": "user", "content": '[[tool:mcp_gw_get_weather {"city": "Paris"}]]'}]
    with GeminiCliUpstream(api_key=KEY) as upstream:
        with serve(_worker(tmp_path / "acct", gemini_bin, upstream)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http:
            wait_for(lambda: worker_info(http)["gemini-real"]["state"] == "ready", timeout=60)
            with openai_client(srv) as oai:
                first = oai.chat.completions.create(model=MODEL, messages=messages,
                                                    tools=[weather], timeout=90)
                choice = first.choices[0]
                assert choice.finish_reason == "tool_calls"
                call = choice.message.tool_calls[0]
                assert (call.function.name, call.function.arguments) == (
                    "get_weather", '{"city": "Paris"}')
                messages += [choice.message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.id, "content": "Sunny 21C"}]
                second = oai.chat.completions.create(model=MODEL, messages=messages,
                                                     tools=[weather], timeout=90)
    assert second.choices[0].finish_reason == "stop"
    assert "Sunny 21C" in second.choices[0].message.content
    generations = upstream.generations()
    declared = [d["name"] for t in generations[0].body["tools"] for d in t["functionDeclarations"]]
    assert declared == ["mcp_gw_get_weather"]  # the client's tool only, none of the CLI's
    answer = generations[-1].body["contents"][-1]["parts"][0]["functionResponse"]
    assert "Sunny 21C" in answer["response"]["output"]


async def test_real_gemini_login_shows_google_s_url_on_a_pty(tmp_path: Path, gemini_bin: str):
    """The operator path's first half (the code exchange needs Google itself)."""
    from pool.cli.login import make_login

    login = make_login("gemini", home=str(tmp_path / "acct"),
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                       command=(gemini_bin,))
    try:
        challenge = await login.begin(60)
    finally:
        await login.close()
    assert challenge.url.startswith("https://accounts.google.com/o/oauth2/v2/auth?")
    assert "redirect_uri=https%3A%2F%2Fcodeassist.google.com%2Fauthcode" in challenge.url
    assert "code_challenge_method=S256" in challenge.url and challenge.wants_code


def test_real_gemini_with_a_google_login_it_cannot_use_is_logged_out(tmp_path: Path,
                                                                     gemini_bin: str):
    """With no way to Google (a dead proxy), 0.61.0 in --acp distrusts a planted
    login and starts its interactive login on the ACP stream: the account is
    logged out at once, not after a timeout."""
    home = tmp_path / "acct"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "oauth_creds.json").write_text(json.dumps({
        "access_token": "ya29.planted", "refresh_token": "1//planted", "token_type": "Bearer",
        "expiry_date": 4102444800000}))
    worker = WorkerSettings(
        name="gemini-real", kind="cli", cli="gemini", models=(MODEL,), home=str(home),
        command=(gemini_bin,), ready_timeout=60, health_interval=2.0, health_timeout=5.0,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HTTPS_PROXY": "http://127.0.0.1:9",
             "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1,localhost"})
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        wait_for(lambda: worker_info(http)["gemini-real"]["login"] == "ready", timeout=60)
        started = time.monotonic()
        with openai_client(srv) as oai, pytest.raises(openai.APIStatusError) as caught:
            oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                        timeout=90)
        assert time.monotonic() - started < 30
        assert "authorize" not in str(caught.value.body)
        wait_for(lambda: worker_info(http)["gemini-real"]["login"] == "logged_out")


def test_real_gemini_agent_mode_reads_a_file_in_the_key_s_workspace(tmp_path: Path,
                                                                   gemini_bin: str):
    home = tmp_path / "acct"
    workspace = Path(f"{home}-workspaces") / "team-a"
    workspace.mkdir(parents=True)
    (workspace / "notes.txt").write_text("the notes say 42")
    with GeminiCliUpstream(api_key=KEY) as upstream:
        with serve(_worker(home, gemini_bin, upstream, mode="agent")) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http:
            wait_for(lambda: worker_info(http)["gemini-real"]["state"] == "ready", timeout=60)
            assert worker_info(http)["gemini-real"]["sandbox"] in ("bwrap", "uid")
            with anthropic_client(srv) as ant:
                out = ant.beta.messages.create(
                    model=MODEL, max_tokens=64, timeout=90, messages=[{"role": "user", "content":
                        f'[[tool:read_file {{"file_path": "{workspace}/notes.txt"}}]]'}])
    kinds = [b.type for b in out.content]
    assert kinds == ["mcp_tool_use", "mcp_tool_result", "text"], out.content
    # 0.61.0's ACP names the tool only in its call id, and gives paths, not arguments
    assert out.content[0].name == "read_file" and out.content[0].server_name == "gemini"
    assert out.content[0].input == {"title": "notes.txt", "paths": [f"{workspace}/notes.txt"]}
    assert out.content[1].is_error is False  # no output: ACP reports none for read_file
    assert out.content[2].text == "tool said: the notes say 42"  # the model got the file
    declared = [d["name"] for t in upstream.generations()[0].body["tools"]
                for d in t["functionDeclarations"]]
    assert "read_file" in declared and "run_shell_command" in declared
