"""Gemini CLI workers behind a real poolgate, driven by the real SDKs: the
fake ``gemini`` CLI (tests/fakes/fake_gemini.py, ``--acp`` as 0.61.0 speaks
it) in supervised worker children, its replies from a fake Gemini API."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic import SecretStr

from app.account_settings import LoginSettings
from app.settings import WorkerSettings
from auth.autologin import CHROMIUM
from tests.fakes.egress_proxy import EgressProxy
from tests.fakes.gemini_cli_upstream import GeminiCliUpstream
from tests.fakes.idp import FakeIdP
from tests.support.cli_accounts import read_log, wait_for
from tests.support.cli_fakes import anthropic_client, openai_client, serve, worker_info

pytestmark = pytest.mark.slow

KEY = "gemini-key-a"
MODEL = "gemini-2.5-pro"
FAKE_GEMINI = Path(__file__).resolve().parents[1] / "fakes" / "fake_gemini.py"


def gemini_worker(name: str, home: Path, base_url: str, log: Path, *, api_key: str | None,
                  env_extra: dict[str, str] | None = None, **extra: Any) -> WorkerSettings:
    env = {"GOOGLE_GEMINI_BASE_URL": base_url, "FAKE_GEMINI_LOG": str(log),
           "PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env_extra or {})}
    if api_key is not None:
        env["GEMINI_API_KEY"] = api_key
    return WorkerSettings(name=name, kind="cli", cli="gemini", models=(MODEL,), home=str(home),
                          command=(sys.executable, str(FAKE_GEMINI)), env=env,
                          health_interval=0.5, health_timeout=2.0, backoff_initial=0.2,
                          backoff_max=2.0, stop_timeout=5.0, **extra)


def processes(log: Path) -> list[dict[str, Any]]:
    return [e for e in read_log(log) if "argv" in e]


def prompts(log: Path) -> list[dict[str, Any]]:
    return [{"pid": e["pid"], **e["stdin"]} for e in read_log(log)
            if e.get("stdin", {}).get("method") == "session/prompt"]


@pytest.fixture
def upstream():
    with GeminiCliUpstream(api_key=KEY) as fake:
        yield fake


@pytest.fixture
def one(tmp_path: Path, upstream: GeminiCliUpstream):
    log = tmp_path / "gemini.log"
    worker = gemini_worker("gemini-a", tmp_path / "a", upstream.url, log, api_key=KEY)
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: worker_info(http)["gemini-a"]["state"] == "ready")
        yield srv, http, log, tmp_path / "a"


def test_a_turn_and_a_streamed_turn_in_chat_mode(one, upstream):
    srv, http, log, home = one
    secret_system = "Be terse. (client text: never on argv)"
    with openai_client(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[
            {"role": "system", "content": secret_system},
            {"role": "user", "content": "hello gemini"}])
    assert out.choices[0].message.content == "echo: hello gemini"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens == 3
    with anthropic_client(srv) as ant, \
            ant.messages.stream(model=MODEL, max_tokens=64, messages=[
                {"role": "user", "content": "streamed words here"}]) as stream:
        chunks = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(chunks) == "echo: streamed words here" and len(chunks) > 1
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 4
    # chat mode: none of the CLI's tools, the client's system prompt from a file
    first = upstream.generations()[0].body
    assert [d for t in first.get("tools", []) for d in t["functionDeclarations"]] == []
    assert first["systemInstruction"]["parts"][0]["text"] == secret_system
    first_process = processes(log)[0]
    assert "--acp" in first_process["argv"]
    assert first_process["argv"][first_process["argv"].index("--model") + 1] == MODEL
    assert not any(secret_system in arg for p in processes(log) for arg in p["argv"])
    info = worker_info(http)["gemini-a"]
    assert (info["cli"], info["version"], info["login"]) == ("gemini", "0.61.0", "ready")


def test_the_system_prompt_file_is_private_and_goes_with_its_conversation(one, upstream):
    srv, http, log, home = one
    with openai_client(srv) as oai:
        oai.chat.completions.create(model=MODEL, messages=[
            {"role": "system", "content": "private words"}, {"role": "user", "content": "hi"}])
    path = Path(processes(log)[0]["env"]["GEMINI_SYSTEM_MD"])
    assert path.read_text() == "private words"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    http.post("/internal/workers/gemini-a/restart", headers={"authorization": "Bearer admin-token"})
    wait_for(lambda: not path.exists())


def test_second_turn_sends_only_the_new_turn_to_the_same_process(one, upstream):
    srv, http, log, _ = one
    history = [{"role": "user", "content": "first question"}]
    with openai_client(srv) as oai:
        first = oai.chat.completions.create(model=MODEL, messages=history)
        history += [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "second question"}]
        second = oai.chat.completions.create(model=MODEL, messages=history)
    assert second.choices[0].message.content == "echo: second question"
    sent = prompts(log)
    assert [m["params"]["prompt"] for m in sent] == [
        [{"type": "text", "text": "first question"}], [{"type": "text", "text": "second question"}]]
    assert sent[0]["pid"] == sent[1]["pid"] and len(processes(log)) == 1
    # the upstream saw one conversation growing
    contents = upstream.generations()[-1].body["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert second.usage.completion_tokens == 3  # the turn's, not the session's


def test_history_it_never_saw_is_flattened_into_a_new_conversation(one, upstream):
    srv, http, log, _ = one
    with openai_client(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "my name is Ada"},
            {"role": "assistant", "content": "Hello Ada"},
            {"role": "user", "content": "who am I"}])
    text = prompts(log)[0]["params"]["prompt"][0]["text"]
    assert "my name is Ada" in text and "Hello Ada" in text and "who am I" in text
    assert out.choices[0].message.content.startswith("echo: ")


def test_no_api_key_is_a_logged_out_account(tmp_path: Path, upstream):
    log = tmp_path / "gemini.log"
    worker = gemini_worker("gemini-a", tmp_path / "a", upstream.url, log, api_key=None)
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: worker_info(http)["gemini-a"]["login"] == "logged_out")


def test_a_refused_key_logs_the_account_out_without_the_vendor_text(tmp_path: Path, upstream):
    log = tmp_path / "gemini.log"
    worker = gemini_worker("gemini-a", tmp_path / "a", upstream.url, log, api_key="wrong-key")
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: worker_info(http)["gemini-a"]["state"] == "ready")
        with openai_client(srv) as oai, pytest.raises(openai.APIStatusError) as caught:
            oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert "API key not valid" not in str(caught.value.body)
        wait_for(lambda: worker_info(http)["gemini-a"]["login"] == "logged_out")


def test_agent_mode_runs_the_cli_s_tools_in_the_key_s_workspace(tmp_path: Path, upstream):
    home = tmp_path / "a"
    log = home / "gemini.log"  # in the home: the sandbox shows the CLI nothing else
    worker = gemini_worker("gemini-a", home, upstream.url, log, api_key=KEY, mode="agent")
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: worker_info(http)["gemini-a"]["state"] == "ready")
        with anthropic_client(srv) as ant:
            out = ant.beta.messages.create(model=MODEL, max_tokens=64, system="Be careful.",
                                           messages=[{"role": "user", "content":
                                                      '[[tool:read_file {"path": "notes.txt"}]]'}])
        assert worker_info(http)["gemini-a"]["sandbox"] in ("bwrap", "uid")
    kinds = [b.type for b in out.content]
    assert kinds == ["mcp_tool_use", "mcp_tool_result", "text"], kinds
    assert out.content[0].name == "read_file" and out.content[0].input == {"path": "notes.txt"}
    assert out.content[1].content[0].text == "ran read_file"
    assert out.content[2].text == "tool said: ran read_file"
    assert out.stop_reason == "end_turn"
    started = processes(log)[0]
    assert started["cwd"] == f"{home}-workspaces/team-a"
    assert started["env"]["GEMINI_SYSTEM_MD"] is None  # the CLI keeps its own agent prompt
    first = prompts(log)[0]["params"]["prompt"]
    assert first[0]["text"] == "Be careful."
    declared = [d["name"] for t in upstream.generations()[0].body["tools"]
                for d in t["functionDeclarations"]]
    assert "read_file" in declared and "run_shell_command" in declared


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def test_client_tools_are_held_and_answered_by_the_next_request(one, upstream):
    srv, http, log, _ = one
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": '[[tool:mcp_gw_get_weather {"city": "Paris"}]]'}]
    with openai_client(srv) as oai:
        first = oai.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        call = choice.message.tool_calls[0]
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Sunny 21C"}]
        second = oai.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
    assert second.choices[0].finish_reason == "stop"
    assert "Sunny 21C" in second.choices[0].message.content
    assert len(processes(log)) == 1  # the held call was answered in the same process
    # the model saw only the client's tool (as the CLI names MCP tools), none of the CLI's
    declared = [d["name"] for t in upstream.generations()[0].body["tools"]
                for d in t["functionDeclarations"]]
    assert declared == ["mcp_gw_get_weather"]
    # the MCP server is the conversation's own: a bearer token, on loopback
    server = next(e["stdin"]["params"]["mcpServers"][0] for e in read_log(log)
                  if e.get("stdin", {}).get("method") == "session/new")
    assert server["url"].startswith("http://127.0.0.1:")
    with pytest.raises(httpx.HTTPStatusError):
        httpx.post(server["url"], json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
                   ).raise_for_status()


def test_the_operator_logs_a_google_account_in_with_the_code(tmp_path: Path, capsys):
    """The operator path: the URL in the login status, the code pasted at the
    admin API into the same CLI process, confirmed by a turn on the new login."""
    admin = {"authorization": "Bearer admin-token"}
    log = tmp_path / "gemini.log"
    with GeminiCliUpstream(oauth_token="ya29.fake") as code_assist:
        worker = gemini_worker("gemini-a", tmp_path / "a", code_assist.url, log, api_key=None,
                               env_extra={"CODE_ASSIST_ENDPOINT": code_assist.url})
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
            wait_for(lambda: worker_info(http)["gemini-a"]["login"] == "logged_out")
            started = http.post("/internal/workers/gemini-a/login", headers=admin,
                                json={"auto": False})
            assert started.status_code == 202, started.text
            status = started.json()
            assert status["state"] == "waiting_for_code"
            assert status["url"].startswith("https://accounts.google.com/o/oauth2/v2/auth?")
            pasted = http.post("/internal/workers/gemini-a/login/code", headers=admin,
                               json={"code": "4/0-operator-code"})
            assert pasted.status_code == 200, pasted.text
            done = wait_for(lambda: (s := http.get("/internal/workers/gemini-a/login",
                                                   headers=admin).json())["state"]
                            in ("ready", "failed") and s, timeout=60)
            assert done["state"] == "ready", str(done)
            assert worker_info(http)["gemini-a"]["login"] == "ready"
            with openai_client(srv) as oai:
                out = oai.chat.completions.create(model=MODEL, messages=[
                    {"role": "user", "content": "hello google account"}])
            assert out.choices[0].message.content == "echo: hello google account"
    turns = [r for r in code_assist.generations() if "v1internal" in r.path]
    assert turns and turns[-1].headers["authorization"] == "Bearer ya29.fake"
    creds = tmp_path / "a" / ".gemini" / "oauth_creds.json"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    assert "4/0-operator-code" not in capsys.readouterr().out  # not in any log line


def test_a_google_login_the_cli_refuses_is_a_logged_out_account(tmp_path: Path):
    """Gemini CLI falls into its interactive login on the ACP stream: the
    conversation cannot start, and the account is logged out until it logs in again."""
    home = tmp_path / "a"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "oauth_creds.json").write_text('{"access_token": "revoked"}')
    with GeminiCliUpstream(oauth_token="ya29.fake") as code_assist:
        worker = gemini_worker("gemini-a", home, code_assist.url, tmp_path / "g.log",
                               api_key=None, env_extra={"CODE_ASSIST_ENDPOINT": code_assist.url})
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
            wait_for(lambda: worker_info(http)["gemini-a"]["login"] == "ready")
            with openai_client(srv) as oai, pytest.raises(openai.APIStatusError):
                oai.chat.completions.create(model=MODEL, messages=[
                    {"role": "user", "content": "hello"}])
            wait_for(lambda: worker_info(http)["gemini-a"]["login"] == "logged_out")


def test_a_google_login_behind_a_proxy_that_is_down_is_not_logged_out(tmp_path: Path):
    """With its egress proxy down, Gemini CLI cannot reach Google and falls into its
    login, as with a refused one: the account is not logged out (no alert, no
    automatic login through a dead proxy); the worker is unhealthy until the proxy
    is back, and the client is told it is the proxy."""
    home = tmp_path / "a"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "oauth_creds.json").write_text('{"access_token": "ya29.fake"}')
    with GeminiCliUpstream(oauth_token="ya29.fake") as code_assist, EgressProxy() as proxy:
        # probes 5 s apart: the request, not a probe, finds the proxy down
        worker = gemini_worker("gemini-a", home, code_assist.url, tmp_path / "g.log",
                               api_key=None, env_extra={"CODE_ASSIST_ENDPOINT": code_assist.url},
                               proxy=proxy.url)
        worker = worker.model_copy(update={"health_interval": 5.0})
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=60) as http, \
                openai_client(srv) as oai:
            wait_for(lambda: worker_info(http)["gemini-a"]["login"] == "ready")
            first = oai.chat.completions.create(model=MODEL, messages=[
                {"role": "user", "content": "hello"}])
            assert first.choices[0].message.content
            proxy.stop()
            with pytest.raises(openai.APIStatusError) as failed:
                oai.chat.completions.create(model=MODEL, messages=[
                    {"role": "user", "content": "a new conversation"}])
            assert "egress proxy of worker gemini-a cannot be reached" in str(failed.value)
            info = worker_info(http)["gemini-a"]
            assert info["login"] != "logged_out" and info["account_state"] != "logged_out", info
            # the proxy check the turn's end schedules marks the worker (it may land
            # just after the client has its answer)
            info = wait_for(lambda: (w := worker_info(http)["gemini-a"])["state"] == "unhealthy"
                            and w, timeout=10)
            assert info["login"] != "logged_out" and info["account_state"] != "logged_out", info
            proxy.start()  # the next probe finds it up
            wait_for(lambda: worker_info(http)["gemini-a"]["state"] == "ready", timeout=20)
            again = oai.chat.completions.create(model=MODEL, messages=[
                {"role": "user", "content": "back"}])
            assert again.choices[0].message.content


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"Chromium is not at {CHROMIUM}")
@pytest.mark.parametrize("password, ready", [("pw-alice", True), ("wrong", False)])
def test_auto_login_with_the_google_recipe(tmp_path: Path, password: str, ready: bool):
    """examples/login-recipes/google.toml in real Chromium through Google-shaped
    pages of the fake IdP; the code the last page shows goes to the CLI."""
    admin = {"authorization": "Bearer admin-token"}
    recipe = str(Path(__file__).resolve().parents[2] / "examples" / "login-recipes" /
                 "google.toml")
    with FakeIdP({"alice@example.com": "pw-alice"}) as idp, \
            GeminiCliUpstream(oauth_token="ya29.fake") as code_assist:
        worker = gemini_worker(
            "gemini-a", tmp_path / "a", code_assist.url, tmp_path / "g.log", api_key=None,
            env_extra={"CODE_ASSIST_ENDPOINT": code_assist.url,
                       "FAKE_GEMINI_OAUTH_URL": f"{idp.url}/o/oauth2/v2/auth"},
            login=LoginSettings(recipe=recipe, username=SecretStr("alice@example.com"),
                                password=SecretStr(password), timeout=30))
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
            done = wait_for(lambda: (s := http.get("/internal/workers/gemini-a/login",
                                                   headers=admin).json())["state"]
                            in ("ready", "failed") and s, timeout=120)
            assert (done["state"] == "ready") is ready, str(done)
            if ready:
                assert done["auto"] is True and done["login"] == "ready"
                with openai_client(srv) as oai:
                    out = oai.chat.completions.create(model=MODEL, messages=[
                        {"role": "user", "content": "hi"}])
                assert out.choices[0].message.content == "echo: hi"
            else:
                assert done["reason"] == "wrong_password", str(done)
                assert not (tmp_path / "a" / ".gemini" / "oauth_creds.json").exists()


def test_a_cli_that_dies_mid_turn_is_an_error_without_its_stderr(one, upstream, capfd):
    srv, http, log, _ = one
    with openai_client(srv) as oai:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.APIStatusError) as caught:
            oai.chat.completions.create(model=MODEL, messages=[
                {"role": "user", "content": "hi"}, {"role": "assistant", "content": "echo: hi"},
                {"role": "user", "content": "[[crash]] now"}])
    assert caught.value.status_code == 502 and "ya29.secret" not in str(caught.value.body)
    assert "ya29.secret" not in "".join(capfd.readouterr())  # nor in any log line
