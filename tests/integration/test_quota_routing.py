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
from tests.support.cli_accounts import claude_home, fake_claude_worker, wait_for
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

ADMIN = {"authorization": "Bearer admin-token"}
MODEL = "claude-sonnet-4-6"
KEY = "sk-team-a"
ACCOUNTS = ("a", "b", "c")


def token(name: str) -> str:
    return f"sk-ant-oat01-account-{name}"


class Pool:
    """A gateway over the accounts, the upstream's quota per account, and the
    conversations the test started (worker → its history)."""

    def __init__(self, srv: ServerThread, http: httpx.Client, upstream: FakeUpstream) -> None:
        self.srv, self.http, self.upstream = srv, http, upstream
        self.held: dict[str, list[dict[str, Any]]] = {}
        self._n = 0

    def set_used(self, name: str, five_hour: float, **more: float) -> None:
        self.upstream.quota[token(name)] = FakeQuota(five_hour=five_hour, **more)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.srv.url + "/v1", api_key=KEY, max_retries=0)

    def new(self) -> str:
        """A new conversation's first turn; the worker that took it."""
        self._n += 1
        history = [{"role": "user", "content": f"new conversation {self._n}"}]
        return self._turn(history, None)

    def again(self, worker: str) -> str:
        """The next turn of the first conversation ``worker`` took; who served it."""
        return self._turn(self.held[worker], worker)

    def _turn(self, history: list[dict[str, Any]], owner: str | None) -> str:
        with self.openai() as oai:
            raw = oai.chat.completions.with_raw_response.create(model=MODEL, messages=history)
        served = raw.headers["x-poolgate-worker"]
        reply = raw.parse().choices[0].message.content
        history = [*history, {"role": "assistant", "content": reply},
                   {"role": "user", "content": f"and then {len(history)}"}]
        if owner is None:
            self.held.setdefault(served, history)
        elif served == owner:
            self.held[owner] = history
        return served

    def headroom(self) -> dict[str, float | None]:
        workers = self.http.get("/internal/workers", headers=ADMIN).json()["workers"]
        out: dict[str, float | None] = {}
        for w in workers:
            windows = w.get("quota") or []
            out[w["name"]] = min((x["left_percent"] for x in windows), default=None)
        return out

    def learn(self, expected: dict[str, float]) -> None:
        """Turns until every account reports ``expected`` headroom: new
        conversations while one is unknown (unknown ties with the best known,
        so each gets one), then a turn of each account's own conversation."""
        for _ in range(12):
            if all(v is not None for v in self.headroom().values()):
                break
            self.new()
            time.sleep(0.1)
        for name, left in expected.items():
            if self.headroom()[name] != left:
                self.again(name)
        wait_for(lambda: self.headroom() == expected, timeout=10)

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
        opened.append(srv)
        http = httpx.Client(base_url=srv.url, timeout=30)
        opened.append(http)
        for name in ACCOUNTS:
            upstream.quota[token(name)] = FakeQuota()
        return Pool(srv, http, upstream)

    yield open_pool
    for thing in reversed(opened):
        thing.__exit__(None, None, None)


@pytest.mark.parametrize("policy", ["session_affinity", "least_in_flight", "prefix_cache"])
def test_new_conversations_go_to_the_account_with_the_most_headroom(start, policy) -> None:
    pool = start(RoutingSettings(policy=policy))
    # b has used the least of its five-hour window, but its weekly window is the tightest
    pool.set_used("a", 70)
    pool.set_used("b", 10, seven_day=75)
    pool.set_used("c", 40)
    pool.learn({"claude-a": 30, "claude-b": 25, "claude-c": 60})
    served = [pool.new() for _ in range(6)]
    assert served == ["claude-c"] * 6
    # an existing conversation stays where it is, more headroom elsewhere or not
    assert pool.again("claude-a") == "claude-a"


def test_headroom_routing_can_be_turned_off(start) -> None:
    pool = start(RoutingSettings(policy="least_in_flight", quota_routing=False))
    pool.set_used("a", 70)
    pool.set_used("b", 10)
    pool.set_used("c", 40)
    pool.learn({"claude-a": 30, "claude-b": 90, "claude-c": 60})
    served = {pool.new() for _ in range(6)}
    assert served == {"claude-a", "claude-b", "claude-c"}  # round robin among the idle


def test_below_its_reserve_an_account_keeps_its_conversations_but_takes_no_new_one(
        start) -> None:
    pool = start(**{"a": {"quota_reserve": 50}})
    pool.set_used("a", 10)
    pool.set_used("b", 70)
    pool.set_used("c", 80)
    pool.learn({"claude-a": 90, "claude-b": 30, "claude-c": 20})
    assert pool.new() == "claude-a"
    # a drops below its own reserve (45% left, reserve 50) yet has the most headroom
    pool.set_used("a", 55)
    assert pool.again("claude-a") == "claude-a"
    wait_for(lambda: pool.headroom()["claude-a"] == 45)
    assert [pool.new() for _ in range(3)] == ["claude-b"] * 3
    assert pool.again("claude-a") == "claude-a"  # its conversation goes on there
    assert pool.in_flight() == {"claude-a": 0, "claude-b": 0, "claude-c": 0}


def test_every_account_below_the_reserve_refuses_a_new_conversation_in_each_dialect(
        start) -> None:
    pool = start(RoutingSettings(quota_reserve={MODEL: 30}))
    pool.learn({"claude-a": 100, "claude-b": 100, "claude-c": 100})
    now = time.time()
    resets = {"a": now + 1200, "b": now + 600, "c": now + 900}
    for name, used in (("a", 75), ("b", 90), ("c", 80)):
        pool.set_used(name, used, five_hour_reset=float(int(resets[name])))
    pool.learn({"claude-a": 25, "claude-b": 10, "claude-c": 20})
    before = len(pool.upstream.requests)

    with pool.openai() as oai, pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 429
    error = caught.value.body
    assert "quota_reserve" in error["message"] and error["code"] == "rate_limited"
    retry = int(caught.value.response.headers["retry-after"])
    assert 560 <= retry <= 601  # until b's five-hour window resets, the earliest

    with anthropic.Anthropic(base_url=pool.srv.url, api_key=KEY, max_retries=0) as ant, \
            pytest.raises(anthropic.APIStatusError) as caught_ant:
        with ant.messages.stream(model=MODEL, max_tokens=32, messages=[
                {"role": "user", "content": "hi"}]) as stream:
            list(stream.text_stream)
    assert caught_ant.value.status_code == 529
    assert caught_ant.value.body["error"]["type"] == "overloaded_error"
    assert "quota_reserve" in caught_ant.value.body["error"]["message"]
    assert 560 <= int(caught_ant.value.response.headers["retry-after"]) <= 601

    assert len(pool.upstream.requests) == before  # no account was asked
    assert pool.in_flight() == {"claude-a": 0, "claude-b": 0, "claude-c": 0}
    # the conversations the accounts hold go on
    assert [pool.again(w) for w in ("claude-a", "claude-b")] == ["claude-a", "claude-b"]
    assert pool.in_flight() == {"claude-a": 0, "claude-b": 0, "claude-c": 0}
