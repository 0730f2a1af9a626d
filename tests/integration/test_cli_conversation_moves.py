"""A conversation on a Claude cli account that runs out moves to another
account and goes on: the fake ``claude`` CLI (tests/fakes/fake_claude.py)
in supervised worker children, two accounts of one fake Anthropic vendor
that signs thinking per account and refuses a block another account signed;
the real anthropic SDK against a real poolgate."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anthropic
import httpx
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings
from tests.fakes.scripted import signature_for
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import claude_home, fake_claude_worker, read_log
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

ADMIN = {"authorization": "Bearer admin-token"}
KEY = "sk-team-a"
MODEL = "claude-sonnet-4-6"
TOKENS = {"claude-a": "sk-ant-oat01-account-a", "claude-b": "sk-ant-oat01-account-b"}
WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
THINK = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture
def upstream():
    with FakeUpstream(api_keys=tuple(TOKENS.values()), models=(MODEL,)) as fake:
        fake.check_thinking = True
        yield fake


def _gateway(tmp_path: Path, upstream: FakeUpstream, names: tuple[str, ...]) -> ServerThread:
    workers = tuple(fake_claude_worker(name, claude_home(tmp_path / name, TOKENS[name]),
                                       upstream.anthropic_url, tmp_path / f"{name}.log")
                    for name in names)
    return ServerThread(create_app(Settings(
        server=ServerSettings(admin_token="admin-token", api_keys={"team-a": KEY}),
        workers=workers)))


def _tool_turn(client: anthropic.Anthropic) -> tuple[str, list, object]:
    asked = [{"role": "user", "content": '[[think]] weather? [[tool:mcp__gw__get_weather {"city": "Rome"}]]'}]
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=4096, thinking=THINK,
                                                   tools=[WEATHER], messages=asked)
    return raw.headers["x-poolgate-worker"], asked, raw.parse()


def _answer(client, asked, first) -> tuple[str, object]:
    call = next(b for b in first.content if b.type == "tool_use")
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=4096, thinking=THINK, tools=[WEATHER], messages=[
            *asked, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                          "content": "Hot"}]}])
    return raw.headers["x-poolgate-worker"], raw.parse()


def _transcripts(tmp_path: Path, name: str) -> list[dict]:
    """What the worker's CLI was given to resume from (its log's argv and files)."""
    return [e for e in read_log(tmp_path / f"{name}.log") if "argv" in e and "--resume" in e["argv"]]


def test_a_tool_loop_moves_to_another_claude_account(tmp_path, upstream):
    """The account runs out while the CLI holds the client's tool call: the
    answer goes to the other account, which rebuilds the conversation without
    the first account's signed thinking and, that one turn, without thinking."""
    with _gateway(tmp_path, upstream, tuple(TOKENS)) as srv, \
            anthropic.Anthropic(base_url=srv.url, api_key=KEY, max_retries=0) as client:
        first_worker, asked, first = _tool_turn(client)
        signed = first.content[0]
        assert signed.type == "thinking"
        assert signed.signature == signature_for(signed.thinking, TOKENS[first_worker])
        upstream.limit(TOKENS[first_worker], 1800)
        second_worker, second = _answer(client, asked, first)
        assert second_worker != first_worker
        assert second.content[-1].text == "tool said: Hot"
        sent = upstream.last.body
        assert [b["type"] for b in sent["messages"][1]["content"]] == ["tool_use"]
        assert "thinking" not in sent
        assert _transcripts(tmp_path, second_worker)  # rebuilt there
        workers = httpx.get(f"{srv.url}/internal/workers", headers=ADMIN).json()
        out = next(w for w in workers["workers"] if w["name"] == first_worker)
        assert out["cooldown_until"] is not None
        stats = httpx.get(f"{srv.url}/internal/stats", headers=ADMIN).json()
        assert all(n == 0 for n in stats["in_flight"].values())


def test_a_rebuilt_conversation_keeps_its_own_accounts_thinking(tmp_path, upstream):
    """The CLI that held the conversation is gone (a restart): the same account
    rebuilds it from the client's history, signed thinking included, which
    Anthropic wants back on a tool-use turn while thinking is on."""
    with _gateway(tmp_path, upstream, ("claude-a",)) as srv, \
            anthropic.Anthropic(base_url=srv.url, api_key=KEY, max_retries=0) as client:
        worker, asked, first = _tool_turn(client)
        reply = httpx.post(f"{srv.url}/internal/workers/{worker}/restart", headers=ADMIN,
                           timeout=30)
        assert reply.status_code == 200, reply.text
        for _ in range(100):
            state = httpx.get(f"{srv.url}/internal/workers", headers=ADMIN).json()
            if all(w["state"] == "ready" for w in state["workers"]):
                break
            time.sleep(0.1)
        again, second = _answer(client, asked, first)
        assert again == worker
        assert second.content[-1].text == "tool said: Hot"
        sent = upstream.last.body
        assert sent["messages"][1]["content"][0] == {
            "type": "thinking", "thinking": first.content[0].thinking,
            "signature": first.content[0].signature}
        assert sent["thinking"]["type"] == "enabled"
        assert json.dumps(_transcripts(tmp_path, worker))  # resumed from a written transcript
