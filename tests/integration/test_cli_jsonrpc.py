"""``cli = "jsonrpc"`` workers behind a real poolgate, driven by the real SDKs:
the fake stdio JSON-RPC agent (tests/fakes/fake_jsonrpc_agent.py) with ACP's
method names (the driver's defaults) and with Lingma-style names set in
``cli_options``, its replies from a fake OpenAI upstream."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import wait_for
from tests.support.cli_fakes import (LINGMA_OPTIONS, anthropic_client, fake_cli_worker,
                                     openai_client, processes, serve, stdin_of, worker_info)

pytestmark = pytest.mark.slow

KEY = "sk-agent-account-a"
MODEL = "agent-model"


@pytest.fixture
def upstream():
    with FakeUpstream(api_key=KEY, models=(MODEL,)) as fake:
        yield fake


def _worker(tmp_path: Path, upstream: FakeUpstream, name: str = "agent-a", *,
            api_key: str | None = KEY, **extra):
    log = tmp_path / f"{name}.log"
    return fake_cli_worker("jsonrpc", name, tmp_path / name, upstream.url, log, api_key=api_key,
                           models=(MODEL,), **extra), log


@pytest.fixture
def one(tmp_path: Path, upstream: FakeUpstream):
    worker, log = _worker(tmp_path, upstream)
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: worker_info(http)["agent-a"]["state"] == "ready")
        yield srv, http, log


def _calls(log: Path, method: str) -> list[dict]:
    return [m for m in stdin_of(log) if m.get("method") == method]


def test_a_turn_and_a_streamed_turn_with_acp_defaults(one):
    srv, http, log = one
    with openai_client(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "hello agent"}])
    assert out.choices[0].message.content.endswith("hello agent")
    assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens > 0
    with anthropic_client(srv) as ant, \
            ant.messages.stream(model=MODEL, max_tokens=64, messages=[
                {"role": "user", "content": "streamed words here"}]) as stream:
        chunks = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(chunks).endswith("streamed words here") and len(chunks) > 1
    assert final.stop_reason == "end_turn"
    first = stdin_of(log)[0]
    assert first["method"] == "initialize" and first["params"]["protocolVersion"] == 1
    new = _calls(log, "session/new")
    assert len(new) == 2 and new[0]["params"]["cwd"].endswith("workspace")
    assert len(processes(log)) == 1  # one agent process, a session per conversation
    info = worker_info(http)["agent-a"]
    assert (info["cli"], info["version"], info["login"]) == ("jsonrpc", "1.2.3", "ready")


def test_method_names_and_paths_come_from_cli_options(tmp_path, upstream):
    worker, log = _worker(tmp_path, upstream, args=("--dialect", "lingma"),
                          cli_options=LINGMA_OPTIONS)
    with serve(worker) as srv, openai_client(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "lingma style"}])
    assert out.choices[0].message.content.endswith("lingma style")
    assert out.usage.completion_tokens > 0
    assert [m["method"] for m in stdin_of(log)][:3] == ["chat/init", "chat/start", "chat/ask"]


def test_second_turn_sends_only_the_new_turn_to_the_same_session(one, upstream):
    srv, http, log = one
    history = [{"role": "user", "content": "first question"}]
    with openai_client(srv) as oai:
        first = oai.chat.completions.create(model=MODEL, messages=history)
        history += [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "second question"}]
        second = oai.chat.completions.create(model=MODEL, messages=history)
    assert second.choices[0].message.content == "echo: second question"
    prompts = _calls(log, "session/prompt")
    assert [p["params"]["prompt"][-1]["text"] for p in prompts] == ["first question",
                                                                   "second question"]
    assert len({p["params"]["sessionId"] for p in prompts}) == 1
    assert len(_calls(log, "session/new")) == 1
    # the agent kept the conversation: the upstream saw it grow
    last = [r for r in upstream.requests if r.body][-1].body["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user"]


def test_a_client_that_leaves_cancels_the_prompt(one, upstream):
    srv, http, log = one
    body = {"model": MODEL, "stream": True,
            "messages": [{"role": "user", "content": "[[hang-after:2]] one two three four"}]}
    with http.stream("POST", "/v1/chat/completions", json=body,
                     headers={"authorization": "Bearer sk-team-a"}) as r:
        for line in r.iter_lines():
            if '"content"' in line:
                break
    cancel = wait_for(lambda: _calls(log, "session/cancel"), timeout=10)
    assert cancel[0]["params"]["sessionId"] == _calls(log, "session/prompt")[0]["params"]["sessionId"]
    assert wait_for(lambda: upstream.disconnects >= 1, timeout=10)
    with openai_client(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "next one"}])
    assert out.choices[0].message.content.endswith("next one")
    assert len(processes(log)) == 1  # cancelling a prompt keeps the agent


def test_a_crash_mid_turn_is_an_error_frame_then_a_new_agent_serves(one):
    srv, http, log = one
    r = http.post("/v1/chat/completions", headers={"authorization": "Bearer sk-team-a"},
                  json={"model": MODEL, "stream": True,
                        "messages": [{"role": "user", "content": "[[crash]] boom now"}]})
    frames = [f for f in r.text.split("\n\n") if f]
    assert r.status_code == 200 and any('"content"' in f for f in frames[:-2])
    assert '"error"' in frames[-2] and frames[-1] == "data: [DONE]"
    assert "the jsonrpc CLI failed the turn" in json.loads(frames[-2][6:])["error"]["message"]
    with openai_client(srv) as oai:
        out = oai.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "after the crash"}])
    assert out.choices[0].message.content.endswith("after the crash")
    assert len(processes(log)) == 2


def test_an_agent_that_wants_a_login_is_logged_out_from_the_start(tmp_path, upstream):
    worker, log = _worker(tmp_path, upstream, api_key=None)
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        # the session start() opens meets -32000 "Authentication required"
        info = wait_for(lambda: (w := worker_info(http)["agent-a"])["login"] and w)
        assert (info["login"], info["state"]) == ("logged_out", "unhealthy")
        with anthropic_client(srv) as ant, pytest.raises(anthropic.APIStatusError) as err:
            ant.messages.create(model=MODEL, max_tokens=16,
                                messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code in (503, 529)
        assert "jsonrpc account of worker agent-a is logged out" in str(err.value)
        assert not _calls(log, "session/prompt")


def test_an_upstream_401_mid_conversation_logs_the_account_out(tmp_path, upstream):
    worker, log = _worker(tmp_path, upstream, api_key="sk-revoked")
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: worker_info(http)["agent-a"]["state"] == "ready")
        with openai_client(srv) as oai, pytest.raises(openai.APIStatusError) as err:
            oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 503 and "logged out" in err.value.message
        info = wait_for(lambda: (w := worker_info(http)["agent-a"])["login"] == "logged_out" and w)
        assert info["state"] == "unhealthy"


def test_client_tools_are_refused_naming_the_parameter(one):
    """A JSON-RPC agent has no way to call back: a request with tools is a 400."""
    srv, http, log = one
    with openai_client(srv) as oai, pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                    tools=[{"type": "function", "function": {
                                        "name": "get_weather", "parameters": {"type": "object"}}}])
    assert err.value.body["param"] == "tools"
    assert not _calls(log, "session/prompt")


def test_an_agent_silent_mid_turn_is_a_timeout_and_the_prompt_is_cancelled(tmp_path, upstream):
    worker, log = _worker(tmp_path, upstream, idle_timeout=1.5)
    with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: worker_info(http)["agent-a"]["state"] == "ready")
        with openai_client(srv) as oai, pytest.raises(openai.APIStatusError) as err:
            oai.chat.completions.create(model=MODEL, messages=[
                {"role": "user", "content": "[[hang-after:2]] one two three"}])
        assert err.value.status_code == 504 and "did not answer in time" in err.value.message
        assert wait_for(lambda: _calls(log, "session/cancel"), timeout=10)
        with openai_client(srv) as oai:
            out = oai.chat.completions.create(model=MODEL, messages=[
                {"role": "user", "content": "awake"}])
        assert out.choices[0].message.content.endswith("awake")
