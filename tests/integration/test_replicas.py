"""Two real poolgate processes sharing a real redis-server behave as one gateway.

Replica A serves the model with workers w2 and w3; replica B with w1, w2 and
w3. Worker names are what the replicas share (all point at one fake
upstream), and B's own hashing would put some sessions on w1, which A
cannot: a session that stays where A bound it is proof the binding is shared.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import httpx
import pytest

from pool.routing import rendezvous
from sessions.limit_leases import LIFETIME
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer
from tests.support.server_http import with_server_http

from .conftest import ADMIN_TOKEN, OPENAI_MODEL, UPSTREAM_KEY

REPO = Path(__file__).resolve().parents[2]
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
KEY = {"authorization": "Bearer sk-a"}
LIMITED = {"authorization": "Bearer sk-r"}
RPM = 4
BUSY = {"authorization": "Bearer sk-b"}
BUSY_RPM = 300  # big enough for the replicas to lease requests of it


def _config(path: Path, port: int, redis_url: str, workers: tuple[str, ...], upstream: str,
            extra: str = "", server: str = "") -> Path:
    blocks = "".join(f"""
[[workers]]
name = "{name}"
dialect = "openai"
url = "{upstream}"
api_key_env = "UPSTREAM_KEY"
models = ["{OPENAI_MODEL}"]
""" for name in workers)
    path.write_text(f"""
[server]
port = {port}
log_level = "warning"
redis_url = "{redis_url}"
{server}
[server.keys.team-a]
secret_env = "TEAM_A_KEY"

[server.keys.team-r]
secret_env = "TEAM_R_KEY"
rpm = {RPM}

[server.keys.team-b]
secret_env = "TEAM_B_KEY"
rpm = {BUSY_RPM}
{extra}{blocks}""")
    return path


class Replica:
    def __init__(self, name: str, tmp: Path, redis_url: str, workers: tuple[str, ...],
                 upstream: str, extra: str = "", secrets: dict[str, str] | None = None,
                 server: str = "") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = _config(tmp / f"{name}.toml", self.port, redis_url, workers, upstream, extra,
                         server)
        env = {**os.environ, "TEAM_A_KEY": "sk-a", "TEAM_R_KEY": "sk-r", "TEAM_B_KEY": "sk-b",
               "UPSTREAM_KEY": UPSTREAM_KEY, "POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN,
               "POOLGATE_METRICS_TOKEN": "m", **(secrets or {})}
        for name_ in ("POOLGATE_STATE_DIR", "POOLGATE_REDIS_URL", "POOLGATE_CONFIG"):
            env.pop(name_, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--config", str(config)], cwd=REPO,
            env=with_server_http(env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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

    def chat(self, text: str, session: str | None = None, headers: dict | None = None
             ) -> httpx.Response:
        extra = {"x-session-id": session} if session else {}
        return self.http.post("/v1/chat/completions", headers={**(headers or KEY), **extra},
                              json={"model": OPENAI_MODEL,
                                    "messages": [{"role": "user", "content": text}]})

    def worker_state(self, name: str) -> str:
        workers = self.http.get("/internal/workers", headers=ADMIN).json()["workers"]
        return next(w["state"] for w in workers if w["name"] == name)

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
    redis = RedisServer().start()
    tmp = tmp_path_factory.mktemp("replicas")
    replicas: list[Replica] = []
    try:
        replicas.append(Replica("a", tmp, redis.url, ("w2", "w3"), fake_upstream.url))
        replicas.append(Replica("b", tmp, redis.url, ("w1", "w2", "w3"), fake_upstream.url))
        yield SimpleNamespace(redis=redis, a=replicas[0], b=replicas[1])
    finally:
        for replica in replicas:
            replica.close()
        redis.stop()


def _until(check, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"{what} within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - start


def _hash_home(session: str, names: tuple[str, ...]) -> str:
    workers = [SimpleNamespace(name=n) for n in names]
    return rendezvous(f"team-a:session:{session}", workers).name


def test_session_bound_on_a_routes_to_the_same_worker_on_b(cluster) -> None:
    sessions = [f"conv-{i}" for i in range(12)]
    moved = [s for s in sessions if _hash_home(s, ("w1", "w2", "w3")) == "w1"]
    assert moved, "some session must hash to w1 on B, which A does not have"
    on_a = {}
    for s in sessions:
        r = cluster.a.chat("hello", s)
        assert r.status_code == 200, r.text
        on_a[s] = r.headers["x-poolgate-worker"]
    for s in sessions:
        r = cluster.b.chat("again", s)
        assert r.status_code == 200, r.text
        assert r.headers["x-poolgate-worker"] == on_a[s], s
    assert all(on_a[s] != "w1" for s in moved)


def test_response_stored_on_a_is_read_chained_and_deleted_on_b(cluster) -> None:
    first = cluster.a.http.post("/v1/responses", headers=KEY,
                                json={"model": OPENAI_MODEL, "input": "one"})
    assert first.status_code == 200, first.text
    rid = first.json()["id"]
    got = cluster.b.http.get(f"/v1/responses/{rid}", headers=KEY)
    assert got.status_code == 200 and got.json()["id"] == rid
    second = cluster.b.http.post("/v1/responses", headers=KEY, json={
        "model": OPENAI_MODEL, "input": "two", "previous_response_id": rid})
    assert second.status_code == 200, second.text
    items = cluster.a.http.get(f"/v1/responses/{second.json()['id']}/input_items",
                               params={"order": "asc"}, headers=KEY)
    texts = str(items.json()["data"])
    assert items.status_code == 200 and "one" in texts and "two" in texts
    assert cluster.b.http.delete(f"/v1/responses/{rid}", headers=KEY).status_code == 200
    assert cluster.a.http.get(f"/v1/responses/{rid}", headers=KEY).status_code == 404
    broken = cluster.a.http.get(f"/v1/responses/{second.json()['id']}/input_items",
                                headers=KEY)
    assert broken.status_code == 404
    assert broken.json()["error"]["code"] == "response_chain_broken"


def test_item_stored_on_a_is_referenced_on_b(cluster) -> None:
    first = cluster.a.http.post("/v1/responses", headers=KEY,
                                json={"model": OPENAI_MODEL, "input": "remember me"})
    assert first.status_code == 200, first.text
    message = first.json()["output"][0]["id"]
    second = cluster.b.http.post("/v1/responses", headers=KEY, json={
        "model": OPENAI_MODEL, "input": [{"role": "user", "content": "remember me"},
                                         {"type": "item_reference", "id": message},
                                         {"role": "user", "content": "and now"}]})
    assert second.status_code == 200, second.text
    assert second.json()["output_text"] == "echo: and now"
    other = cluster.b.http.post("/v1/responses", headers=BUSY, json={
        "model": OPENAI_MODEL, "input": [{"type": "item_reference", "id": message}]})
    assert other.status_code == 404 and other.json()["error"]["code"] == "item_not_found"


def test_worker_drained_through_a_is_drained_for_b(cluster) -> None:
    r = cluster.a.http.post("/internal/workers/w2/drain", headers=ADMIN)
    assert r.status_code == 200, r.text
    _until(lambda: cluster.b.worker_state("w2") == "draining", 5, "B drains w2")
    for i in range(6):
        r = cluster.b.chat("x", f"drain-{i}")
        assert r.status_code == 200 and r.headers["x-poolgate-worker"] != "w2"
    assert cluster.b.http.post("/internal/workers/w2/resume", headers=ADMIN).status_code == 200
    _until(lambda: cluster.a.worker_state("w2") == "ready", 5, "A resumes w2")


def test_rpm_counted_across_replicas(cluster) -> None:
    for i in range(RPM):
        replica = (cluster.a, cluster.b)[i % 2]
        assert replica.chat("x", headers=LIMITED).status_code == 200
    for replica in (cluster.a, cluster.b):
        refused = replica.chat("x", headers=LIMITED)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"


def test_busy_key_leased_yet_exact_across_replicas(cluster) -> None:
    """Each replica admits a busy key's requests from leases of its shared
    window; together they admit exactly its rpm: never one more, and what one
    leased and did not use goes back when idle (``LIFETIME``)."""
    def until_refused(replica: Replica) -> int:
        served = 0
        while (answer := replica.chat("busy", headers=BUSY)).status_code == 200:
            served += 1
            if served > BUSY_RPM:
                return served  # over the limit on its own: the assertion below says so
        assert answer.status_code == 429, answer.text
        return served

    admitted, rounds = 0, 0
    with ThreadPoolExecutor(4) as threads:
        while rounds < 5:
            served = sum(threads.map(until_refused, [cluster.a, cluster.b] * 2))
            admitted += served
            rounds += 1
            if served == 0:
                break
            time.sleep(LIFETIME + 0.3)  # idle leases go back
    assert admitted == BUSY_RPM
    # the operators' view: each replica served some of it from leases, without Redis
    for replica in (cluster.a, cluster.b):
        limits = replica.http.get("/internal/stats", headers=ADMIN).json()["limits"]
        assert limits["lease_hits"] > 0 and limits["round_trips"] > 0, limits
        assert limits["fallbacks"] == 0, limits


def test_redis_killed_then_back(cluster) -> None:
    """Last in this module: it takes Redis away and brings it back empty."""
    a, b = cluster.a, cluster.b
    stored = a.http.post("/v1/responses", headers=KEY,
                         json={"model": OPENAI_MODEL, "input": "before"}).json()["id"]
    assert a.http.post("/internal/workers/w3/drain", headers=ADMIN).status_code == 200
    _until(lambda: b.worker_state("w3") == "draining", 5, "B drains w3")
    # requests in flight when Redis dies: each upstream answer takes 0.5 s
    with ThreadPoolExecutor(4) as pool:
        def slow(i: int) -> tuple[int, float]:
            replica = (a, b)[i % 2]
            start = time.monotonic()
            if i < 2:
                r = replica.chat("[[sleep:0.5]] slow", f"inflight-{i}")
            else:
                r = replica.http.post("/v1/responses", headers=KEY, json={
                    "model": OPENAI_MODEL, "input": "[[sleep:0.5]] slow"})
            return r.status_code, time.monotonic() - start
        futures = [pool.submit(slow, i) for i in range(4)]
        time.sleep(0.2)
        cluster.redis.kill()
        for future in futures:
            status, took = future.result()
            assert status == 200 and took < 0.5 + 1.0, (status, took)
    deadline = 10.0 + 0.1  # the http client's deadline, plus what Redis may add
    for replica in (a, b):
        for i in range(5):
            start = time.monotonic()
            r = replica.chat("during", f"outage-{i}")
            took = time.monotonic() - start
            assert r.status_code == 200, r.text
            assert took < 1.0 < deadline, f"a chat took {took:.2f} s with Redis down"
        start = time.monotonic()
        got = replica.http.get(f"/v1/responses/{stored}", headers=KEY)
        assert time.monotonic() - start < 1.0
        assert got.status_code == 503 and got.json()["error"]["code"] == "store_unavailable"
        create = replica.http.post("/v1/responses", headers=KEY,
                                   json={"model": OPENAI_MODEL, "input": "during"})
        assert create.status_code == 503
        nostore = replica.http.post("/v1/responses", headers=KEY,
                                    json={"model": OPENAI_MODEL, "input": "x", "store": False})
        assert nostore.status_code == 200
        ready = replica.http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["redis"] == "down"
        metrics = replica.http.get("/metrics", headers={"authorization": "Bearer m"}).text
        assert "poolgate_redis_up 0.0" in metrics
    # the same session keeps its worker on each replica through the outage (local cache, hash)
    assert (a.chat("x", "conv-0").headers["x-poolgate-worker"]
            == a.chat("y", "conv-0").headers["x-poolgate-worker"])

    cluster.redis.start()
    took = max(_until(lambda: r.http.get("/readyz").json()["redis"] == "up", 5, "Redis used again")
               for r in (a, b))
    assert took < 5
    # Redis came back empty: the replicas wrote their drains again rather than resume w3
    time.sleep(1.5)
    assert a.worker_state("w3") == b.worker_state("w3") == "draining"
    assert b.http.post("/internal/workers/w3/resume", headers=ADMIN).status_code == 200
    _until(lambda: a.worker_state("w3") == "ready", 5, "A resumes w3")
    rid = b.http.post("/v1/responses", headers=KEY,
                      json={"model": OPENAI_MODEL, "input": "after"}).json()["id"]
    # a Redis call may time out (redis_timeout 0.1 s) on a loaded machine right after the
    # reconnect: the response must be readable through A within the probe's second
    _until(lambda: a.http.get(f"/v1/responses/{rid}", headers=KEY).status_code == 200, 5,
           "A reads what B stored")
    metrics = a.http.get("/metrics", headers={"authorization": "Bearer m"}).text
    assert "poolgate_redis_up 1.0" in metrics


def test_a_replica_started_before_redis_serves_then_joins(tmp_path, fake_upstream) -> None:
    redis = RedisServer()  # not started yet: nothing listens on its port
    replica = Replica("late", tmp_path, redis.url, ("w1", "w2"), fake_upstream.url)
    try:
        assert replica.http.get("/readyz").json()["redis"] == "down"
        assert replica.chat("hello", "s1").status_code == 200
        redis.start()
        _until(lambda: replica.http.get("/readyz").json()["redis"] == "up", 5, "Redis joined")
        r = replica.http.post("/v1/responses", headers=KEY,
                              json={"model": OPENAI_MODEL, "input": "now"})
        assert r.status_code == 200, r.text
        client = redis.client()
        try:
            keys = client.keys("poolgate:r:*")
        finally:
            client.close()
        assert keys == [f"poolgate:r:{r.json()['id']}".encode()]
    finally:
        replica.close()
        redis.stop()
