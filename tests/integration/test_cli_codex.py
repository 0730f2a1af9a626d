"""Codex cli workers behind a real poolgate, driven by the real SDKs.

Each worker child runs one codex app-server for its account: the fake one
(tests/fakes/codex_app_server.py) and, under the ``cli`` marker, the real
Codex 0.169.0 binary with an API-key ``auth.json`` and a custom provider.
Both answer from the same fake Responses upstream.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.responses_upstream import ResponsesUpstream
from tests.integration.clis import (CODEX, PINNED_VERSIONS, command_executions, ensure_cli,
                                    final_message, run_codex)
from tests.support.cli_accounts import wait_for
from tests.support.codex_accounts import (
    CODEX_MODEL as MODEL, FAKE_CODEX, app_server_pid, codex_home, codex_worker, turn_inputs,
)
from tests.support.procs import alive
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

ADMIN = {"authorization": "Bearer admin-token"}
KEY = "sk-codex-team-account"
CLIENT_KEYS = {"team-a": "sk-team-a"}
WEATHER_OAI = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
WEATHER_ANT = {"name": "get_weather", "description": "The weather in a city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
CALL = '[[tool:get_weather {"city": "Paris"}]]'


def real_codex() -> tuple[str, ...]:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install the Codex CLI")
    path = ensure_cli(*CODEX)
    assert path is not None
    return (path,)


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.cli)])
def command(request: pytest.FixtureRequest) -> tuple[str, ...]:
    return FAKE_CODEX if request.param == "fake" else real_codex()


@pytest.fixture
def upstream() -> Iterator[ResponsesUpstream]:
    with ResponsesUpstream(api_key=KEY, models=(MODEL,)) as fake:
        yield fake


def gateway(*workers: WorkerSettings) -> ServerThread:
    settings = Settings(server=ServerSettings(admin_token="admin-token", api_keys=CLIENT_KEYS,
                                              metrics_public=True), workers=workers)
    return ServerThread(create_app(settings))


@pytest.fixture
def one(tmp_path: Path, upstream: ResponsesUpstream,
        command: tuple[str, ...]) -> Iterator[tuple[Any, httpx.Client, Path]]:
    home = codex_home(tmp_path / "a", KEY)
    worker = codex_worker("codex-a", home, upstream.url, command=command)
    with gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        yield srv, http, home


def oai(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-team-a", max_retries=0)


def ant(srv: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="sk-team-a", max_retries=0)


def workers(http: httpx.Client) -> dict[str, dict]:
    return {w["name"]: w for w in http.get("/internal/workers", headers=ADMIN).json()["workers"]}


def items(upstream: ResponsesUpstream, n: int = -1) -> list[tuple[str, str | None, str]]:
    """(type, role, text) of the input items of the n-th request upstream."""
    out = []
    for item in upstream.responses[n].body["input"]:
        content = item.get("content")
        text = "".join(c.get("text", "") for c in content) if isinstance(content, list) else ""
        out.append((item["type"], item.get("role"), text or str(item.get("output", ""))))
    return out


def test_a_turn_and_a_streamed_turn_in_both_dialects(one, upstream):
    srv, http, home = one
    with oai(srv) as client:
        out = client.chat.completions.create(model=MODEL, messages=[
            {"role": "system", "content": "Be terse."}, {"role": "user", "content": "hello codex"}])
    assert out.choices[0].message.content == "echo: hello codex"
    assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == 3
    # chat mode: the client's system prompt is the whole prompt, then the turn
    assert items(upstream) == [("message", "developer", "Be terse."),
                               ("message", "user", "hello codex")]
    with ant(srv) as client, client.messages.stream(model=MODEL, max_tokens=64, messages=[
            {"role": "user", "content": "streamed words here"}]) as stream:
        chunks = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(chunks) == "echo: streamed words here" and len(chunks) > 1
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 4
    info = wait_for(lambda: (w := workers(http)["codex-a"])["conversations"] == 2 and w)
    assert (info["kind"], info["cli"], info["version"], info["login"]) == (
        "cli", "codex", PINNED_VERSIONS["@openai/codex"], "ready")
    assert info["cooldown_until"] is None


def test_second_turn_reuses_the_thread_and_sends_only_the_new_turn(one, upstream):
    srv, http, home = one
    history = [{"role": "user", "content": "first question"}]
    with oai(srv) as client:
        first = client.chat.completions.create(model=MODEL, messages=history)
        history += [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "second question"}]
        second = client.chat.completions.create(model=MODEL, messages=history)
    assert second.choices[0].message.content == "echo: second question"
    # the upstream sees one Codex thread growing, the new turn as its own item
    assert [t for _, _, t in items(upstream)] == [
        "You are a helpful assistant.", "first question", "echo: first question",
        "second question"]
    assert upstream.responses[0].body["prompt_cache_key"] == \
        upstream.responses[1].body["prompt_cache_key"]  # the same thread
    if (home / "turns.jsonl").exists():  # the fake logs what the CLI was sent
        turns = turn_inputs(home)
        assert [t["text"] for t in turns] == ["first question", "second question"]
        assert turns[0]["thread"] == turns[1]["thread"]
    stats = wait_for(lambda: (s := http.get("/internal/stats", headers=ADMIN).json()
                              ["cli_sessions"]["workers"]["codex-a"])["hits"] == 1 and s)
    assert stats == {"hits": 1, "misses": 1, "rebuilds": 0}


def test_openai_tool_round_trip_holds_the_codex_call(one, upstream):
    srv, http, home = one
    messages: list[dict] = [{"role": "user", "content": f"weather? {CALL}"}]
    with oai(srv) as client:
        first = client.chat.completions.create(model=MODEL, messages=messages,
                                               tools=[WEATHER_OAI])
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "get_weather", {"city": "Paris"})
        assert len(upstream.responses) == 1  # Codex holds its call: nothing more went up
        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Sunny 21C"}]
        stream = client.chat.completions.create(model=MODEL, messages=messages,
                                                tools=[WEATHER_OAI], stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "tool said: Sunny 21C"
    assert items(upstream)[-1] == ("function_call_output", None, "Sunny 21C")
    if (home / "turns.jsonl").exists():
        assert len(turn_inputs(home)) == 1  # the result answered the held call, no new turn


def test_anthropic_tool_round_trip_holds_the_codex_call(one, upstream):
    srv, http, home = one
    messages: list[dict] = [{"role": "user", "content": f"weather? {CALL}"}]
    with ant(srv) as client:
        first = client.messages.create(model=MODEL, max_tokens=256, messages=messages,
                                       tools=[WEATHER_ANT])
        assert first.stop_reason == "tool_use"
        (use,) = [b for b in first.content if b.type == "tool_use"]
        assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
        messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": "Foggy"}]}]
        second = client.messages.create(model=MODEL, max_tokens=256, messages=messages,
                                        tools=[WEATHER_ANT])
    assert second.content[0].text == "tool said: Foggy" and second.stop_reason == "end_turn"
    assert items(upstream)[-1] == ("function_call_output", None, "Foggy")


def test_client_disconnect_interrupts_the_turn(one, upstream):
    srv, http, home = one
    body = {"model": MODEL, "stream": True,
            "messages": [{"role": "user", "content": "one two three four [[hang-after:6]]"}]}
    with http.stream("POST", "/v1/chat/completions", json=body,
                     headers={"authorization": "Bearer sk-team-a"}) as response:
        for line in response.iter_lines():
            if '"content"' in line:
                break  # the turn is streaming: leave mid-way
    # turn/interrupt went to Codex, which dropped its upstream request
    assert wait_for(lambda: upstream.disconnects >= 1, timeout=30)
    wait_for(lambda: workers(http)["codex-a"]["in_flight"] == 0)
    with oai(srv) as client:  # the account still serves
        out = client.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "still here"}])
    assert out.choices[0].message.content == "echo: still here"


def test_kill_9_mid_turn_ends_the_stream_and_the_worker_restarts(tmp_path, upstream, command):
    home = codex_home(tmp_path / "a", KEY)
    worker = codex_worker("codex-a", home, upstream.url, command=command)
    with gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        with oai(srv) as client:
            stream = client.chat.completions.create(model=MODEL, stream=True, messages=[
                {"role": "user", "content": "one two three [[hang-after:6]]"}])
            got = []
            with pytest.raises(openai.APIError) as err:
                for chunk in stream:
                    got.append(chunk)
                    if len(got) == 2:
                        killed = app_server_pid(home)
                        assert killed is not None
                        os.kill(killed, signal.SIGKILL)
            assert "the codex CLI failed the turn" in str(err.value)
        wait_for(lambda: app_server_pid(home) not in (None, killed) and
                 workers(http)["codex-a"]["state"] == "ready", timeout=30)
        assert workers(http)["codex-a"]["restarts"] >= 1
        with oai(srv) as client:
            out = client.chat.completions.create(model=MODEL, messages=[
                {"role": "user", "content": "again"}])
        assert out.choices[0].message.content == "echo: again"


def test_upstream_401_logs_the_account_out_and_the_other_serves(tmp_path, upstream, command):
    revoked, good = codex_home(tmp_path / "a", "sk-revoked"), codex_home(tmp_path / "b", KEY)
    with gateway(codex_worker("codex-a", revoked, upstream.url, command=command),
                 codex_worker("codex-b", good, upstream.url, command=command)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http, oai(srv) as client:
        wait_for(lambda: all(w["login"] == "ready" for w in workers(http).values()))
        answers = [client.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": f"question {n}"}]).choices[0].message.content
                   for n in range(3)]
        assert answers == [f"echo: question {n}" for n in range(3)]
        info = wait_for(lambda: (w := workers(http))["codex-a"]["login"] == "logged_out" and w,
                        timeout=5)
        assert info["codex-a"]["state"] != "ready" and info["codex-b"]["login"] == "ready"
        # account a was tried once (a 401 at its first upstream call), then never picked
        refused = [r for r in upstream.responses
                   if r.headers["authorization"] == "Bearer sk-revoked"]
        assert 1 <= len(refused) <= 2
        served = [r for r in upstream.responses if r.headers["authorization"] == f"Bearer {KEY}"]
        assert len(served) == 3


@pytest.mark.cli  # the client is the real Codex CLI, whatever the worker runs
def test_codex_cli_as_a_client_of_a_codex_worker(one, upstream, tmp_path):
    """Codex CLI (``codex exec``, the real binary) → poolgate's Responses API → a
    codex cli worker → the fake upstream. Its shell tool is a client tool for
    the worker: the call comes back to the client Codex, which runs it."""
    srv, http, home = one
    workspace, client_home = tmp_path / "ws", tmp_path / "client"
    workspace.mkdir()
    secret = f"KIWI-{os.getpid()}"
    (workspace / "hello.txt").write_text(f"The secret word is {secret}.\n")
    client = real_codex()[0]  # ensures the npm install; run_codex finds it again
    assert client

    def codex(prompt: str) -> list[dict]:
        return run_codex(srv.url + "/v1", "sk-team-a", prompt, model=MODEL, cwd=workspace,
                         home=client_home, timeout=120)

    assert final_message(codex("Say hello to poolgate")).endswith("Say hello to poolgate")
    # the worker offers the client's exec_command as client_exec_command (a name
    # Codex keeps for itself); a model calling it reaches the client's shell
    events = codex('What is the secret? [[tool:client_exec_command {"cmd": "cat hello.txt"}]]')
    (run,) = command_executions(events)
    assert run["exit_code"] == 0 and secret in run["aggregated_output"]
    assert final_message(events).startswith("tool said: ") and secret in final_message(events)
    kind, _, output = items(upstream)[-1]
    assert kind == "function_call_output" and secret in output


def test_a_held_call_is_released_and_a_late_answer_rebuilds(tmp_path, upstream, command):
    home = codex_home(tmp_path / "a", KEY)
    worker = codex_worker("codex-a", home, upstream.url, command=command, tool_timeout=1.5)
    messages: list[dict] = [{"role": "user", "content": f"weather? {CALL}"}]
    with gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http, \
            oai(srv) as client:
        first = client.chat.completions.create(model=MODEL, messages=messages,
                                               tools=[WEATHER_OAI]).choices[0]
        (call,) = first.message.tool_calls
        wait_for(lambda: workers(http)["codex-a"]["held_tool_calls"] == 1)
        # the client did not come back in time: the held Codex call was released
        wait_for(lambda: workers(http)["codex-a"]["conversations"] == 0, timeout=15)
        messages += [first.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Late sun"}]
        late = client.chat.completions.create(model=MODEL, messages=messages,
                                              tools=[WEATHER_OAI])
        assert late.choices[0].message.content == "tool said: Late sun"
        wait_for(lambda: http.get("/internal/stats", headers=ADMIN).json()
                 ["cli_sessions"]["workers"]["codex-a"]["rebuilds"] == 1)
    # rebuilt into a new thread: the call and its late result injected as history
    assert items(upstream)[-3:] == [("message", "user", f"weather? {CALL}"),
                                    ("function_call", None, ""),
                                    ("function_call_output", None, "Late sun")]


def test_a_spent_quota_cools_the_account_down_until_it_resets(tmp_path, upstream):
    spent, spare = codex_home(tmp_path / "a", KEY), codex_home(tmp_path / "b", KEY)
    (spent / "fault").write_text("usage")  # the fake's 429 usage_limit_reached, reset in 1 h
    with gateway(codex_worker("codex-a", spent, upstream.url),
                 codex_worker("codex-b", spare, upstream.url)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http, oai(srv) as client:
        wait_for(lambda: all(w["login"] == "ready" for w in workers(http).values()))
        answers = [client.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": f"q{n}"}]).choices[0].message.content for n in range(3)]
        assert answers == ["echo: q0", "echo: q1", "echo: q2"]
        info = wait_for(lambda: (w := workers(http)["codex-a"])["cooldown_until"] and w)
        # the reset time Codex printed ("try again at H:MM AM"), to the minute
        assert 3500 < info["cooldown_until"] - time.time() <= 3600
        assert info["login"] == "ready"  # a quota is not a logout
        assert len(turn_inputs(spent)) == 1 and len(turn_inputs(spare)) == 3


def test_kill_9_of_the_worker_child_leaves_no_app_server_behind(one, upstream):
    srv, http, home = one
    child = workers(http)["codex-a"]["pid"]
    server = wait_for(lambda: app_server_pid(home))
    lines = []
    killed = False
    with http.stream("POST", "/v1/chat/completions", headers={"authorization": "Bearer sk-team-a"},
                     json={"model": MODEL, "stream": True, "messages": [
                         {"role": "user", "content": "one two three [[hang-after:6]]"}]}) as r:
        for line in r.iter_lines():
            lines.append(line)
            # once: a second look may find it still exiting, and then reaped before the kill
            if '"content"' in line and not killed:
                assert alive(child)
                os.kill(child, signal.SIGKILL)
                killed = True
    assert killed
    data = [line[6:] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and any('"error"' in d for d in data[:-1])
    wait_for(lambda: not alive(server), timeout=10)  # the parent-death signal took it along
    info = wait_for(lambda: (w := workers(http)["codex-a"])["state"] == "ready"
                    and w["pid"] != child and w, timeout=30)
    assert info["restarts"] == 1 and info["conversations"] == 0
    with oai(srv) as client:
        out = client.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "back"}])
    assert out.choices[0].message.content == "echo: back"


def test_a_hung_app_server_is_killed_and_the_account_restarted(tmp_path, upstream, command):
    home = codex_home(tmp_path / "a", KEY)
    worker = codex_worker("codex-a", home, upstream.url, command=command,
                          cli_options={"watchdog_seconds": 0.5})
    with gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        child = wait_for(lambda: (w := workers(http)["codex-a"])["state"] == "ready" and w["pid"])
        server = wait_for(lambda: app_server_pid(home))
        os.kill(server, signal.SIGSTOP)  # alive for the OS, answers nothing
        info = wait_for(lambda: (w := workers(http)["codex-a"])["state"] == "ready"
                        and w["pid"] != child and w, timeout=30)
        assert info["restarts"] == 1
        wait_for(lambda: not alive(server), timeout=10)
        with oai(srv) as client:
            out = client.chat.completions.create(model=MODEL, messages=[
                {"role": "user", "content": "revived"}])
        assert out.choices[0].message.content == "echo: revived"


def test_responses_api_tool_round_trip_chained_by_previous_response_id(one, upstream):
    srv, http, home = one
    tool = {"type": "function", "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    with oai(srv) as client:
        first = client.responses.create(model=MODEL, input=f"weather? {CALL}", tools=[tool])
        (call,) = [o for o in first.output if o.type == "function_call"]
        assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
        second = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[tool],
                                         input=[{"type": "function_call_output",
                                                 "call_id": call.call_id, "output": "Hail"}])
    assert second.output_text == "tool said: Hail"
    assert items(upstream)[-1] == ("function_call_output", None, "Hail")
    wait_for(lambda: http.get("/internal/stats", headers=ADMIN).json()
             ["cli_sessions"]["workers"]["codex-a"] == {"hits": 1, "misses": 1, "rebuilds": 0})
    if (home / "turns.jsonl").exists():
        assert [t["text"] for t in turn_inputs(home)] == [f"weather? {CALL}"]


def _threads(home: Path) -> list[dict]:
    path = home / "threads.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _closed_every_thread(home: Path) -> bool:
    log = _threads(home)
    started = {e["thread"] for e in log if e["op"] == "start"}
    return bool(started) and started <= {e["thread"] for e in log if e["op"] == "unsubscribe"}


HISTORY = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "answer"},
           {"role": "user", "content": "and now"}]


def test_a_thread_whose_inject_fails_is_closed(tmp_path, upstream):
    home = codex_home(tmp_path / "a", KEY)
    (home / "fault").write_text("inject-fails")
    with gateway(codex_worker("codex-a", home, upstream.url, command=FAKE_CODEX)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: workers(http)["codex-a"]["state"] == "ready")
        r = http.post("/v1/chat/completions", headers={"authorization": "Bearer sk-team-a"},
                      json={"model": MODEL, "messages": HISTORY})
        assert r.status_code >= 500
        wait_for(lambda: _closed_every_thread(home), timeout=10)
        assert workers(http)["codex-a"]["conversations"] == 0


def test_a_thread_whose_request_is_cancelled_while_it_opens_is_closed(tmp_path, upstream):
    home = codex_home(tmp_path / "a", KEY)
    (home / "fault").write_text("inject-slow")  # inject_items answers after 3 s
    with gateway(codex_worker("codex-a", home, upstream.url, command=FAKE_CODEX)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: workers(http)["codex-a"]["state"] == "ready")
        with httpx.Client(base_url=srv.url, timeout=1.0) as impatient, \
                pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/chat/completions", headers={"authorization": "Bearer sk-team-a"},
                           json={"model": MODEL, "stream": True, "messages": HISTORY})
        wait_for(lambda: _threads(home), timeout=10)
        wait_for(lambda: _closed_every_thread(home), timeout=15)
        (home / "fault").write_text("")
        with oai(srv) as client:  # the account still serves
            out = client.chat.completions.create(model=MODEL, messages=[
                {"role": "user", "content": "still here"}])
        assert out.choices[0].message.content == "echo: still here"
