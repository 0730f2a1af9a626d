"""A key's limits hold across two real poolgate replicas and through a Redis
loss: token budgets rebuilt from what the replicas and the ledger know after
``FLUSHALL``, an outage and a restart (Redis comes back empty); a key's
``max_in_flight`` counted across the replicas, and a replica that dies
holding slots does not hold them beyond ``sessions.redis_slots.TTL``."""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Iterator

import pytest

from app.factory import BUDGET_RESEED
from sessions.redis_slots import TTL
from tests.support.redis_server import RedisServer

from .test_replicas import ADMIN, Replica, _until

BUDGET = {"authorization": "Bearer sk-d"}
TWO = {"authorization": "Bearer sk-f"}
KEYS = """
[server.keys.team-d]
secret_env = "TEAM_D_KEY"
budget_tokens = { day = 1 }

[server.keys.team-f]
secret_env = "TEAM_F_KEY"
max_in_flight = 2
"""
SECRETS = {"TEAM_D_KEY": "sk-d", "TEAM_F_KEY": "sk-f"}
SERVER = "queue_timeout = 0.3\n"


@pytest.fixture
def cluster(tmp_path, fake_upstream) -> Iterator[SimpleNamespace]:
    redis = RedisServer().start()
    replicas: list[Replica] = []
    try:
        for name in ("a", "b"):
            replicas.append(Replica(name, tmp_path, redis.url, ("w1", "w2"), fake_upstream.url,
                                    extra=KEYS, secrets=SECRETS, server=SERVER))
        yield SimpleNamespace(redis=redis, a=replicas[0], b=replicas[1], tmp=tmp_path,
                              upstream=fake_upstream.url, more=replicas)
    finally:
        for replica in replicas:
            replica.close()
        redis.stop()


def _refused_for_budget(replica: Replica) -> bool:
    answer = replica.chat("x", headers=BUDGET)
    if answer.status_code == 200:
        return False
    assert answer.status_code == 429, answer.text
    assert answer.json()["error"]["code"] == "budget_exceeded", answer.text
    return True


def test_a_spent_budget_stays_refused_through_flush_outage_and_restart(cluster) -> None:
    a, b = cluster.a, cluster.b
    assert a.chat("spend it", headers=BUDGET).status_code == 200  # over its 1 token at once
    _until(lambda: _refused_for_budget(b), 5, "B refuses the spent budget (via Redis)")
    assert _refused_for_budget(a)

    client = cluster.redis.client()
    try:
        client.flushall()
        assert _refused_for_budget(a), "A lost the budget with Redis's data"
        # each replica's probe finds its marker gone and writes its budgets back
        _until(lambda: len(client.keys("poolgate:lim-seeded:*")) == 2, 5, "both rebuilt")
    finally:
        client.close()
    assert _refused_for_budget(b), "B admitted a spent budget after FLUSHALL"
    assert _refused_for_budget(a)

    cluster.redis.kill()
    for replica in (a, b):
        assert _refused_for_budget(replica), "a spent budget admitted while Redis is down"

    cluster.redis.start()  # empty
    for replica in (a, b):
        _until(lambda r=replica: r.http.get("/readyz").json()["redis"] == "up", 5, "Redis back")
    for _ in range(3):
        for replica in (a, b):
            assert _refused_for_budget(replica), "a spent budget admitted after a Redis restart"
        time.sleep(0.4)


def _in_flight_refused(replica: Replica) -> bool:
    answer = replica.chat("x", headers=TWO)
    if answer.status_code == 200:
        return False
    assert answer.status_code == 429, answer.text
    assert "2 requests in flight" in answer.json()["error"]["message"], answer.text
    return True


def _held(replica: Replica) -> int:
    """The key's requests in flight on ``replica`` (its own admission count)."""
    stats = replica.http.get("/internal/stats", headers=ADMIN).json()
    return stats["admission"]["by_key"].get("team-f", 0)


def test_max_in_flight_holds_across_replicas_and_outlives_no_dead_replica(cluster) -> None:
    a, b = cluster.a, cluster.b
    with ThreadPoolExecutor(2) as threads:
        slow = [threads.submit(a.chat, "[[sleep:2]] slow", None, TWO) for _ in range(2)]
        _until(lambda: _held(a) == 2, 2, "both admitted on A")
        assert _in_flight_refused(b), "B admitted a third request of a key with max_in_flight 2"
        assert _in_flight_refused(a)
        assert all(f.result().status_code == 200 for f in slow)
    _until(lambda: not _in_flight_refused(b), 2, "B admits once A's requests ended")

    # a replica that dies holding both slots: they are void after TTL, not forever
    c = Replica("c", cluster.tmp, cluster.redis.url, ("w1",), cluster.upstream, extra=KEYS,
                secrets=SECRETS, server=SERVER)
    cluster.more.append(c)
    with ThreadPoolExecutor(2) as threads:
        doomed = [threads.submit(c.chat, "[[sleep:30]] held", None, TWO) for _ in range(2)]
        _until(lambda: _held(c) == 2, 2, "both admitted on C")
        assert _in_flight_refused(b)
        c.proc.kill()
        c.proc.wait()
        for future in doomed:
            with pytest.raises(Exception):
                future.result()
    took = _until(lambda: not _in_flight_refused(b), TTL + 3, "a dead replica's slots expire")
    assert took > 1.0, "the dead replica's slots must count until its deadline passes"


def test_while_redis_is_down_budgets_start_from_the_shared_ledger(tmp_path, fake_upstream) -> None:
    """Two replicas on one ledger (one SQLite file in a shared ``state_dir``,
    standing in for the shared database): B never saw the key's usage, yet
    once Redis is down it refuses the key by what A's requests left in the
    ledger, not from zero."""
    redis = RedisServer().start()
    state = tmp_path / "state"
    server = SERVER + f'state_dir = "{state}"\n'
    replicas: list[Replica] = []
    try:
        for name in ("a", "b"):
            replicas.append(Replica(name, tmp_path, redis.url, ("w1",), fake_upstream.url,
                                    extra=KEYS, secrets=SECRETS, server=server))
        a, b = replicas
        assert a.chat("spend it", headers=BUDGET).status_code == 200

        def in_ledger() -> bool:
            with sqlite3.connect(state / "poolgate.sqlite3") as db:
                return db.execute("SELECT COUNT(*) FROM usage WHERE key = 'team-d'"
                                  ).fetchone()[0] > 0
        _until(in_ledger, 5, "A's request in the ledger")
        redis.kill()
        _until(lambda: b.http.get("/readyz").json()["redis"] == "down", 5, "B sees Redis down")
        time.sleep(0.3)  # the probe that found it down re-seeds B's budgets from the ledger
        assert _refused_for_budget(b), "B counted the budget from zero while Redis is down"
    finally:
        for replica in replicas:
            replica.close()
        redis.stop()


def test_while_redis_is_down_a_replica_sees_the_others_charges_in_the_ledger(
        tmp_path, fake_upstream) -> None:
    """Redis goes down first; then A spends the key's budget. B, which seeded
    its budgets when the outage began, learns A's charges from the shared
    ledger while Redis stays down (it re-reads it every few seconds), instead
    of letting the key spend its whole budget again on B."""
    redis = RedisServer().start()
    state = tmp_path / "state"
    server = SERVER + f'state_dir = "{state}"\n'
    replicas: list[Replica] = []
    try:
        for name in ("a", "b"):
            replicas.append(Replica(name, tmp_path, redis.url, ("w1",), fake_upstream.url,
                                    extra=KEYS, secrets=SECRETS, server=server))
        a, b = replicas
        redis.kill()
        for replica in replicas:
            _until(lambda: replica.http.get("/readyz").json()["redis"] == "down", 5,
                   "Redis seen down")
        time.sleep(0.3)  # the probe that found it down seeded the budgets (nothing spent yet)
        assert a.chat("spend it", headers=BUDGET).status_code == 200
        assert _refused_for_budget(a)
        # B's first request must be refused (any answer would spend the budget on B)
        time.sleep(BUDGET_RESEED + 1.0)
        assert _refused_for_budget(b), "B let the key spend its budget again during the outage"
    finally:
        for replica in replicas:
            replica.close()
        redis.stop()
