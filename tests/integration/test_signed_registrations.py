"""Worker registrations in Redis are signed by the deployment (issue 21, section
4): two real poolgate processes of one deployment (one admin token) share a
real ``redis-server``. A record written into Redis by anyone else (straight
into the hash, or by a gateway with another admin token) is ignored by both,
logged once, and never probed; one registered through a replica is served by
both, with no setting beyond the admin token they already share."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterator

import orjson
import pytest

from tests.fakes.upstreams import FakeUpstream
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer

ADMIN_TOKEN = "admin-token-of-the-deployment-0123"
OTHER_TOKEN = "admin-token-of-someone-else-4567"
UPSTREAM_KEY = "sk-upstream-signed-0123456789"
SYNC = 1.5  # three polls of the registrations (with the Redis probe, every 0.5 s)

CONFIG = """
[server]
port = {port}
log_level = "info"
redis_url = "REDIS_URL"
runtime_secret_envs = ["UPSTREAM_KEY"]

[[workers]]
name = "base"
dialect = "openai"
url = "UPSTREAM_URL"
api_key_env = "UPSTREAM_KEY"
models = ["base-model"]
"""


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    redis = RedisServer().start()
    started: list[GatewayProcess] = []
    with FakeUpstream(api_key=UPSTREAM_KEY, models=("base-model", "joined-model")) as up:
        config = CONFIG.replace("REDIS_URL", redis.url).replace("UPSTREAM_URL", up.url)

        def gateway(name: str, token: str = ADMIN_TOKEN) -> GatewayProcess:
            env = {"POOLGATE_ADMIN_TOKEN": token, "UPSTREAM_KEY": UPSTREAM_KEY}
            started.append(GatewayProcess(tmp_path, name, config, env))
            return started[-1]

        gateway.redis = redis  # type: ignore[attr-defined]
        gateway.upstream = up  # type: ignore[attr-defined]
        try:
            yield gateway
        finally:
            for process in started:
                process.close()
            redis.stop()


def _names(gw: GatewayProcess, token: str = ADMIN_TOKEN) -> set[str]:
    r = gw.http.get("/internal/workers", headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return {w["name"] for w in r.json()["workers"]}


def _until(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _events(gw: GatewayProcess, event: str) -> list[dict]:
    lines = []
    for line in gw.log().splitlines():
        if line.startswith("{"):
            record = orjson.loads(line)
            if record.get("event") == event:
                lines.append(record)
    return lines


def _worker(name: str, url: str) -> dict:
    return {"name": name, "dialect": "openai", "url": url, "models": ["joined-model"],
            "api_key_env": "UPSTREAM_KEY"}


def test_records_not_signed_by_this_deployment_are_ignored_and_logged(world) -> None:
    a, b = world("a"), world("b")
    with FakeUpstream(models=("joined-model",)) as thief:
        # someone with Redis access writes a worker record straight into the hash
        client = world.redis.client()
        try:
            client.hset("poolgate:workers", "forged", orjson.dumps(_worker("forged", thief.url)))
            client.set("poolgate:workers:kept", 1)
            client.hset("poolgate:workers", "badsig",
                        b"0" * 64 + b"." + orjson.dumps(_worker("badsig", thief.url)))
        finally:
            client.close()
        # and a gateway of another deployment (another admin token) on the same keys
        other = world("other", OTHER_TOKEN)
        created = other.http.post("/internal/workers", json=_worker("elsewhere", thief.url),
                                  headers={"authorization": f"Bearer {OTHER_TOKEN}"})
        assert created.status_code == 201, created.text
        probes = len(thief.requests)  # the other deployment's own probe of its worker
        time.sleep(SYNC)
        for gw in (a, b):
            assert _names(gw) == {"base"}, gw.name
            for name in ("forged", "badsig", "elsewhere"):
                ignored = [e for e in _events(gw, "workers.unsigned_registration_ignored")
                           if e.get("worker") == name]
                assert len(ignored) == 1, (gw.name, name, ignored)  # once, not every poll
                assert ignored[0]["level"] == "warning"
            assert ADMIN_TOKEN not in gw.log() and UPSTREAM_KEY not in gw.log()
        assert len(thief.requests) == probes  # nothing of a or b was ever sent there
        # through the admin API the name is this deployment's again: the record is replaced
        joined = a.http.post("/internal/workers", json=_worker("forged", world.upstream.url),
                             headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
        assert joined.status_code == 201, joined.text
        _until(lambda: "forged" in _names(b), "b never took the registration signed by a")
        assert len(_events(a, "workers.foreign_registration_replaced")) == 1
        assert len(thief.requests) == probes
