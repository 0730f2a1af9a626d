"""Two real poolgate processes on one real PostgreSQL share keys and usage:
a key made on A works on B, a policy changed on A holds on B, a key revoked
on A is refused on B (a stream it opens included) within 2 s, and
``/internal/usage`` answers the same on both."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.postgres_server import PostgresServer
from tests.support.server_http import with_server_http

from .conftest import ADMIN_TOKEN, OPENAI_MODEL, UPSTREAM_KEY

REPO = Path(__file__).resolve().parents[2]
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
PROPAGATION = 2.0  # seconds the issue allows for a change to reach every replica


class Replica:
    def __init__(self, name: str, tmp: Path, database_url: str, upstream: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / f"{name}.toml"
        config.write_text(f"""
[server]
port = {self.port}
log_level = "warning"
database_url = "{database_url}"
state_dir = "{tmp / name}"

[[workers]]
name = "w"
dialect = "openai"
url = "{upstream}"
api_key_env = "UPSTREAM_KEY"
models = ["{OPENAI_MODEL}"]
""")
        env = {**os.environ, "UPSTREAM_KEY": UPSTREAM_KEY, "POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN}
        for var in ("POOLGATE_STATE_DIR", "POOLGATE_REDIS_URL", "POOLGATE_CONFIG",
                    "POOLGATE_DATABASE_URL"):
            env.pop(var, None)
        with open(tmp / f"{name}.log", "wb") as log:  # read when a test fails
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "serve", "--config", str(config)], cwd=REPO,
                env=with_server_http(env), stdout=log, stderr=subprocess.STDOUT)
        self.http = httpx.Client(base_url=self.url, timeout=10)
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.http.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and self.proc.poll() is None, f"{name} did not start"
            time.sleep(0.05)

    def chat(self, secret: str, stream: bool = False) -> int:
        body = {"model": OPENAI_MODEL, "stream": stream,
                "messages": [{"role": "user", "content": "hi"}]}
        with self.http.stream("POST", "/v1/chat/completions", json=body,
                              headers={"authorization": f"Bearer {secret}"}) as r:
            r.read()
            return r.status_code

    def close(self) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, fake_upstream) -> Iterator[SimpleNamespace]:
    postgres = PostgresServer().start()
    tmp = tmp_path_factory.mktemp("db-replicas")
    replicas: list[Replica] = []
    try:
        url = postgres.create_database("replicas")
        replicas.append(Replica("a", tmp, url, fake_upstream.url))
        replicas.append(Replica("b", tmp, url, fake_upstream.url))
        yield SimpleNamespace(postgres=postgres, a=replicas[0], b=replicas[1])
    finally:
        for replica in replicas:
            replica.close()
        postgres.close()


def _within(check, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"{what} within {timeout} s"
        time.sleep(0.02)
    return time.monotonic() - start


def test_a_key_revoked_on_one_replica_is_refused_on_the_other(cluster) -> None:
    a, b = cluster.a, cluster.b
    made = a.http.post("/internal/keys", headers=ADMIN, json={"name": "team-r"})
    assert made.status_code == 201, made.text
    secret = made.json()["secret"]
    assert a.chat(secret) == 200
    _within(lambda: "team-r" in _names(b), PROPAGATION, "a new key known on B")
    assert b.chat(secret) == 200 and b.chat("sk-not-a-key") == 401  # B checks keys now

    assert a.http.delete("/internal/keys/team-r", headers=ADMIN).status_code == 200
    assert a.chat(secret) == 401
    _within(lambda: b.chat(secret, stream=True) == 401, PROPAGATION,
            "the revoked key refused on B (a stream)")
    assert b.chat(secret) == 401
    assert "team-r" not in _names(b)


def _names(replica: Replica) -> list[str]:
    return [k["name"] for k in replica.http.get("/internal/keys", headers=ADMIN).json()["keys"]]


def test_a_policy_changed_on_one_replica_holds_on_the_other(cluster) -> None:
    a, b = cluster.a, cluster.b
    secret = a.http.post("/internal/keys", headers=ADMIN,
                         json={"name": "team-p"}).json()["secret"]
    # known on B, not merely let through by a B with no key yet (an open gateway)
    _within(lambda: "team-p" in _names(b), PROPAGATION, "the key known on B")
    assert b.chat(secret) == 200
    patched = a.http.patch("/internal/keys/team-p", headers=ADMIN, json={"models": ["other-*"]})
    assert patched.status_code == 200
    _within(lambda: b.chat(secret) == 404, PROPAGATION, "the new model list applied on B")
    listed = {k["name"]: k for k in b.http.get("/internal/keys", headers=ADMIN).json()["keys"]}
    assert listed["team-p"]["models"] == ["other-*"]


def test_a_budget_patched_on_one_replica_counts_past_usage_on_the_other(cluster) -> None:
    """A key used (on both replicas) without a budget, then given a budget it
    has already spent on A, is refused on B too within 2 s: B starts the new
    budget at the shared ledger's totals of the key."""
    a, b = cluster.a, cluster.b
    secret = a.http.post("/internal/keys", headers=ADMIN,
                         json={"name": "team-bp"}).json()["secret"]
    _within(lambda: "team-bp" in _names(b), PROPAGATION, "the key known on B")
    assert b.chat(secret) == 200 and a.chat(secret) == 200
    patched = a.http.patch("/internal/keys/team-bp", headers=ADMIN,
                           json={"budget_tokens": {"day": 1}})
    assert patched.status_code == 200, patched.text
    assert a.chat(secret) == 429

    def budget_on_b() -> object:
        keys = b.http.get("/internal/keys", headers=ADMIN).json()["keys"]
        return next((k["budget_tokens"] for k in keys if k["name"] == "team-bp"), None)
    _within(lambda: budget_on_b() is not None, PROPAGATION, "the budget applied on B")
    assert b.chat(secret) == 429  # B's first request (one answered would spend it on B alone)


def test_usage_is_the_same_on_every_replica(cluster) -> None:
    a, b = cluster.a, cluster.b
    secret = a.http.post("/internal/keys", headers=ADMIN,
                         json={"name": "team-u"}).json()["secret"]
    _within(lambda: "team-u" in _names(b), PROPAGATION, "the key known on B")
    assert b.chat(secret) == 200
    for _ in range(3):
        assert a.chat(secret) == 200
    assert b.chat(secret, stream=True) == 200

    def usage(replica: Replica) -> list:
        return replica.http.get("/internal/usage", headers=ADMIN,
                                params={"key": "team-u", "group_by": "key"}).json()["rows"]

    # each replica's writer commits within its flush interval; both then read the same rows
    _within(lambda: usage(a) == usage(b) and usage(a)[0]["requests"] == 5, 5,
            "the same usage on both replicas")
    today = {r: {k["name"]: k for k in r.http.get("/internal/keys", headers=ADMIN).json()["keys"]}
             ["team-u"]["usage_today"] for r in (a, b)}
    assert today[a] == today[b] and today[a]["requests"] == 5


def test_a_postgres_restart_mid_traffic_loses_no_usage_row(cluster) -> None:
    """Both replicas keep answering while PostgreSQL restarts (and while it is
    down, SIGKILLed); once it is back every answered request is in the ledger,
    and both replicas count the same."""
    a, b = cluster.a, cluster.b
    secret = a.http.post("/internal/keys", headers=ADMIN,
                         json={"name": "team-d"}).json()["secret"]
    _within(lambda: "team-d" in _names(b), PROPAGATION, "the key known on B")
    answered = 0

    def burst(n: int) -> None:
        nonlocal answered
        for i in range(n):
            assert (a if i % 2 else b).chat(secret, stream=bool(i % 3)) == 200
            answered += 1

    burst(10)
    cluster.postgres.restart()
    burst(10)
    cluster.postgres.kill()
    burst(10)  # the database is down: answered all the same, rows queued
    cluster.postgres.start()
    burst(10)

    def usage(replica: Replica) -> int:
        r = replica.http.get("/internal/usage", headers=ADMIN,
                             params={"key": "team-d", "group_by": ""})
        return r.json()["rows"][0]["requests"] if r.status_code == 200 and r.json()["rows"] else 0

    _within(lambda: usage(a) == usage(b) == answered, 20, "every row in the shared ledger")
