"""Routing that sees load: identical requests with no session id spread over
idle workers, while explicit sessions stay put; a ``session_id`` in an
Anthropic body is a session key that never reaches the upstream."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Iterator

import anthropic
import httpx
import pytest

from app.factory import create_app
from app.settings import RoutingSettings, ServerSettings, Settings, WorkerSettings
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

from .conftest import ANTHROPIC_MODEL, UPSTREAM_KEY


@pytest.fixture
def pool3(fake_upstream) -> Iterator[ServerThread]:
    settings = Settings(
        server=ServerSettings(api_keys={"team-a": "sk-a"}, admin_token="adm", metrics_public=True),
        routing=RoutingSettings(imbalance_abs=2, imbalance_rel=1.5),
        workers=tuple(WorkerSettings(name=f"w{i}", dialect="anthropic", models=(ANTHROPIC_MODEL,),
                                     api_key=UPSTREAM_KEY, url=fake_upstream.anthropic_url)
                      for i in range(3)))
    with ServerThread(create_app(settings)) as srv:
        yield srv


async def _ask(http: httpx.AsyncClient, text: str, **extra: Any) -> str:
    r = await http.post("/v1/messages", json={
        "model": ANTHROPIC_MODEL, "max_tokens": 16, **extra,
        "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r.headers["x-poolgate-worker"]


def test_48_identical_requests_12_at_a_time_spread_while_explicit_sessions_stay(pool3):
    async def go() -> tuple[Counter[str], dict[str, set[str]]]:
        async with httpx.AsyncClient(base_url=pool3.url, timeout=30,
                                     headers={"x-api-key": "sk-a"}) as http:
            served: Counter[str] = Counter()
            sticky: dict[str, set[str]] = {f"conv-{i}": set() for i in range(3)}
            for _ in range(4):  # 4 waves of 12 identical requests, no session id
                wave = await asyncio.gather(
                    *(_ask(http, "[[sleep:0.4]] the same question") for _ in range(12)),
                    *(_ask(http, "[[sleep:0.4]] hi", session_id=s) for s in sticky))
                served.update(wave[:12])
                for s, worker in zip(sticky, wave[12:]):
                    sticky[s].add(worker)
            return served, sticky

    served, sticky = asyncio.run(go())
    assert set(served) == {"w0", "w1", "w2"}, served  # the content hash yielded to load
    assert all(len(workers) == 1 for workers in sticky.values()), sticky
    stats = httpx.get(pool3.url + "/internal/stats", headers={"authorization": "Bearer adm"}).json()
    text = str(stats)
    assert "load_moves" in text
    metrics = httpx.get(pool3.url + "/metrics").text
    moves = [line for line in metrics.splitlines()
             if line.startswith("poolgate_routing_decisions") and 'outcome="load_moves"' in line]
    assert moves and float(moves[0].rsplit(" ", 1)[1]) >= 1, moves


def test_a_body_session_id_routes_and_is_not_sent_upstream(pool3, fake_upstream):
    client = closed_at_end(anthropic.Anthropic(base_url=pool3.url, api_key="sk-a", max_retries=0))
    workers = set()
    for i in range(8):
        r = client.messages.with_raw_response.create(
            model=ANTHROPIC_MODEL, max_tokens=16, extra_body={"session_id": 1234},
            messages=[{"role": "user", "content": f"different text {i}"}])
        workers.add(r.headers["x-poolgate-worker"])
        assert "session_id" not in fake_upstream.last.body
    assert len(workers) == 1
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(model=ANTHROPIC_MODEL, max_tokens=16, extra_body={"session_id": []},
                               messages=[{"role": "user", "content": "hi"}])
    assert "session_id" in str(exc.value)


@pytest.fixture
def globbed(fake_upstream) -> Iterator[ServerThread]:
    settings = Settings(
        server=ServerSettings(api_keys={"team-a": "sk-a"}, metrics_public=True),
        routing=RoutingSettings(default_model="gpt-4o-mini"),
        workers=(WorkerSettings(name="claude", dialect="anthropic", models=(ANTHROPIC_MODEL,),
                                aliases={"claude-*": ANTHROPIC_MODEL}, api_key=UPSTREAM_KEY,
                                url=fake_upstream.anthropic_url),
                 WorkerSettings(name="gpt", dialect="openai", models=("gpt-4o-mini",),
                                api_key=UPSTREAM_KEY, url=fake_upstream.url)))
    with ServerThread(create_app(settings)) as srv:
        yield srv


def test_glob_aliases_catch_claude_codes_haiku_calls_and_default_model_the_rest(globbed,
                                                                               fake_upstream):
    client = closed_at_end(anthropic.Anthropic(base_url=globbed.url, api_key="sk-a", max_retries=0))
    r = client.messages.with_raw_response.create(
        model="claude-haiku-4-5-20251001", max_tokens=16,
        messages=[{"role": "user", "content": "background title"}])
    assert r.headers["x-poolgate-worker"] == "claude"
    assert fake_upstream.last.body["model"] == ANTHROPIC_MODEL
    r = client.messages.with_raw_response.create(
        model="some-model-nobody-serves", max_tokens=16,
        messages=[{"role": "user", "content": "hi"}])
    assert r.headers["x-poolgate-worker"] == "gpt"
    listed = {m["id"] for m in httpx.get(globbed.url + "/v1/models",
                                         headers={"x-api-key": "sk-a"}).json()["data"]}
    assert listed == {ANTHROPIC_MODEL, "gpt-4o-mini"}  # a glob is not a model to list
    metrics = httpx.get(globbed.url + "/metrics").text
    assert "some-model-nobody-serves" not in metrics and "claude-haiku-4-5" not in metrics
