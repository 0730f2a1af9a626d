"""Two deployments on one real ``redis-server`` (issue 21, section 4):
deployment A (two poolgate processes, ``server.redis_prefix = "dep-a"``) and
deployment B (one process, ``"dep-b"``) with the same worker and key names.
What A shares between its replicas (drains, registered workers, rate
windows, stored responses) never reaches B, and every key in Redis is under
one of the two prefixes."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator

import pytest

from tests.fakes.upstreams import FakeUpstream
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer

ADMIN_TOKEN = "admin-token-prefixes-0123"
UPSTREAM_KEY = "sk-upstream-prefixes-0123"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
TEAM = {"authorization": "Bearer sk-team"}
LIMITED = {"authorization": "Bearer sk-limited"}
RPM = 2
MODEL = "shared-model"
SETTLE = 1.5  # three polls of the shared state (with the Redis probe, every 0.5 s)

CONFIG = f"""
[server]
port = {{port}}
log_level = "warning"
redis_url = "REDIS_URL"
redis_prefix = "PREFIX"
runtime_secret_envs = ["UPSTREAM_KEY"]

[server.keys.team]
secret_env = "TEAM_KEY"

[server.keys.limited]
secret_env = "LIMITED_KEY"
rpm = {RPM}

[[workers]]
name = "w1"
dialect = "openai"
url = "UPSTREAM_URL"
api_key_env = "UPSTREAM_KEY"
models = ["{MODEL}"]
"""


@pytest.fixture(scope="module")
def deployments(tmp_path_factory) -> Iterator[SimpleNamespace]:
    tmp: Path = tmp_path_factory.mktemp("prefixes")
    redis = RedisServer().start()
    started: list[GatewayProcess] = []
    env = {"POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN, "UPSTREAM_KEY": UPSTREAM_KEY,
           "TEAM_KEY": "sk-team", "LIMITED_KEY": "sk-limited"}
    try:
        with FakeUpstream(api_key=UPSTREAM_KEY, models=(MODEL, "joined-model")) as up:
            def start(name: str, prefix: str) -> GatewayProcess:
                config = (CONFIG.replace("REDIS_URL", redis.url).replace("PREFIX", prefix)
                          .replace("UPSTREAM_URL", up.url))
                started.append(GatewayProcess(tmp, name, config, env))
                return started[-1]

            yield SimpleNamespace(a1=start("a1", "dep-a"), a2=start("a2", "dep-a"),
                                  b=start("b", "dep-b"), redis=redis, upstream=up)
    finally:
        for process in started:
            process.close()
        redis.stop()


def _until(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _state(gw: GatewayProcess, name: str) -> str | None:
    workers = gw.http.get("/internal/workers", headers=ADMIN).json()["workers"]
    return next((w["state"] for w in workers if w["name"] == name), None)


def _chat(gw: GatewayProcess, headers: dict) -> int:
    return gw.http.post("/v1/chat/completions", headers=headers, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).status_code


def test_a_drain_stays_in_its_deployment(deployments) -> None:
    d = deployments
    assert d.a1.http.post("/internal/workers/w1/drain", headers=ADMIN).status_code == 200
    _until(lambda: _state(d.a2, "w1") == "draining", "A's other replica never drained w1")
    time.sleep(SETTLE)
    assert _state(d.b, "w1") == "ready"
    assert _chat(d.b, TEAM) == 200
    assert d.a2.http.post("/internal/workers/w1/resume", headers=ADMIN).status_code == 200
    _until(lambda: _state(d.a1, "w1") == "ready", "A never resumed w1")


def test_a_registered_worker_stays_in_its_deployment(deployments) -> None:
    d = deployments
    joined = {"name": "joined", "dialect": "openai", "url": d.upstream.url,
              "models": ["joined-model"], "api_key_env": "UPSTREAM_KEY"}
    assert d.a1.http.post("/internal/workers", headers=ADMIN, json=joined).status_code == 201
    _until(lambda: _state(d.a2, "joined") is not None, "A's other replica never took it")
    time.sleep(SETTLE)
    assert _state(d.b, "joined") is None
    # B's own worker of that name is B's: no conflict with A's
    mine = d.b.http.post("/internal/workers", headers=ADMIN, json=joined)
    assert mine.status_code == 201, mine.text
    assert d.a2.http.delete("/internal/workers/joined", headers=ADMIN).status_code == 200
    _until(lambda: _state(d.a1, "joined") is None, "A never let its worker go")
    time.sleep(SETTLE)
    assert _state(d.b, "joined") == "ready"


def test_rate_windows_stay_in_their_deployment(deployments) -> None:
    d = deployments
    assert [_chat(d.a1, LIMITED) for _ in range(RPM)] == [200] * RPM
    assert _chat(d.a2, LIMITED) == 429  # A's window is shared by its replicas
    assert [_chat(d.b, LIMITED) for _ in range(RPM)] == [200] * RPM  # B's is its own
    assert _chat(d.b, LIMITED) == 429


def test_stored_responses_stay_in_their_deployment(deployments) -> None:
    d = deployments
    stored = d.a1.http.post("/v1/responses", headers=TEAM, json={"model": MODEL, "input": "keep"})
    assert stored.status_code == 200, stored.text
    rid = stored.json()["id"]
    assert d.a2.http.get(f"/v1/responses/{rid}", headers=TEAM).status_code == 200
    assert d.b.http.get(f"/v1/responses/{rid}", headers=TEAM).status_code == 404
    follow = d.b.http.post("/v1/responses", headers=TEAM,
                           json={"model": MODEL, "input": "more", "previous_response_id": rid})
    assert follow.status_code in (400, 404), follow.text
    assert d.b.http.delete(f"/v1/responses/{rid}", headers=TEAM).status_code == 404
    assert d.a2.http.get(f"/v1/responses/{rid}", headers=TEAM).status_code == 200


def test_every_key_is_under_its_deployments_prefix(deployments) -> None:
    client = deployments.redis.client()
    try:
        keys = [k.decode() for k in client.keys("*")]
    finally:
        client.close()
    assert keys, "nothing was written to Redis"
    assert all(k.startswith(("dep-a:", "dep-b:")) for k in keys), sorted(keys)
    # (drained sets were emptied by the resume; only A stored a response)
    # lim-seeded: each replica's budget marker; inf-alive: its slots' deadline (both scripts
    # and plain calls build on the prefix)
    always = {"workers", "lim", "lim-seeded", "inf-alive"}
    for prefix, written in (("dep-a:", always | {"r", "rs"}), ("dep-b:", always)):
        mine = {k.split(":")[1] for k in keys if k.startswith(prefix)}
        assert written <= mine, (prefix, sorted(mine))
