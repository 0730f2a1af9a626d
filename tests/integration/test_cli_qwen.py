"""Qwen Code cli workers behind a real poolgate, driven by the real SDKs: the
fake ``qwen`` CLI (tests/fakes/fake_qwen.py, stream-json as 0.15.10 speaks it)
in supervised worker children, its replies from a fake OpenAI upstream."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anthropic
import httpx
import pytest

from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import user_lines, wait_for
from tests.support.cli_fakes import (anthropic_client, fake_cli_worker, openai_client, pid_alive,
                                     processes, serve, stdin_of, worker_info)

pytestmark = pytest.mark.slow

KEY = "sk-qwen-account-a"
MODEL = "qwen-coder"


@pytest.fixture
def upstream():
    with FakeUpstream(api_key=KEY, models=(MODEL,)) as fake:
        yield fake


@pytest.fixture
def one(tmp_path: Path, upstream: FakeUpstream):
    log = tmp_path / "qwen.log"
    worker = fake_cli_worker("qwen", "qwen-a", tmp_path / "a", upstream.url, log, api_key=KEY)
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: worker_info(http)["qwen-a"]["state"] == "ready")
        yield srv, http, log, tmp_path / "a"


def _posts(upstream: FakeUpstream) -> list:
    return [r for r in upstream.requests if r.body is not None]


def test_a_turn_and_a_streamed_turn(one, upstream):
    srv, http, log, home = one
    with openai_client(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[
            {"role": "system", "content": "Be terse."}, {"role": "user", "content": "hello qwen"}])
    assert out.choices[0].message.content == "echo: hello qwen"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens == 3
    with anthropic_client(srv) as ant, \
            ant.messages.stream(model=MODEL, max_tokens=64, messages=[
                {"role": "user", "content": "streamed words here"}]) as stream:
        chunks = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(chunks) == "echo: streamed words here" and len(chunks) > 1
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 4
    # managed auto-memory is off: one upstream call per turn, not two
    assert len(_posts(upstream)) == 2
    settings = json.loads((home / ".qwen" / "settings.json").read_text())
    assert settings["memory"]["enableManagedAutoMemory"] is False
    # chat mode: every built-in tool excluded, the client's system prompt
    first = _posts(upstream)[0].body
    assert first["tools"] == [] and first["messages"][0]["content"] == "Be terse."
    argv = processes(log)[0]["argv"]
    assert "read_file" in argv[argv.index("--exclude-tools") + 1].split(",")
    assert f"--model={MODEL}" in argv and "--include-partial-messages" in argv
    # initialize goes first, before any prompt
    assert stdin_of(log)[0]["request"]["subtype"] == "initialize"
    info = worker_info(http)["qwen-a"]
    assert (info["cli"], info["version"], info["login"]) == ("qwen", "0.15.10", "ready")


def test_second_turn_sends_only_the_new_turn_to_the_same_process(one, upstream):
    srv, http, log, _ = one
    history = [{"role": "user", "content": "first question"}]
    with openai_client(srv) as oai:
        first = oai.chat.completions.create(model=MODEL, messages=history)
        history += [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "second question"}]
        second = oai.chat.completions.create(model=MODEL, messages=history)
    assert second.choices[0].message.content == "echo: second question"
    sent = user_lines(log)
    assert [m["message"]["content"] for m in sent] == [
        [{"type": "text", "text": "first question"}], [{"type": "text", "text": "second question"}]]
    assert sent[0]["pid"] == sent[1]["pid"] and len(processes(log)) == 1
    # the upstream saw one conversation growing
    last = _posts(upstream)[-1].body["messages"]
    assert [m["role"] for m in last[3:]] == ["user", "assistant", "user"]
    # usage is the turn's, not Qwen's session total
    assert second.usage.completion_tokens == 3


def test_history_it_never_saw_is_resumed_from_a_written_transcript(one, upstream):
    srv, http, log, _ = one
    with openai_client(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "my name is Ada"},
            {"role": "assistant", "content": "Hello Ada"},
            {"role": "user", "content": "who am I"}])
    assert out.choices[0].message.content == "echo: who am I"
    argv = processes(log)[0]["argv"]
    assert "--resume" in argv  # nothing flattened: Qwen loads the history as its own session
    assert [m["message"]["content"] for m in user_lines(log)] == [
        [{"type": "text", "text": "who am I"}]]
    sent = _posts(upstream)[-1].body["messages"][3:]
    assert [(m["role"], m["content"] if m["role"] == "assistant" else m["content"][0]["text"])
            for m in sent] == [("user", "my name is Ada"), ("assistant", "Hello Ada"),
                               ("user", "who am I")]


def test_a_client_that_leaves_ends_the_process_and_the_next_turn_resumes(one, upstream):
    srv, http, log, _ = one
    body = {"model": MODEL, "stream": True,
            "messages": [{"role": "user", "content": "[[hang-after:2]] one two three four"}]}
    with http.stream("POST", "/v1/chat/completions", json=body,
                     headers={"authorization": "Bearer sk-team-a"}) as r:
        for line in r.iter_lines():
            if '"content"' in line:
                break  # first text: leave
    pid = processes(log)[0]["pid"]
    wait_for(lambda: not pid_alive(pid), timeout=10)
    assert wait_for(lambda: upstream.disconnects >= 1, timeout=10)
    with openai_client(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "earlier"}, {"role": "assistant", "content": "echo: earlier"},
            {"role": "user", "content": "back again"}])
    assert out.choices[0].message.content == "echo: back again"
    again = processes(log)[-1]
    assert again["pid"] != pid and "--resume" in again["argv"]


def test_a_crash_mid_turn_is_an_error_frame_then_the_worker_serves_again(one, upstream):
    srv, http, log, _ = one
    r = http.post("/v1/chat/completions", headers={"authorization": "Bearer sk-team-a"},
                  json={"model": MODEL, "stream": True,
                        "messages": [{"role": "user", "content": "[[crash]] boom now"}]})
    assert r.status_code == 200
    frames = [f for f in r.text.split("\n\n") if f]
    assert any('"content"' in f for f in frames[:-2])  # text came before the crash
    assert '"error"' in frames[-2] and frames[-1] == "data: [DONE]"
    assert "the qwen CLI failed the turn" in json.loads(frames[-2][6:])["error"]["message"]
    with anthropic_client(srv) as ant:
        with pytest.raises(anthropic.APIStatusError) as err:
            with ant.messages.stream(model=MODEL, max_tokens=64, messages=[
                    {"role": "user", "content": "[[crash]] boom again"}]) as s:
                for _ in s.text_stream:
                    pass
        assert err.value.body["type"] == "error"
        ok = ant.messages.create(model=MODEL, max_tokens=64,
                                 messages=[{"role": "user", "content": "still here"}])
    assert ok.content[0].text == "echo: still here"


def test_an_account_without_a_key_is_logged_out_and_another_serves(tmp_path, upstream):
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    nokey = fake_cli_worker("qwen", "qwen-nokey", tmp_path / "nokey", upstream.url, log_a,
                            api_key=None)
    with serve(nokey) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        info = wait_for(lambda: (w := worker_info(http)["qwen-nokey"])["login"] and w)
        assert info["login"] == "logged_out"
        with anthropic_client(srv) as ant, \
                pytest.raises(anthropic.APIStatusError) as err:
            ant.messages.create(model=MODEL, max_tokens=16,
                                messages=[{"role": "user", "content": "hi"}])
        # every account is out for a lasting reason: a 503 saying why
        assert err.value.status_code == 503
        assert "qwen account of worker qwen-nokey is logged out" in str(err.value)
    wrong = fake_cli_worker("qwen", "qwen-wrong", tmp_path / "wrong", upstream.url, log_a,
                            api_key="sk-revoked")
    good = fake_cli_worker("qwen", "qwen-good", tmp_path / "good", upstream.url, log_b, api_key=KEY)
    with serve(wrong, good) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: all(w["state"] == "ready" for w in worker_info(http).values()))
        with openai_client(srv) as oai:
            answers = [oai.chat.completions.create(model=MODEL, messages=[
                {"role": "user", "content": f"question {i}"}]).choices[0].message.content
                for i in range(4)]
        # the upstream's 401 never reaches a client as text; that account drops out
        assert answers == [f"echo: question {i}" for i in range(4)]
        info = wait_for(lambda: (w := worker_info(http)["qwen-wrong"])["login"] == "logged_out" and w)
        assert info["state"] != "ready"


def test_a_cli_silent_mid_turn_is_a_timeout_and_is_killed(tmp_path, upstream):
    log = tmp_path / "qwen.log"
    worker = fake_cli_worker("qwen", "qwen-a", tmp_path / "a", upstream.url, log, api_key=KEY,
                             idle_timeout=1.5)
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: worker_info(http)["qwen-a"]["state"] == "ready")
        with anthropic_client(srv) as ant, pytest.raises(anthropic.APIStatusError) as err:
            ant.messages.create(model=MODEL, max_tokens=64, messages=[
                {"role": "user", "content": "[[hang-after:2]] one two three"}])
        assert err.value.status_code == 504 and "did not answer in time" in str(err.value)
        pid = processes(log)[0]["pid"]
        wait_for(lambda: not pid_alive(pid), timeout=10)
        with anthropic_client(srv) as ant:
            ok = ant.messages.create(model=MODEL, max_tokens=64,
                                     messages=[{"role": "user", "content": "awake"}])
        assert ok.content[0].text == "echo: awake"


WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
CALLS = '[[tools:mcp__gw__get_weather {"city": "Paris"} mcp__gw__get_weather {"city": "Rome"}]]'


def _tool_answers(log: Path) -> list[str]:
    """The tools/call results the gateway wrote to the CLI."""
    out = []
    for msg in stdin_of(log):
        result = ((msg.get("response") or {}).get("response") or {}).get("mcp_response", {})
        if msg.get("type") == "control_response" and "content" in result.get("result", {}):
            out.append(result["result"]["content"][0]["text"])
    return out


def test_client_tools_round_trip_openai_parallel_calls(one, upstream):
    srv, http, log, _ = one
    messages = [{"role": "user", "content": f"weather in two cities {CALLS}"}]
    tools = [{"type": "function", "function": WEATHER}]
    with openai_client(srv) as oai:
        first = oai.chat.completions.create(model=MODEL, messages=messages, tools=tools)
        assert first.choices[0].finish_reason == "tool_calls"
        calls = first.choices[0].message.tool_calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
        messages += [first.choices[0].message.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": c.id, "content": f"Sunny in {i}"}
            for i, c in enumerate(calls)]
        second = oai.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    assert second.choices[0].message.content == "tool said: Sunny in 1"
    assert second.choices[0].finish_reason == "stop"
    # Qwen's held tools/call requests were answered in the same process: no new turn
    assert len(user_lines(log)) == 1 and len(processes(log)) == 1
    assert sorted(_tool_answers(log)) == ["Sunny in 0", "Sunny in 1"]
    # the model saw the client's tool through Qwen's in-band MCP server, and no built-in one
    first_call = _posts(upstream)[0].body
    assert [t["function"]["name"] for t in first_call["tools"]] == ["mcp__gw__get_weather"]


def test_client_tool_round_trip_anthropic_streamed(one, upstream):
    srv, http, log, _ = one
    call = '[[tool:mcp__gw__get_weather {"city": "Oslo"}]]'
    messages = [{"role": "user", "content": f"weather {call}"}]
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"],
              "input_schema": WEATHER["parameters"]}]
    with anthropic_client(srv) as ant:
        with ant.messages.stream(model=MODEL, max_tokens=256, messages=messages,
                                 tools=tools) as stream:
            first = stream.get_final_message()
        assert first.stop_reason == "tool_use"
        [use] = [b for b in first.content if b.type == "tool_use"]
        assert (use.name, use.input) == ("get_weather", {"city": "Oslo"})
        messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": "Rainy 9C"}]}]
        with ant.messages.stream(model=MODEL, max_tokens=256, messages=messages,
                                 tools=tools) as stream:
            text = "".join(stream.text_stream)
            second = stream.get_final_message()
    assert text == "tool said: Rainy 9C" and second.stop_reason == "end_turn"
    assert len(user_lines(log)) == 1 and len(processes(log)) == 1
    assert _tool_answers(log) == ["Rainy 9C"]


def test_a_client_that_never_comes_back_releases_the_held_call(tmp_path, upstream):
    log = tmp_path / "qwen.log"
    worker = fake_cli_worker("qwen", "qwen-a", tmp_path / "a", upstream.url, log, api_key=KEY,
                             tool_timeout=0.5)
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http, \
            openai_client(srv) as oai:
        wait_for(lambda: worker_info(http)["qwen-a"]["state"] == "ready")
        first = oai.chat.completions.create(model=MODEL, tools=[
            {"type": "function", "function": WEATHER}], messages=[
            {"role": "user", "content": '[[tool:mcp__gw__get_weather {"city": "Oslo"}]] hi'}])
        assert first.choices[0].finish_reason == "tool_calls"
        pid = processes(log)[0]["pid"]
        wait_for(lambda: not pid_alive(pid), timeout=10)  # released: the qwen process is gone
        wait_for(lambda: worker_info(http)["qwen-a"]["conversations"] == 0)


def test_a_late_client_answers_every_copy_of_a_re_sent_tool_call(tmp_path, upstream):
    """Qwen waits 30 s for a tools/call answer, then sends the call again (here 1 s)."""
    log = tmp_path / "qwen.log"
    worker = fake_cli_worker("qwen", "qwen-a", tmp_path / "a", upstream.url, log, api_key=KEY,
                             env={"FAKE_QWEN_MCP_TIMEOUT": "1"})
    tools = [{"type": "function", "function": WEATHER}]
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http, \
            openai_client(srv) as oai:
        wait_for(lambda: worker_info(http)["qwen-a"]["state"] == "ready")
        messages = [{"role": "user", "content":
                     '[[tool:mcp__gw__get_weather {"city": "Oslo"}]] weather'}]
        first = oai.chat.completions.create(model=MODEL, messages=messages, tools=tools)
        [call] = first.choices[0].message.tool_calls
        time.sleep(1.5)  # the client takes its time: Qwen has sent the call again meanwhile
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Snow -2C"}]
        second = oai.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    assert second.choices[0].message.content == "tool said: Snow -2C"
    copies = _tool_answers(log)
    assert len(copies) >= 2 and set(copies) == {"Snow -2C"}
    assert len(processes(log)) == 1
