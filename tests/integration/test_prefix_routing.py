"""Prefix-cache-aware routing through a real gateway: conversations sharing a
long system prompt land on the worker that served it, while load spreads."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Iterator

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import RoutingSettings, ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

from .conftest import ANTHROPIC_MODEL, UPSTREAM_KEY

SYSTEMS = [f"You are assistant number {n}. " + "Follow the house rules carefully. " * 60
           for n in range(3)]  # ~2,000 characters each


@pytest.fixture
def prefix_pool(fake_upstream) -> Iterator[ServerThread]:
    settings = Settings(
        server=ServerSettings(api_keys={"team-a": "sk-a"}, admin_token="adm", metrics_public=True),
        routing=RoutingSettings(policy="prefix_cache", imbalance_abs=2, imbalance_rel=1.5),
        workers=tuple(WorkerSettings(name=f"w{i}", dialect="anthropic", models=(ANTHROPIC_MODEL,),
                                     api_key=UPSTREAM_KEY, url=fake_upstream.anthropic_url)
                      for i in range(3)))
    with ServerThread(create_app(settings)) as srv:
        yield srv


def test_shared_system_prompts_stick_to_their_worker_while_load_spreads(prefix_pool):
    with anthropic.Anthropic(base_url=prefix_pool.url, api_key="sk-a", max_retries=0) as ant, \
            openai.OpenAI(base_url=prefix_pool.url + "/v1", api_key="sk-a", max_retries=0) as oai:
        homes = _converse(ant, oai)
    _spread_under_load(prefix_pool, homes)


def _converse(ant: anthropic.Anthropic, oai: openai.OpenAI) -> dict[int, set[str]]:
    homes: dict[int, set[str]] = {}
    for n, system in enumerate(SYSTEMS):
        for i in range(4):  # different first messages, one conversation each
            if i % 2:
                r = oai.chat.completions.with_raw_response.create(
                    model=ANTHROPIC_MODEL, max_tokens=8, messages=[
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"question {i} for prompt {n}"}])
            else:
                r = ant.messages.with_raw_response.create(
                    model=ANTHROPIC_MODEL, max_tokens=8, system=system,
                    messages=[{"role": "user", "content": f"question {i} for prompt {n}"}])
            homes.setdefault(n, set()).add(r.headers["x-poolgate-worker"])
    assert all(len(workers) == 1 for workers in homes.values()), homes
    # a second turn of one of them stays too
    r = ant.messages.with_raw_response.create(
        model=ANTHROPIC_MODEL, max_tokens=8, system=SYSTEMS[0], messages=[
            {"role": "user", "content": "question 0 for prompt 0"},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": "and a follow-up"}])
    assert {r.headers["x-poolgate-worker"]} == homes[0]
    return homes


def _spread_under_load(prefix_pool: ServerThread, homes: dict[int, set[str]]) -> None:
    stats = _stats(prefix_pool)
    assert stats["routing"]["default"]["prefix_hits"] >= 3 * 3 + 1
    assert stats["prefix"]["default"]["matched_chars"] >= 10 * 1900

    # 12 slow conversations of one prompt at once: they do not all queue on its worker
    async def wave() -> Counter[str]:
        async with httpx.AsyncClient(base_url=prefix_pool.url, timeout=30,
                                     headers={"x-api-key": "sk-a"}) as http:
            async def one(i: int) -> str:
                r = await http.post("/v1/messages", json={
                    "model": ANTHROPIC_MODEL, "max_tokens": 8, "system": SYSTEMS[1],
                    "messages": [{"role": "user", "content": f"[[sleep:0.5]] burst {i}"}]})
                assert r.status_code == 200, r.text
                return r.headers["x-poolgate-worker"]
            return Counter(await asyncio.gather(*(one(i) for i in range(12))))

    burst = asyncio.run(wave())
    assert len(burst) >= 2, burst
    (home,) = homes[1]
    assert burst[home] == max(burst.values()), burst  # its home still took the most
    assert _stats(prefix_pool)["routing"]["default"]["load_moves"] >= 1
    metrics = httpx.get(prefix_pool.url + "/metrics").text
    assert 'outcome="prefix_hits"' in metrics and "poolgate_prefix_matched_chars" in metrics
    blocks = [line for line in metrics.splitlines() if line.startswith("poolgate_prefix_blocks{")]
    assert len(blocks) == 3 and all(float(line.rsplit(" ", 1)[1]) > 0 for line in blocks), blocks


def _stats(srv: ServerThread) -> dict:
    return httpx.get(srv.url + "/internal/stats", headers={"authorization": "Bearer adm"}).json()
