"""Budget alerts where two real poolgate replicas enforce the budgets through
a real Redis: ``key_near_budget`` fires there too (from the shared totals),
and each budget alert reaches a real receiver once per budget window, not
once per replica, however many requests either replica serves or refuses."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Iterator

import pytest

from tests.support.alert_receiver import AlertReceiver
from tests.support.redis_server import RedisServer

from .test_replicas import Replica, _until

NEAR = {"authorization": "Bearer sk-near"}
OVER = {"authorization": "Bearer sk-over"}
SECRETS = {"TEAM_NEAR_KEY": "sk-near", "TEAM_OVER_KEY": "sk-over"}


def _extra(receiver: AlertReceiver) -> str:
    return f"""
[server.keys.team-near]
secret_env = "TEAM_NEAR_KEY"
budget_tokens = {{ day = 100000 }}

[server.keys.team-over]
secret_env = "TEAM_OVER_KEY"
budget_tokens = {{ day = 1 }}

[[alerts]]
url = "{receiver.url}"
events = ["key_near_budget", "key_over_budget"]
budget_warn_percent = 0.001
retry_initial = 0.1
"""


@pytest.fixture
def cluster(tmp_path, fake_upstream) -> Iterator[SimpleNamespace]:
    receiver = AlertReceiver()
    receiver.listen()
    redis = RedisServer().start()
    replicas: list[Replica] = []
    try:
        for name in ("a", "b"):
            replicas.append(Replica(name, tmp_path, redis.url, ("w1",), fake_upstream.url,
                                    extra=_extra(receiver), secrets=SECRETS))
        yield SimpleNamespace(a=replicas[0], b=replicas[1], receiver=receiver, redis=redis)
    finally:
        for replica in replicas:
            replica.close()
        redis.stop()
        receiver.close()


def _of(receiver: AlertReceiver, event: str, key: str) -> list[dict]:
    return [a for a in receiver.alerts(event) if a.get("key") == key]


def test_budget_alerts_fire_through_redis_once_across_the_replicas(cluster) -> None:
    a, b, receiver = cluster.a, cluster.b, cluster.receiver
    # near: both replicas serve the key past its (tiny) warning share, each more than once
    for replica in (a, b, a, b):
        assert replica.chat("spend a little", headers=NEAR).status_code == 200
    receiver.wait(lambda: len(_of(receiver, "key_near_budget", "team-near")) >= 1)
    # over: spent on A, then refused again and again on both
    assert a.chat("spend it all", headers=OVER).status_code == 200
    refused = 0
    deadline = time.monotonic() + 10
    while refused < 6 and time.monotonic() < deadline:
        for replica in (a, b):
            answer = replica.chat("more", headers=OVER)
            if answer.status_code == 429:
                assert answer.json()["error"]["code"] == "budget_exceeded", answer.text
                refused += 1
    assert refused >= 6
    _until(lambda: b.chat("more", headers=OVER).status_code == 429, 5, "B refuses too")
    receiver.wait(lambda: len(_of(receiver, "key_over_budget", "team-over")) >= 1)
    time.sleep(1.5)  # time for any second alert (another replica's) to arrive
    near = _of(receiver, "key_near_budget", "team-near")
    over = _of(receiver, "key_over_budget", "team-over")
    assert len(near) == 1, near
    assert len(over) == 1, over
    assert over[0]["details"]["budget"] == "daily" and over[0]["details"]["budget_tokens"] == 1
