"""A key's limits hold across two real poolgate replicas and through a Redis
loss: token budgets rebuilt from what the replicas and the ledger know after
``FLUSHALL``, an outage and a restart (Redis comes back empty)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Iterator

import pytest

from tests.support.redis_server import RedisServer

from .test_replicas import Replica, _until

BUDGET = {"authorization": "Bearer sk-d"}
KEYS = """
[server.keys.team-d]
secret_env = "TEAM_D_KEY"
budget_tokens = { day = 1 }
"""
SECRETS = {"TEAM_D_KEY": "sk-d"}


@pytest.fixture
def cluster(tmp_path, fake_upstream) -> Iterator[SimpleNamespace]:
    redis = RedisServer().start()
    replicas: list[Replica] = []
    try:
        for name in ("a", "b"):
            replicas.append(Replica(name, tmp_path, redis.url, ("w1", "w2"), fake_upstream.url,
                                    extra=KEYS, secrets=SECRETS))
        yield SimpleNamespace(redis=redis, a=replicas[0], b=replicas[1])
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
    finally:
        client.close()
    assert _refused_for_budget(a), "A lost the budget with Redis's data"
    time.sleep(1.0)  # two probes: A finds its marker gone and writes the budget back
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
