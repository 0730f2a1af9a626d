"""Run-time workers across replicas: two real gateways sharing a real
``redis-server``. A worker registered through one is served by both (and by a
replica started later); deleted through the other, it leaves both, its stream
in flight on the first finishing; with Redis down, changes are a clear 503 and
the workers already joined keep serving; Redis back empty, the replicas put
the registrations back."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from typing import Any, Callable, Iterator

import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import load_settings
from tests.fakes.upstreams import FakeUpstream
from tests.support.redis_server import RedisServer
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ADMIN_TOKEN = "admin-token-replicas"
CLIENT_KEY = "sk-client-replicas"
UPSTREAM_SECRET = "sk-upstream-replicas-0123456789"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
SYNC_DEADLINE = 5.0  # replicas poll the registrations with the Redis probe (0.5 s)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=UPSTREAM_SECRET, models=("base-model", "shared-model")) as up:
        yield up


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def replicas(fake: FakeUpstream, redis_server: RedisServer
             ) -> Iterator[Callable[[], httpx.Client]]:
    environ = {"POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN, "POOLGATE_API_KEYS": f"team={CLIENT_KEY}",
               "POOLGATE_REDIS_URL": redis_server.url, "UPSTREAM_SECRET": UPSTREAM_SECRET}
    with ExitStack() as stack:
        def start() -> httpx.Client:
            settings = load_settings(None, environ, {
                "server": {"port": 0, "runtime_secret_envs": ["UPSTREAM_SECRET"]},
                "workers": [{"name": "base", "dialect": "openai", "url": fake.url,
                             "models": ["base-model"], "api_key_env": "UPSTREAM_SECRET"}]})
            srv = stack.enter_context(ServerThread(create_app(settings)))
            return stack.enter_context(httpx.Client(base_url=srv.url, timeout=30))
        yield start


def _names(http: httpx.Client) -> set[str]:
    return {w["name"] for w in http.get("/internal/workers", headers=ADMIN).json()["workers"]}


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + SYNC_DEADLINE
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _ask(http: httpx.Client, model: str, text: str = "hi") -> Any:
    sdk = closed_at_end(openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key=CLIENT_KEY,
                                      max_retries=0))
    return sdk.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text}])


def _register_on_both(a: httpx.Client, b: httpx.Client, fake: FakeUpstream) -> None:
    r = a.post("/internal/workers", headers=ADMIN,
               json={"name": "shared", "dialect": "openai", "url": fake.url,
                     "models": ["shared-model"], "api_key_env": "UPSTREAM_SECRET"})
    assert r.status_code == 201, r.text
    _until(lambda: "shared" in _names(b), "replica B never saw the registered worker")


def test_registered_through_one_replica_served_by_all(replicas, fake) -> None:
    a, b = replicas(), replicas()
    assert a.get("/readyz").json()["redis"] == "up"
    r = a.post("/internal/workers", headers=ADMIN,
               json={"name": "shared", "dialect": "openai", "url": fake.url,
                     "models": ["shared-model"], "api_key_env": "UPSTREAM_SECRET"})
    assert r.status_code == 201, r.text
    _until(lambda: "shared" in _names(b), "replica B never saw the registered worker")
    raw = _ask(b, "shared-model", "through b")
    assert raw.headers["x-poolgate-worker"] == "shared"
    assert raw.parse().choices[0].message.content == "echo: through b"
    again = b.post("/internal/workers", headers=ADMIN,
                   json={"name": "shared", "dialect": "openai", "url": fake.url,
                         "models": ["shared-model"]})
    assert again.status_code == 409  # the name is taken in the shared store
    c = replicas()  # a replica started later joins what is registered
    assert "shared" in _names(c)
    assert _ask(c, "shared-model").parse().choices[0].message.content == "echo: hi"


def test_deleted_through_one_replica_leaves_all_after_its_streams(replicas, fake) -> None:
    a, b = replicas(), replicas()
    _register_on_both(a, b, fake)
    answer: list[str] = []

    def slow_on_a() -> None:
        answer.append(_ask(a, "shared-model", "[[sleep:1.5]] slow on a").parse()
                      .choices[0].message.content)

    reader = threading.Thread(target=slow_on_a)
    reader.start()
    _until(lambda: a.get("/internal/stats", headers=ADMIN).json()["in_flight"].get("shared") == 1,
           "the request never went in flight on A")
    gone = b.delete("/internal/workers/shared", headers=ADMIN)
    assert gone.status_code == 200 and gone.json()["removed"] is True
    reader.join(timeout=30)
    assert answer == ["echo: slow on a"]  # A drained its copy: the request finished
    _until(lambda: "shared" not in _names(a), "replica A never let the deleted worker go")
    time.sleep(1.5)  # three sync rounds: a deleted last worker is not taken for lost data
    assert "shared" not in _names(a) | _names(b)
    for replica in (a, b):
        with pytest.raises(openai.NotFoundError):
            _ask(replica, "shared-model")
    assert _ask(a, "base-model").parse().choices[0].message.content == "echo: hi"


def test_an_operators_drain_does_not_bring_a_leaving_worker_back(replicas, fake) -> None:
    a, b = replicas(), replicas()
    _register_on_both(a, b, fake)
    answer: list[str] = []

    def slow_on_b() -> None:
        answer.append(_ask(b, "shared-model", "[[sleep:2]] slow on b").parse()
                      .choices[0].message.content)

    reader = threading.Thread(target=slow_on_b)
    reader.start()
    _until(lambda: b.get("/internal/stats", headers=ADMIN).json()["in_flight"].get("shared") == 1,
           "the request never went in flight on B")
    assert a.post("/internal/workers/shared/drain", headers=ADMIN).status_code == 200

    def state_on_b() -> str | None:
        workers = b.get("/internal/workers", headers=ADMIN).json()["workers"]
        return next((w["state"] for w in workers if w["name"] == "shared"), None)

    _until(lambda: state_on_b() == "draining", "the drain never reached B")
    # A has nothing in flight: out at once, and its drain is dropped from the shared set
    assert a.delete("/internal/workers/shared", headers=ADMIN).status_code == 200
    seen = set()
    while reader.is_alive():
        seen.add(state_on_b())
        time.sleep(0.02)
    reader.join()
    assert answer == ["echo: slow on b"]
    assert "ready" not in seen, seen  # never resumed by the drain set emptying meanwhile
    _until(lambda: state_on_b() is None, "B never let the deleted worker go")


def test_with_redis_down_changes_are_refused_and_joined_workers_keep_serving(
        replicas, fake, redis_server) -> None:
    a, b = replicas(), replicas()
    _register_on_both(a, b, fake)
    redis_server.kill()
    _until(lambda: b.get("/readyz").json()["redis"] == "down", "B never noticed Redis down")
    started = time.monotonic()
    refused = b.post("/internal/workers", headers=ADMIN,
                     json={"name": "other", "dialect": "openai", "url": fake.url,
                           "models": ["other-model"]})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "store_unavailable"
    assert time.monotonic() - started < 2.0  # bounded, not redis-py's retries
    assert b.delete("/internal/workers/shared", headers=ADMIN).status_code == 503
    for replica in (a, b):  # the pool is kept as it was
        assert _ask(replica, "shared-model").parse().choices[0].message.content == "echo: hi"
    redis_server.start()  # back, empty: the replicas put back what they had
    check = redis_server.client()
    try:
        _until(lambda: check.hexists("poolgate:workers", "shared"),
               "the registration was not restored into the new Redis")
    finally:
        check.close()
    time.sleep(1.0)  # two sync rounds: nobody took the restart for a delete
    for replica in (a, b):
        assert "shared" in _names(replica)
        assert _ask(replica, "shared-model").parse().choices[0].message.content == "echo: hi"
    # a refused delete changes nothing, so it may be asked again: on a loaded machine one
    # 0.1 s Redis call of B's can time out right after the restart (503, Redis down)
    _until(lambda: b.delete("/internal/workers/shared", headers=ADMIN).status_code == 200,
           "B could not delete after the restart")
    _until(lambda: "shared" not in _names(a), "a delete after the restart did not reach A")
