"""Claude cli workers behind a real poolgate, driven by the real SDKs: the
fake ``claude`` CLI (tests/fakes/fake_claude.py) in supervised worker
children, its replies from a fake Anthropic upstream."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import (claude_home, fake_claude_worker, spawns, user_lines,
                                        wait_for)
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
    assert argv[argv.index("--model") + 1] == MODEL
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
