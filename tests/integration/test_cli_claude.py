"""Claude cli workers behind a real poolgate, driven by the real SDKs: the
fake ``claude`` CLI (tests/fakes/fake_claude.py) in supervised worker
children, its replies from a fake Anthropic upstream."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import (claude_home, fake_claude_worker, read_log, spawns,
                                        user_lines, wait_for)
from tests.support.procs import alive
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

ADMIN = {"authorization": "Bearer admin-token"}
TOKEN = "sk-ant-oat01-team-account"
MODEL = "claude-sonnet-4-6"
KEYS = {"team-a": "sk-team-a", "team-b": "sk-team-b"}


@pytest.fixture
def upstream():
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as fake:
        yield fake


def _gateway(*workers):
    settings = Settings(server=ServerSettings(admin_token="admin-token", api_keys=KEYS,
                                              metrics_public=True),
                        workers=tuple(workers))
    return ServerThread(create_app(settings))


@pytest.fixture
def one(tmp_path: Path, upstream: FakeUpstream):
    log = tmp_path / "claude.log"
    worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                upstream.anthropic_url, log)
    with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        yield srv, http, log


def _oai(srv, key: str = "sk-team-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)


def _ant(srv, key: str = "sk-team-a") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key=key, max_retries=0)


def _counts(http: httpx.Client, worker: str, expected: dict[str, int]) -> dict[str, int]:
    """The worker's session counts once they equal ``expected`` (the status is
    polled from the child just after each answer), else the last seen."""
    seen: dict[str, int] = {}

    def current() -> bool:
        nonlocal seen
        stats = http.get("/internal/stats", headers=ADMIN).json()["cli_sessions"]
        seen = stats["workers"][worker]
        return seen == expected

    try:
        wait_for(current, timeout=5)
    except AssertionError:
        pass
    return seen


def _workers(http: httpx.Client) -> dict[str, dict]:
    return {w["name"]: w for w in http.get("/internal/workers", headers=ADMIN).json()["workers"]}


def test_a_turn_and_a_streamed_turn_in_both_dialects(one, upstream):
    srv, http, log = one
    with _oai(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[
            {"role": "system", "content": "Be terse."}, {"role": "user", "content": "hello cli"}])
    assert out.choices[0].message.content == "echo: hello cli"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens > 0 and out.usage.prompt_tokens > 0
    with _ant(srv) as ant, ant.messages.stream(model=MODEL, max_tokens=64, messages=[
            {"role": "user", "content": "streamed words here"}]) as stream:
        chunks = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(chunks) == "echo: streamed words here" and len(chunks) > 1
    assert final.stop_reason == "end_turn"
    # chat mode: no CLI tools, the client's system prompt (or the gateway's) as the whole prompt
    first = upstream.requests[0].body
    assert first["system"] == [{"type": "text", "text": "Be terse."}] and "tools" not in first
    argv = spawns(log)[0]["argv"]
    assert argv[argv.index("--tools") + 1] == "" and "--include-partial-messages" in argv
    assert f"--model={MODEL}" in argv  # one argument: never taken for another option
    info = wait_for(lambda: (w := _workers(http)["claude-a"])["conversations"] == 2 and w)
    assert (info["kind"], info["cli"], info["version"], info["login"]) == (
        "cli", "claude", "2.1.197", "ready")
    assert info["account"] == "a@example.com" and info["cooldown_until"] is None


def test_second_turn_sends_only_the_new_turn_to_the_same_cli(one, upstream):
    srv, http, log = one
    history = [{"role": "user", "content": "first question"}]
    with _oai(srv) as oai:
        first = oai.chat.completions.create(model=MODEL, messages=history)
        history += [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "second question"}]
        second = oai.chat.completions.create(model=MODEL, messages=history)
    assert second.choices[0].message.content == "echo: second question"
    sent = user_lines(log)
    assert [m["message"]["content"] for m in sent] == ["first question", "second question"]
    assert sent[0]["pid"] == sent[1]["pid"] and len(spawns(log)) == 1
    # the upstream saw one conversation growing
    bodies = [r.body for r in upstream.requests if r.body]
    assert [len(b["messages"]) for b in bodies] == [1, 3]
    assert bodies[1]["messages"][:1] == bodies[0]["messages"]
    expected = {"hits": 1, "misses": 1, "rebuilds": 0}
    assert _counts(http, "claude-a", expected) == expected
    metrics = http.get("/metrics").text
    assert 'poolgate_cli_session_turns_total{outcome="hit",worker="claude-a"} 1.0' in metrics


def test_two_keys_with_the_same_conversation_never_share_a_session(one, upstream):
    srv, http, log = one
    turn1 = [{"role": "user", "content": "shared opening"}]
    with _oai(srv, "sk-team-a") as a, _oai(srv, "sk-team-b") as b:
        reply = a.chat.completions.create(model=MODEL, messages=turn1).choices[0].message.content
        turn2 = turn1 + [{"role": "assistant", "content": reply},
                         {"role": "user", "content": "and then"}]
        b.chat.completions.create(model=MODEL, messages=turn2)  # team b never had turn 1
        a.chat.completions.create(model=MODEL, messages=turn2)
    expected = {"hits": 1, "misses": 1, "rebuilds": 1}
    assert _counts(http, "claude-a", expected) == expected
    sent = user_lines(log)
    assert sent[2]["pid"] == sent[0]["pid"] and sent[1]["pid"] != sent[0]["pid"]


def test_a_conversation_evicted_is_rebuilt_with_resume(tmp_path, upstream):
    log = tmp_path / "claude.log"
    worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                upstream.anthropic_url, log, max_conversations=1)
    with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http, \
            _oai(srv) as oai:
        x = [{"role": "user", "content": "conversation x"}]
        x_reply = oai.chat.completions.create(model=MODEL, messages=x).choices[0].message.content
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "other y"}])
        x += [{"role": "assistant", "content": x_reply}, {"role": "user", "content": "x again"}]
        out = oai.chat.completions.create(model=MODEL, messages=x)
        assert out.choices[0].message.content == "echo: x again"
        expected = {"hits": 0, "misses": 2, "rebuilds": 1}
        assert _counts(http, "claude-a", expected) == expected
    third = spawns(log)[2]["argv"]
    assert "--resume" in third
    assert user_lines(log)[-1]["message"]["content"] == "x again"  # only the new turn
    last = upstream.last.body["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user"]
    assert last[1]["content"] == [{"type": "text", "text": x_reply}]


def test_refuses_what_a_cli_cannot_honour(one):
    srv, http, _log = one
    with _oai(srv) as oai:
        for extra, param in (({"temperature": 0.2}, "temperature"), ({"n": 2}, "n"),
                             ({"logprobs": True}, "logprobs"), ({"seed": 7}, "seed")):
            with pytest.raises(openai.BadRequestError) as err:
                oai.chat.completions.create(model=MODEL, messages=[
                    {"role": "user", "content": "x"}], **extra)
            assert err.value.body["param"] == param
    with _ant(srv) as ant, pytest.raises(anthropic.BadRequestError) as err:
        ant.messages.create(model=MODEL, max_tokens=10, extra_body={"top_k": 3},
                            messages=[{"role": "user", "content": "x"}])
    assert "top_k" in str(err.value)
    assert _workers(http)["claude-a"]["in_flight"] == 0


WEATHER_OPENAI = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
WEATHER_ANTHROPIC = [{"name": "get_weather", "description": "The weather in a city.",
                      "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
CALL = '[[tool:mcp__gw__get_weather {"city": "Paris"}]]'  # the model sees the MCP name


def _mcp_replies(log: Path) -> list[dict]:
    """The tools/call answers the gateway wrote to the CLI (held calls released)."""
    out = []
    for entry in read_log(log):
        msg = entry.get("stdin", {})
        mcp = (msg.get("response") or {}).get("response", {}).get("mcp_response", {})
        if msg.get("type") == "control_response" and "content" in mcp.get("result", {}):
            out.append(mcp["result"])
    return out


def test_client_tool_round_trip_openai(one, upstream):
    srv, http, log = one
    messages = [{"role": "user", "content": f"weather please {CALL}"}]
    with _oai(srv) as oai:
        first = oai.chat.completions.create(model=MODEL, messages=messages, tools=WEATHER_OPENAI)
        assert first.choices[0].finish_reason == "tool_calls"
        [call] = first.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Sunny 21C"}]
        second = oai.chat.completions.create(model=MODEL, messages=messages, tools=WEATHER_OPENAI)
    assert second.choices[0].message.content == "tool said: Sunny 21C"
    assert second.choices[0].finish_reason == "stop"
    # the held tools/call was answered in the same CLI: no new user turn, no new process
    assert len(user_lines(log)) == 1 and len(spawns(log)) == 1
    assert _mcp_replies(log) == [{"content": [{"type": "text", "text": "Sunny 21C"}],
                                  "isError": False}]
    tools = upstream.last.body["tools"]
    assert [t["name"] for t in tools] == ["mcp__gw__get_weather"]
    assert _counts(http, "claude-a", {"hits": 1, "misses": 1, "rebuilds": 0})["hits"] == 1


def test_client_tool_round_trip_anthropic_streamed(one, upstream):
    srv, http, log = one
    messages = [{"role": "user", "content": f"weather {CALL}"}]
    with _ant(srv) as ant:
        with ant.messages.stream(model=MODEL, max_tokens=256, messages=messages,
                                 tools=WEATHER_ANTHROPIC) as stream:
            first = stream.get_final_message()
        assert first.stop_reason == "tool_use"
        [use] = [b for b in first.content if b.type == "tool_use"]
        assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
        messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": "Rainy 9C"}]}]
        with ant.messages.stream(model=MODEL, max_tokens=256, messages=messages,
                                 tools=WEATHER_ANTHROPIC) as stream:
            text = "".join(stream.text_stream)
            second = stream.get_final_message()
    assert text == "tool said: Rainy 9C" and second.stop_reason == "end_turn"
    assert len(user_lines(log)) == 1 and len(spawns(log)) == 1
    assert [r["content"][0]["text"] for r in _mcp_replies(log)] == ["Rainy 9C"]


def test_a_client_that_never_comes_back_releases_the_held_call(tmp_path, upstream):
    log = tmp_path / "claude.log"
    worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                upstream.anthropic_url, log, tool_timeout=0.5)
    with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http, \
            _oai(srv) as oai:
        messages = [{"role": "user", "content": f"weather {CALL}"}]
        first = oai.chat.completions.create(model=MODEL, messages=messages, tools=WEATHER_OPENAI)
        pid = spawns(log)[0]["pid"]
        wait_for(lambda: not alive(pid), timeout=10)  # released: the CLI process is gone
        wait_for(lambda: _workers(http)["claude-a"]["conversations"] == 0)
        # coming back late still works: the conversation is rebuilt with the tool result
        [call] = first.choices[0].message.tool_calls
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Late sun"}]
        late = oai.chat.completions.create(model=MODEL, messages=messages, tools=WEATHER_OPENAI)
        assert late.choices[0].message.content == "tool said: Late sun"
        assert "--resume" in spawns(log)[1]["argv"]
        expected = {"hits": 0, "misses": 1, "rebuilds": 1}
        assert _counts(http, "claude-a", expected) == expected


def _stdin_controls(log: Path, subtype: str) -> list[dict]:
    return [e for e in read_log(log) if e.get("stdin", {}).get("type") == "control_request"
            and e["stdin"]["request"].get("subtype") == subtype]


def test_client_disconnect_interrupts_the_cli_turn(one, upstream):
    srv, http, log = one
    body = {"model": MODEL, "max_tokens": 512, "stream": True,
            "messages": [{"role": "user", "content": "[[hang-after:4]] a long answer"}]}
    with http.stream("POST", "/v1/messages", json=body,
                     headers={"x-api-key": "sk-team-a", "anthropic-version": "2023-06-01"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if "text_delta" in line:
                break  # the client leaves mid-answer
    wait_for(lambda: _stdin_controls(log, "interrupt"), timeout=10)
    wait_for(lambda: upstream.disconnects >= 1, timeout=10)  # the CLI dropped its upstream call
    wait_for(lambda: (w := _workers(http)["claude-a"])["in_flight"] == 0
             and w["conversations"] == 0)
    with _oai(srv) as oai:  # and the worker serves the next request
        out = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "after"}])
    assert out.choices[0].message.content == "echo: after"


def test_kill_9_of_the_cli_mid_turn_ends_the_stream_and_drops_the_session(one, upstream):
    srv, http, log = one
    history = [{"role": "user", "content": "turn one"}]
    with _oai(srv) as oai:
        reply = oai.chat.completions.create(model=MODEL, messages=history).choices[0].message
    history += [{"role": "assistant", "content": reply.content},
                {"role": "user", "content": "[[hang-after:4]] turn two"}]
    pid = spawns(log)[0]["pid"]
    lines = []
    with http.stream("POST", "/v1/chat/completions", headers={"authorization": "Bearer sk-team-a"},
                     json={"model": MODEL, "stream": True, "messages": history}) as r:
        for line in r.iter_lines():
            lines.append(line)
            if '"content":"echo:' in line.replace(" ", ""):
                os.kill(pid, signal.SIGKILL)
    data = [line[6:] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert any('"error"' in d for d in data[:-1])
    wait_for(lambda: _workers(http)["claude-a"]["conversations"] == 0)
    index = http.get("/internal/stats", headers=ADMIN).json()["cli_sessions"]["index"]
    assert index["entries"] == 0 and index["drops"] >= 1
    # the same turn again: rebuilt in a new CLI process from the transcript
    history[-1] = {"role": "user", "content": "turn two again"}
    with _oai(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=history)
    assert out.choices[0].message.content == "echo: turn two again"
    assert spawns(log)[-1]["pid"] != pid and "--resume" in spawns(log)[-1]["argv"]


def test_a_hung_cli_is_killed_and_the_request_times_out(tmp_path, upstream):
    log = tmp_path / "claude.log"
    worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                upstream.anthropic_url, log, idle_timeout=1.0,
                                env={"FAKE_CLAUDE_FAULT": "hang"})
    with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http, \
            _oai(srv) as oai:
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as err:
            oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 504 and time.monotonic() - started < 10
        pid = spawns(log)[0]["pid"]
        wait_for(lambda: not alive(pid), timeout=10)
        info = wait_for(lambda: (w := _workers(http)["claude-a"])["conversations"] == 0 and w)
        assert info["state"] == "ready" and info["in_flight"] == 0


def test_upstream_401_logs_the_account_out_fast_and_another_serves(tmp_path, upstream):
    bad_log, good_log = tmp_path / "bad.log", tmp_path / "good.log"
    bad = fake_claude_worker("claude-bad", claude_home(tmp_path / "bad", "sk-ant-oat01-revoked"),
                             upstream.anthropic_url, bad_log)
    good = fake_claude_worker("claude-good", claude_home(tmp_path / "good", TOKEN),
                              upstream.anthropic_url, good_log)
    with _gateway(bad, good) as srv, httpx.Client(base_url=srv.url, timeout=30) as http, \
            _oai(srv) as oai:
        for n in range(12):
            started = time.monotonic()
            out = oai.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": f"question {n}"}])
            assert time.monotonic() - started < 5
            assert out.headers["x-poolgate-worker"] == "claude-good"
            assert out.parse().choices[0].message.content == f"echo: question {n}"
            if user_lines(bad_log):
                break
        assert user_lines(bad_log), "the bad account was never tried"
        workers = _workers(http)
        assert workers["claude-bad"]["login"] == "logged_out"
        assert workers["claude-bad"]["state"] == "unhealthy"
        assert workers["claude-good"]["login"] == "ready"
        # the fake retries a 401 ten times a second apart, as Claude Code does with an API
        # key: each request above took under 5 s, so the gateway stopped at the first retry
        bad_pid = spawns(bad_log)[0]["pid"]
        wait_for(lambda: not alive(bad_pid), timeout=10)


def test_all_accounts_logged_out_is_a_503_naming_why(tmp_path, upstream):
    log = tmp_path / "claude.log"
    worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", None),
                                upstream.anthropic_url, log)
    with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http, \
            _ant(srv) as ant:
        info = _workers(http)["claude-a"]
        assert (info["login"], info["state"]) == ("logged_out", "unhealthy")
        with pytest.raises(anthropic.APIStatusError) as err:
            ant.messages.create(model=MODEL, max_tokens=10,
                                messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 503
        assert "claude account of worker claude-a is logged out" in str(err.value)
    assert user_lines(log) == []  # never sent to the CLI


def test_a_rate_limited_account_cools_down_until_its_reset_and_another_serves(tmp_path, upstream):
    limited = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                 upstream.anthropic_url, tmp_path / "a.log",
                                 env={"FAKE_CLAUDE_FAULT": "rate-limited"})
    fine = fake_claude_worker("claude-b", claude_home(tmp_path / "b", TOKEN),
                              upstream.anthropic_url, tmp_path / "b.log")
    with _gateway(limited, fine) as srv, httpx.Client(base_url=srv.url, timeout=30) as http, \
            _oai(srv) as oai:
        for n in range(12):
            out = oai.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": f"question {n}"}])
            assert out.headers["x-poolgate-worker"] == "claude-b"
            assert out.parse().choices[0].message.content == f"echo: question {n}"
            if user_lines(tmp_path / "a.log"):
                break
        assert len(user_lines(tmp_path / "a.log")) == 1  # tried once, then left alone
        for n in range(6):  # cooling down: not even tried
            oai.chat.completions.create(model=MODEL, messages=[
                {"role": "user", "content": f"later {n}"}])
        assert len(user_lines(tmp_path / "a.log")) == 1
        info = _workers(http)["claude-a"]
        assert info["state"] == "ready" and info["login"] == "ready"
        assert info["cooldown_until"] > time.time() + 1700  # the reset the CLI reported


def test_a_rate_limit_with_no_other_account_is_a_retry_after(tmp_path, upstream):
    worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                upstream.anthropic_url, tmp_path / "a.log",
                                env={"FAKE_CLAUDE_FAULT": "rate-limited"})
    with _gateway(worker) as srv, _ant(srv) as ant:
        with pytest.raises(anthropic.APIStatusError) as err:
            ant.messages.create(model=MODEL, max_tokens=10,
                                messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code in (429, 529)
    assert int(err.value.response.headers["retry-after"]) > 1700


def test_agent_mode_lets_the_cli_run_its_tools_and_shows_them(tmp_path, upstream):
    home = claude_home(tmp_path / "a", TOKEN)
    log = home / "claude.log"  # agent mode: in the sandbox only the home is writable
    worker = fake_claude_worker("claude-a", home, upstream.anthropic_url, log, mode="agent")
    with _gateway(worker) as srv, _oai(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": '[[tool:Read {"path": "notes.txt"}]]'}])
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "stop" and not message.tool_calls  # nothing to answer
    # chat completions has no executed-tool form: the call the CLI ran and its result as text
    assert message.content == ('\n[Read {"path":"notes.txt"}]\n'
                               "[error: File does not exist: notes.txt]\n"
                               "tool said: File does not exist: notes.txt")
    argv = spawns(log)[0]["argv"]
    assert "--tools" not in argv and argv[argv.index("--permission-mode") + 1] == "default"
    assert [t["name"] for t in upstream.requests[0].body["tools"]] == ["Read"]


def test_max_tokens_and_effort_reach_the_cli_and_a_change_rebuilds(one, upstream):
    srv, http, log = one
    history = [{"role": "user", "content": "one two three four five six"}]
    with _ant(srv) as ant:
        first = ant.messages.create(model=MODEL, max_tokens=3, messages=history)
        assert first.stop_reason == "max_tokens" and first.content[0].text == "echo: one two "
        history += [{"role": "assistant", "content": first.content[0].text},
                    {"role": "user", "content": "more"}]
        ant.messages.create(model=MODEL, max_tokens=50, messages=history)
    assert [r.body["max_tokens"] for r in upstream.requests if r.body] == [3, 50]
    expected = {"hits": 0, "misses": 1, "rebuilds": 1}  # another max_tokens: another process
    assert _counts(http, "claude-a", expected) == expected
    with _oai(srv) as oai:
        oai.chat.completions.create(model=MODEL, reasoning_effort="low",
                                    messages=[{"role": "user", "content": "x"}])
    argv = spawns(log)[-1]["argv"]
    assert "--effort=low" in argv


def test_kill_9_of_the_worker_child_restarts_it_and_leaves_no_cli_behind(one, upstream):
    srv, http, log = one
    child = _workers(http)["claude-a"]["pid"]
    lines = []
    with http.stream("POST", "/v1/chat/completions", headers={"authorization": "Bearer sk-team-a"},
                     json={"model": MODEL, "stream": True, "messages": [
                         {"role": "user", "content": "[[hang-after:4]] go on"}]}) as r:
        for line in r.iter_lines():
            lines.append(line)
            if '"content":"echo:' in line.replace(" ", ""):
                os.kill(child, signal.SIGKILL)
    data = [line[6:] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and any('"error"' in d for d in data[:-1])
    cli_pid = spawns(log)[0]["pid"]
    wait_for(lambda: not alive(cli_pid), timeout=10)  # no orphaned CLI
    info = wait_for(lambda: (w := _workers(http)["claude-a"])["state"] == "ready"
                    and w["pid"] != child and w)
    assert info["restarts"] == 1 and info["conversations"] == 0
    with _oai(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "back"}])
    assert out.choices[0].message.content == "echo: back"


def test_thinking_streams_with_its_signature_and_the_next_turn_reuses_the_session(one, upstream):
    srv, http, log = one
    messages = [{"role": "user", "content": "[[think]] ponder this"}]
    with _ant(srv) as ant:
        first = ant.messages.create(model=MODEL, max_tokens=2000, messages=messages,
                                    thinking={"type": "enabled", "budget_tokens": 1024})
        kinds = [b.type for b in first.content]
        assert kinds == ["thinking", "text"]
        assert first.content[0].thinking and first.content[0].signature
        # the client sends the thinking block back, as Anthropic asks: still the same session
        messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                     {"role": "user", "content": "and next"}]
        second = ant.messages.create(model=MODEL, max_tokens=2000, messages=messages,
                                     thinking={"type": "enabled", "budget_tokens": 1024})
    assert second.content[-1].text == "echo: and next"
    expected = {"hits": 1, "misses": 1, "rebuilds": 0}
    assert _counts(http, "claude-a", expected) == expected
    assert len(spawns(log)) == 1


def test_responses_api_turns_chained_by_previous_response_id_reuse_the_session(one, upstream):
    srv, http, log = one
    with _oai(srv) as oai:
        first = oai.responses.create(model=MODEL, input="first via responses")
        assert first.output_text == "echo: first via responses"
        second = oai.responses.create(model=MODEL, input="second via responses",
                                      previous_response_id=first.id)
    assert second.output_text == "echo: second via responses"
    assert [m["message"]["content"] for m in user_lines(log)] == [
        "first via responses", "second via responses"]
    expected = {"hits": 1, "misses": 1, "rebuilds": 0}
    assert _counts(http, "claude-a", expected) == expected


def test_a_stopped_worker_child_fails_its_pings_and_is_replaced_without_orphans(one, upstream):
    srv, http, log = one
    with _oai(srv) as oai:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "warm"}])
    child = _workers(http)["claude-a"]["pid"]
    cli_pid = spawns(log)[0]["pid"]
    os.kill(child, signal.SIGSTOP)  # hung: alive for the OS, silent to pings
    info = wait_for(lambda: (w := _workers(http)["claude-a"])["state"] == "ready"
                    and w["pid"] != child and w, timeout=20)
    assert info["restarts"] == 1 and info["last_exit"]["reason"] == "hung"
    wait_for(lambda: not alive(cli_pid), timeout=10)
    with _oai(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "new"}])
    assert out.choices[0].message.content == "echo: new"


PIXEL = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5"
         "ErkJggg==")


def test_an_image_reaches_claude_as_an_image_block(one, upstream):
    srv, http, log = one
    with _oai(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}]}])
    assert out.choices[0].message.content == "echo: what is this"
    [message] = upstream.last.body["messages"]
    assert message["content"][1] == {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": PIXEL}}
