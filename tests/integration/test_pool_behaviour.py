"""The pool through a real poolgate: affinity, admission limits, and no leaks."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

from .conftest import UPSTREAM_KEY


def _gateway(fake, *, workers: int = 3, **server: Any) -> ServerThread:
    capacity = server.pop("capacity", 256)
    settings = Settings(
        server=ServerSettings(api_keys={"team-a": "sk-a", "team-b": "sk-b"}, **server),
        workers=tuple(WorkerSettings(name=f"w{i}", dialect="openai", models=("m",),
                                     api_key=UPSTREAM_KEY, url=fake.url, max_in_flight=capacity)
                      for i in range(workers)))
    return ServerThread(create_app(settings))


@pytest.fixture
def pool3(fake_upstream) -> Iterator[ServerThread]:
    with _gateway(fake_upstream) as srv:
        yield srv


def _ask(http: httpx.Client, text: str, **headers: str) -> httpx.Response:
    return http.post("/v1/chat/completions", headers={"authorization": "Bearer sk-a", **headers},
                     json={"model": "m", "messages": [{"role": "user", "content": text}]})


def test_a_session_stays_on_its_worker_for_100_turns(pool3):
    with httpx.Client(base_url=pool3.url, timeout=30) as http:
        served = {_ask(http, f"turn {i}", **{"x-session-id": "conv-1"}).headers["x-poolgate-worker"]
                  for i in range(100)}
        assert len(served) == 1
        spread = {_ask(http, "hi", **{"x-session-id": f"conv-{i}"}).headers["x-poolgate-worker"]
                  for i in range(30)}
        assert len(spread) >= 2  # different sessions are spread over the workers
        stats = http.get("/internal/stats").status_code  # admin closed without a token
        assert stats == 404


def test_sessions_without_ids_follow_their_first_message(pool3):
    with httpx.Client(base_url=pool3.url, timeout=30) as http:
        first = _ask(http, "the same opening").headers["x-poolgate-worker"]
        again = {_ask(http, "the same opening").headers["x-poolgate-worker"] for _ in range(10)}
    assert again == {first}


def test_twice_the_capacity_gets_fast_429_and_529_with_retry_after(fake_upstream):
    # 2 workers x 2 slots; 8 requests that each hold their slot for 2 s
    with _gateway(fake_upstream, workers=2, capacity=2, queue_timeout=0.2) as srv:
        async def go() -> list[Any]:
            async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="sk-a",
                                          max_retries=0) as oai, \
                    anthropic.AsyncAnthropic(base_url=srv.url, api_key="sk-b",
                                             max_retries=0) as ant:
                async def o() -> Any:
                    started = time.monotonic()
                    try:
                        return await oai.chat.completions.create(
                            model="m", messages=[{"role": "user", "content": "[[sleep:2]] hi"}])
                    except openai.RateLimitError as exc:
                        return exc, time.monotonic() - started

                async def a() -> Any:
                    started = time.monotonic()
                    try:
                        return await ant.messages.create(
                            model="m", max_tokens=16,
                            messages=[{"role": "user", "content": "[[sleep:2]] hi"}])
                    except anthropic.OverloadedError as exc:
                        return exc, time.monotonic() - started

                return await asyncio.gather(*(o() for _ in range(4)), *(a() for _ in range(4)))

        results = asyncio.run(go())
    refused = [r for r in results if isinstance(r, tuple)]
    assert len(refused) == 4
    for exc, seconds in refused:
        assert seconds < 1.5  # a fast refusal, not a timeout
        assert int(exc.response.headers["retry-after"]) >= 1
    assert any(isinstance(exc, openai.RateLimitError) for exc, _ in refused) or \
        any(isinstance(exc, anthropic.OverloadedError) for exc, _ in refused)
    for exc, _ in refused:
        if isinstance(exc, anthropic.OverloadedError):
            assert exc.status_code == 529 and exc.body["error"]["type"] == "overloaded_error"
        else:
            assert exc.status_code == 429 and exc.body["code"] == "rate_limit_exceeded"


def test_per_key_limit_keeps_one_team_from_starving_another(fake_upstream):
    with _gateway(fake_upstream, workers=1, max_in_flight_per_key=1, queue_timeout=0.1) as srv:
        async def go() -> tuple[list[int], list[int]]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
                async def call(key: str) -> int:
                    r = await http.post("/v1/chat/completions", headers={"authorization": key},
                                        json={"model": "m", "messages": [
                                            {"role": "user", "content": "[[sleep:1]] x"}]})
                    return r.status_code
                a = [call("Bearer sk-a") for _ in range(3)]
                b = [call("Bearer sk-b")]
                done = await asyncio.gather(*a, *b)
                return list(done[:3]), list(done[3:])

        team_a, team_b = asyncio.run(go())
    assert sorted(team_a) == [200, 429, 429]
    assert team_b == [200]


def test_1000_requests_with_chaos_leave_no_slot_held(fake_upstream):
    """Random client disconnects, cancellations, worker errors and mid-stream
    deaths; afterwards every in-flight counter is back at zero."""
    rng = random.Random(7)
    with _gateway(fake_upstream, workers=3, capacity=16, queue_timeout=2.0) as srv:
        async def one(http: httpx.AsyncClient, i: int) -> None:
            kind = rng.choice(["ok", "ok", "error", "die", "disconnect", "cancel", "bad"])
            text = {"ok": "fine", "error": "[[error:500]]", "die": "[[die-after:2]] a b c d",
                    "disconnect": "[[hang-after:1]] a b", "cancel": "[[sleep:5]] x",
                    "bad": "x"}[kind]
            body: dict[str, Any] = {"model": "m", "stream": kind in ("die", "disconnect"),
                                    "messages": [{"role": "user", "content": text}]}
            if kind == "bad":
                body["temperature"] = "hot"
            headers = {"authorization": "Bearer sk-a", "x-session-id": f"s{i % 40}"}
            if kind == "disconnect":
                async with http.stream("POST", "/v1/chat/completions", json=body,
                                       headers=headers) as r:
                    async for _ in r.aiter_bytes():
                        break
                return
            task = asyncio.ensure_future(http.post("/v1/chat/completions", json=body,
                                                   headers=headers))
            if kind == "cancel":
                await asyncio.sleep(rng.uniform(0.01, 0.2))
                task.cancel()
            try:
                await task
            except (asyncio.CancelledError, httpx.HTTPError):
                pass

        async def go() -> None:
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(base_url=srv.url, timeout=30, limits=limits) as http:
                sem = asyncio.Semaphore(48)

                async def bounded(i: int) -> None:
                    async with sem:
                        await one(http, i)

                await asyncio.gather(*(bounded(i) for i in range(1000)))

        asyncio.run(go())
        gw = srv.config.app.state.gateway if hasattr(srv.config.app, "state") else None
        assert gw is not None
        deadline = time.monotonic() + 10
        while (gw.admission.stats()["in_flight"] or any(gw.pool.in_flight.values())) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        stats = gw.admission.stats()
        assert stats["in_flight"] == 0 and stats["waiting"] == 0
        assert not any(stats["by_worker"].values()) and not any(stats["by_key"].values())
        assert not any(gw.pool.in_flight.values())
