"""``proxy`` / ``proxy_env`` of a remote worker registered at run time
(``POST /internal/workers``): taken and applied as in the configuration
file (every upstream request through the proxy), the URL never in a
response, a log line or the registration store; a proxy password never in a
request body (``proxy_env``, an allowed variable, holds such a URL)."""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any, Iterator

import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import load_settings
from tests.fakes.egress_proxy import EgressProxy
from tests.fakes.upstreams import FakeUpstream
from tests.support.redis_server import RedisServer
from tests.support.server import ServerThread

ADMIN_TOKEN = "admin-token-for-proxied-joins"
CLIENT_KEY = "sk-client-proxied-joins"
UPSTREAM_SECRET = "sk-upstream-proxied-0123456789"
PROXY_PASSWORD = "proxy-pw-for-joins-13579"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
MODEL = "joined-model"


@pytest.fixture
def served() -> Iterator[tuple[httpx.Client, Any, FakeUpstream, EgressProxy]]:
    with FakeUpstream(api_key=UPSTREAM_SECRET, models=(MODEL, "config-model")) as fake, \
            EgressProxy(credentials=f"egress:{PROXY_PASSWORD}") as proxy:
        environ = {"POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN, "POOLGATE_API_KEYS": f"team={CLIENT_KEY}",
                   "UPSTREAM_SECRET": UPSTREAM_SECRET, "JOIN_PROXY": proxy.url,
                   "GATEWAY_PROXY": proxy.url}
        settings = load_settings(None, environ, {
            "server": {"port": 0, "runtime_secret_envs": ["UPSTREAM_SECRET", "JOIN_PROXY"]},
            "workers": [{"name": "config-worker", "dialect": "openai", "url": fake.url,
                         "models": ["config-model"], "api_key_env": "UPSTREAM_SECRET"}]})
        app = create_app(settings)
        with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            yield http, app.state.gateway, fake, proxy


def _register(http: httpx.Client, fake: FakeUpstream, **extra: Any) -> httpx.Response:
    return http.post("/internal/workers", headers=ADMIN, json={
        "name": "joined", "dialect": "openai", "url": fake.url, "models": [MODEL],
        "api_key_env": "UPSTREAM_SECRET", **extra})


def _chat(http: httpx.Client) -> str:
    with openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key=CLIENT_KEY,
                       max_retries=0) as client:
        out = client.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "through the proxy"}])
    return out.choices[0].message.content


def _secret_free(text: str, proxy: EgressProxy) -> bool:
    return PROXY_PASSWORD not in text and f"127.0.0.1:{proxy.port}" not in text


def test_a_registered_workers_proxy_env_takes_all_its_traffic(served: Any, capsys) -> None:
    http, gw, fake, proxy = served
    before = len(fake.requests)
    r = _register(http, fake, proxy_env="JOIN_PROXY")
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "ready" and _secret_free(r.text, proxy)
    assert _chat(http) == "echo: through the proxy"
    mine = fake.requests[before:]
    # the join's probe and the chat: every one through the proxy (it adds Via)
    assert [q.path for q in mine if q.path.endswith("/models")] and mine
    assert all(q.headers.get("via") == "1.1 egress-proxy" for q in mine), [
        (q.path, q.headers.get("via")) for q in mine]
    listing = http.get("/internal/workers", headers=ADMIN)
    assert _secret_free(listing.text, proxy)
    stored = gw.runtime_workers._known  # what went to the store
    assert stored["joined"]["proxy_env"] == "JOIN_PROXY"
    assert _secret_free(str(stored), proxy)  # the store holds the variable's name only
    assert _secret_free(capsys.readouterr().out, proxy)


def test_a_proxy_without_credentials_in_the_body_is_applied(served: Any) -> None:
    http, _gw, fake, proxy = served
    open_proxy = EgressProxy()
    with open_proxy:
        before = len(fake.requests)
        r = _register(http, fake, proxy=open_proxy.url)
        assert r.status_code == 201, r.text
        assert open_proxy.url not in r.text
        assert _chat(http) == "echo: through the proxy"
        assert all(q.headers.get("via") for q in fake.requests[before:])
        assert any("/chat/completions" in target for _m, target in open_proxy.passed)


def test_proxy_registrations_that_are_refused_name_the_field(served: Any) -> None:
    http, gw, fake, proxy = served
    cases = [
        ({"proxy": proxy.url}, "proxy"),  # a password in a request body
        ({"proxy_env": "GATEWAY_PROXY"}, "proxy_env"),  # not in runtime_secret_envs
        ({"proxy_env": "NOT_SET_ANYWHERE"}, "proxy_env"),
        ({"proxy": "ftp://127.0.0.1:21"}, "proxy"),
        ({"proxy": f"ftp://u:{PROXY_PASSWORD}@127.0.0.1:21"}, "proxy"),  # not quoted either
        ({"proxy": f"socks5://u:{PROXY_PASSWORD}@127.0.0.1:1080"}, "proxy"),
        ({"proxy": "http://127.0.0.1:1", "proxy_env": "JOIN_PROXY"}, "proxy"),
    ]
    for extra, param in cases:
        r = _register(http, fake, **extra)
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["param"] == param, (extra, r.text)
        assert _secret_free(r.text, proxy)
    assert "joined" not in {w["name"] for w in http.get(
        "/internal/workers", headers=ADMIN).json()["workers"]}
    assert gw.runtime_workers._known == {}


def test_a_proxied_registration_reaches_another_replica_through_redis(capsys) -> None:
    """Registered on A with ``proxy_env``: B joins it from Redis, resolves the
    variable from its own environment, and its requests take the proxy too."""
    redis = RedisServer().start()
    with FakeUpstream(api_key=UPSTREAM_SECRET, models=(MODEL, "config-model")) as fake, \
            EgressProxy(credentials=f"egress:{PROXY_PASSWORD}") as proxy, ExitStack() as stack:
        stack.callback(redis.stop)
        environ = {"POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN, "POOLGATE_API_KEYS": f"team={CLIENT_KEY}",
                   "POOLGATE_REDIS_URL": redis.url, "UPSTREAM_SECRET": UPSTREAM_SECRET,
                   "JOIN_PROXY": proxy.url}
        clients = []
        for _ in range(2):
            settings = load_settings(None, environ, {
                "server": {"port": 0, "runtime_secret_envs": ["UPSTREAM_SECRET", "JOIN_PROXY"]},
                "workers": [{"name": "config-worker", "dialect": "openai", "url": fake.url,
                             "models": ["config-model"], "api_key_env": "UPSTREAM_SECRET"}]})
            srv = stack.enter_context(ServerThread(create_app(settings)))
            clients.append(stack.enter_context(httpx.Client(base_url=srv.url, timeout=30)))
        a, b = clients
        assert _register(a, fake, proxy_env="JOIN_PROXY").status_code == 201
        deadline = time.monotonic() + 5
        while "joined" not in {w["name"] for w in b.get("/internal/workers",
                                                         headers=ADMIN).json()["workers"]}:
            assert time.monotonic() < deadline, "B did not join the registered worker"
            time.sleep(0.05)
        before = len(fake.requests)
        assert _chat(b) == "echo: through the proxy"
        assert fake.requests[before:]
        assert all(q.headers.get("via") == "1.1 egress-proxy" for q in fake.requests[before:])
        client = stack.enter_context(redis.client())
        stored = client.hgetall("poolgate:workers")
        assert stored and _secret_free(str(stored), proxy)
    assert _secret_free(capsys.readouterr().out, proxy)
