"""Routing by what is left, through a real poolgate: three Claude accounts (the
fake ``claude`` CLI in supervised worker children) whose subscription quota
the fake Anthropic upstream announces in its ``anthropic-ratelimit-unified-*``
headers (tests/fakes/vendor_quota.py). A new conversation goes to the account
with the most headroom under every policy; ``quota_reserve`` keeps an account
from new conversations but not from those it holds; when every account is
below its reserve a new conversation is refused in the caller's dialect."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import RoutingSettings, ServerSettings, Settings
from tests.fakes.upstreams import FakeUpstream
from tests.fakes.vendor_quota import FakeQuota
from tests.support.cli_accounts import claude_home, fake_claude_worker
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

ADMIN = {"authorization": "Bearer admin-token"}
MODEL = "claude-sonnet-4-6"
KEY = "sk-team-a"
ACCOUNTS = ("a", "b", "c")
DAY = 86400.0


def token(name: str) -> str:
    return f"sk-ant-oat01-account-{name}"


class Pool:
    """A gateway over the accounts, the upstream's quota per account, and the
    conversations the test started (worker → its history)."""

    def __init__(self, srv: ServerThread, http: httpx.Client, upstream: FakeUpstream,
                 gateway: Any) -> None:
        self.srv, self.http, self.upstream, self.gateway = srv, http, upstream, gateway
        self.held: dict[str, tuple[str, list[dict[str, Any]]]] = {}
        self._n = 0

    def weekly(self, name: str, used: float) -> None:
        """``name`` has used ``used`` percent of a weekly window that began
        half a day ago (Claude Code reports it from 25 %)."""
        self.upstream.quota[token(name)] = FakeQuota(
            seven_day=used, seven_day_reset=float(int(time.time() + 6.5 * DAY)))

    def five_hour(self, name: str, used: float, resets_in: float) -> None:
        """``name`` has used ``used`` percent of its five-hour window, which
        resets in ``resets_in`` seconds (Claude Code reports it from 90 %
        while 72 % or less of the window has passed)."""
        self.upstream.quota[token(name)] = FakeQuota(
            five_hour=used, five_hour_reset=float(int(time.time() + resets_in)))

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.srv.url + "/v1", api_key=KEY, max_retries=0)

    def new(self) -> str:
        """A new conversation's first turn (its own session id); the worker that took it."""
        self._n += 1
        history = [{"role": "user", "content": f"new conversation {self._n}"}]
        return self._turn(f"conversation-{self._n}", history, None)

    def opening(self, worker: str) -> str:
        """A first turn in the session of ``worker``'s conversation (as Claude
        Code asks a side question under its session id); who served it."""
        self._n += 1
        session, _history = self.held[worker]
        return self._turn(session, [{"role": "user", "content": f"aside {self._n}"}], "")

    def again(self, worker: str) -> str:
        """The next turn of the first conversation ``worker`` took; who served it."""
        return self._turn(*self.held[worker], worker)

    def _turn(self, session: str, history: list[dict[str, Any]], owner: str | None) -> str:
        with self.openai() as oai:
            raw = oai.chat.completions.with_raw_response.create(
                model=MODEL, messages=history, extra_headers={"x-session-id": session})
        served = raw.headers["x-poolgate-worker"]
        reply = raw.parse().choices[0].message.content
        history = [*history, {"role": "assistant", "content": reply},
                   {"role": "user", "content": f"and then {len(history)}"}]
        if owner is None:
            self.held.setdefault(served, (session, history))
        elif served == owner:
            self.held[owner] = (session, history)
        return served

    def headroom(self) -> dict[str, float | None]:
        """Each account's headroom as the gateway sees it (None: unknown)."""
        now = time.time()
        return {w.name: None if (left := w.quota.headroom(now)) is None else round(left, 3)
                for w in self.gateway.pool.workers}

    def learn(self, expected: dict[str, float]) -> None:
        """Turns until the gateway sees ``expected`` headroom on these accounts:
        a new conversation while one is unknown (unknown ranks as full, so
        each gets one), else a turn of each differing account's conversation."""
        for _ in range(15):
            seen = {name: self.headroom()[name] for name in expected}
            if seen == expected:
                return
            if None in seen.values():
                self.new()
            else:
                for name, left in expected.items():
                    if seen[name] != left:
                        self.again(name)
            time.sleep(0.2)  # the worker's status is polled just after each answer
        assert {name: self.headroom()[name] for name in expected} == expected

    def in_flight(self) -> dict[str, int]:
        return self.http.get("/internal/stats", headers=ADMIN).json()["in_flight"]


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(models=(MODEL,)) as fake:
        yield fake


def gateway(tmp_path: Path, upstream: FakeUpstream, routing: RoutingSettings,
            **worker: Any) -> ServerThread:
    workers = tuple(
        fake_claude_worker(f"claude-{n}", claude_home(tmp_path / n, token(n)),
                           upstream.anthropic_url, tmp_path / f"{n}.log", **worker.get(n, {}))
        for n in ACCOUNTS)
    settings = Settings(server=ServerSettings(admin_token="admin-token", api_keys={"team-a": KEY}),
                        routing=routing, workers=workers)
    return ServerThread(create_app(settings))


@pytest.fixture
def start(tmp_path: Path, upstream: FakeUpstream) -> Iterator[Any]:
    opened: list[Any] = []

    def open_pool(routing: RoutingSettings | None = None, **worker: Any) -> Pool:
        srv = gateway(tmp_path, upstream, routing or RoutingSettings(), **worker)
        srv.__enter__()
        app = srv.config.app
        opened.append(srv)
        http = httpx.Client(base_url=srv.url, timeout=30)
        opened.append(http)
        for name in ACCOUNTS:
            upstream.quota[token(name)] = FakeQuota()
        return Pool(srv, http, upstream, app.state.gateway)

    yield open_pool
    for thing in reversed(opened):
        thing.__exit__(None, None, None)


@pytest.mark.parametrize("policy", ["session_affinity", "least_in_flight", "prefix_cache"])
def test_new_conversations_go_to_the_account_with_the_most_headroom(start, policy) -> None:
    pool = start(RoutingSettings(policy=policy))
    pool.weekly("a", 70)
    pool.five_hour("b", 92, resets_in=3 * 3600)
    pool.weekly("c", 40)
    pool.learn({"claude-a": 30, "claude-b": 8, "claude-c": 60})
    assert [pool.new() for _ in range(6)] == ["claude-c"] * 6
    # an existing conversation stays where it is, more headroom elsewhere or not
    assert pool.again("claude-a") == "claude-a"
    assert pool.again("claude-b") == "claude-b"


def test_headroom_routing_can_be_turned_off(start) -> None:
    pool = start(RoutingSettings(policy="least_in_flight", quota_routing=False))
    pool.weekly("a", 70)
    pool.five_hour("b", 92, resets_in=3 * 3600)
    pool.weekly("c", 40)
    pool.learn({"claude-b": 8, "claude-c": 60})
    # the policy alone: each session by its hash among the idle accounts, the
    # one with the least left among them (headroom routing would send none there)
    served = [pool.new() for _ in range(9)]
    assert "claude-b" in served and len(set(served)) > 1


def test_below_its_reserve_an_account_keeps_its_conversations_but_takes_no_new_one(
        start) -> None:
    pool = start(**{"a": {"quota_reserve": 50}})
    pool.weekly("a", 30)
    pool.weekly("b", 70)
    pool.weekly("c", 80)
    pool.learn({"claude-a": 70, "claude-b": 30, "claude-c": 20})
    assert pool.new() == "claude-a"
    # a drops below its own reserve (45 % left, reserve 50) yet has the most headroom
    pool.weekly("a", 55)
    assert pool.again("claude-a") == "claude-a"
    pool.learn({"claude-a": 45, "claude-b": 30, "claude-c": 20})
    assert [pool.new() for _ in range(3)] == ["claude-b"] * 3
    assert pool.again("claude-a") == "claude-a"  # its conversations go on there
    assert pool.opening("claude-a") == "claude-a"  # and its session (bound to it) too
    assert pool.in_flight() == {"claude-a": 0, "claude-b": 0, "claude-c": 0}


def test_every_account_below_the_reserve_refuses_a_new_conversation_in_each_dialect(
        start) -> None:
    pool = start(RoutingSettings(quota_reserve={MODEL: 30}))
    pool.five_hour("a", 95, resets_in=7000)
    pool.five_hour("b", 92, resets_in=6000)
    pool.five_hour("c", 97, resets_in=8000)
    pool.learn({"claude-a": 5, "claude-b": 8, "claude-c": 3})
    before = len(pool.upstream.requests)

    with pool.openai() as oai, pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 429
    error = caught.value.body
    assert "quota_reserve" in error["message"] and error["code"] == "rate_limited"
    retry = int(caught.value.response.headers["retry-after"])
    assert 5900 <= retry <= 6001  # until b's five-hour window resets, the earliest

    with anthropic.Anthropic(base_url=pool.srv.url, api_key=KEY, max_retries=0) as ant, \
            pytest.raises(anthropic.APIStatusError) as caught_ant:
        with ant.messages.stream(model=MODEL, max_tokens=32, messages=[
                {"role": "user", "content": "hi"}]) as stream:
            list(stream.text_stream)
    assert caught_ant.value.status_code == 529
    assert caught_ant.value.body["error"]["type"] == "overloaded_error"
    assert "quota_reserve" in caught_ant.value.body["error"]["message"]
    assert 5900 <= int(caught_ant.value.response.headers["retry-after"]) <= 6001

    assert len(pool.upstream.requests) == before  # no account was asked
    assert pool.in_flight() == {"claude-a": 0, "claude-b": 0, "claude-c": 0}
    # the conversations the accounts hold go on
    assert [pool.again(w) for w in ("claude-a", "claude-b")] == ["claude-a", "claude-b"]
    assert pool.in_flight() == {"claude-a": 0, "claude-b": 0, "claude-c": 0}
