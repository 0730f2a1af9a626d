"""``proxy``: a remote worker's every upstream request (chat, count_tokens,
the health probe) goes through its egress proxy, and nothing goes direct
when the proxy is down. A real gateway on 127.0.0.1, the real SDKs, a fake
upstream and a real forward proxy that logs what passes."""

from __future__ import annotations

import time
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest
import structlog

from app.factory import create_app
from pool.errors import UpstreamUnavailable
from pool.model import ChatRequest, Message, TextPart
from pool.remote import RemoteSpec, make_remote_worker
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.egress_proxy import EgressProxy
from tests.fakes.gemini_upstream import FakeGemini
from tests.fakes.upstreams import FakeUpstream
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

KEY = "sk-upstream-key-0123456789"
GATEWAY_KEY = "sk-poolgate-team"
PROXY_PASSWORD = "proxy-password-9876543210"
ADMIN = {"authorization": "Bearer admin-token"}


def _worker_state(http: httpx.Client, name: str) -> str:
    workers = http.get("/internal/workers").json()["workers"]
    return next(w["state"] for w in workers if w["name"] == name)


def _wait_state(http: httpx.Client, name: str, state: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    seen = _worker_state(http, name)
    while seen != state and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = _worker_state(http, name)
    return seen


@pytest.fixture
def served() -> Iterator[tuple[Any, httpx.Client, FakeUpstream, EgressProxy]]:
    with FakeUpstream(api_key=KEY) as upstream, \
            EgressProxy(credentials=f"egress:{PROXY_PASSWORD}") as proxy:
        workers = tuple(WorkerSettings(
            name=f"{dialect}-up", kind="remote", dialect=dialect,
            url=upstream.url if dialect == "openai" else upstream.anthropic_url,
            models=(f"{dialect}-model",), api_key=KEY, proxy=proxy.url, connect_timeout=2)
            for dialect in ("openai", "anthropic"))
        settings = Settings(server=ServerSettings(admin_token="admin-token",
                                                  api_keys={"team": GATEWAY_KEY},
                                                  health_interval=0.2),
                            workers=workers)
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30, headers=ADMIN) as http:
            yield srv, http, upstream, proxy


def test_chat_count_tokens_and_probe_go_through_the_proxy(served: Any) -> None:
    srv, http, upstream, proxy = served
    with structlog.testing.capture_logs() as logs:
        answer = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1",
                                             api_key=GATEWAY_KEY)).chat.completions.create(
            model="openai-model", messages=[{"role": "user", "content": "through the proxy"}])
        claude = closed_at_end(anthropic.Anthropic(base_url=srv.url, api_key=GATEWAY_KEY))
        message = claude.messages.create(model="anthropic-model", max_tokens=50,
                                         messages=[{"role": "user", "content": "hello there"}])
        counted = claude.messages.count_tokens(model="anthropic-model",
                                               messages=[{"role": "user", "content": "count me"}])
    assert answer.choices[0].message.content == "echo: through the proxy"
    assert message.content[0].text == "echo: hello there"
    assert counted.input_tokens > 0
    root = upstream.url.removesuffix("/v1")
    passed = [target for method, target in proxy.passed]
    assert f"{root}/v1/chat/completions" in passed
    assert f"{root}/v1/messages" in passed
    assert f"{root}/v1/messages/count_tokens" in passed
    deadline = time.monotonic() + 5
    while f"{root}/v1/models" not in passed and time.monotonic() < deadline:
        time.sleep(0.05)
        passed = [target for method, target in proxy.passed]
    assert f"{root}/v1/models" in passed  # the health probe
    # every request the upstream saw came through the proxy, none direct
    assert upstream.requests
    assert all(r.headers.get("via") == "1.1 egress-proxy" for r in upstream.requests)
    assert proxy.refused == []
    assert PROXY_PASSWORD not in repr(logs)


def test_a_proxy_that_is_down_makes_the_worker_unhealthy_not_direct(served: Any) -> None:
    srv, http, upstream, proxy = served
    assert _wait_state(http, "openai-up", "ready") == "ready"
    proxy.stop()
    seen = len(upstream.requests)
    assert _wait_state(http, "openai-up", "unhealthy") == "unhealthy"
    assert _wait_state(http, "anthropic-up", "unhealthy") == "unhealthy"
    client = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key=GATEWAY_KEY,
                                         max_retries=0))
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="openai-model",
                                       messages=[{"role": "user", "content": "direct?"}])
    assert refused.value.status_code == 429  # no ready worker: nothing tried around the proxy
    assert PROXY_PASSWORD not in refused.value.response.text
    time.sleep(0.5)  # a few more probes
    assert len(upstream.requests) == seen  # nothing reached the upstream around the proxy
    proxy.start()
    assert _wait_state(http, "openai-up", "ready") == "ready"


def test_a_proxy_that_refuses_our_credentials_is_unhealthy() -> None:
    with FakeUpstream(api_key=KEY) as upstream, EgressProxy(credentials="egress:right") as proxy:
        worker = WorkerSettings(name="openai-up", kind="remote", dialect="openai",
                                url=upstream.url, models=("openai-model",), api_key=KEY,
                                proxy=proxy.url.replace("right", "wrong"))
        settings = Settings(server=ServerSettings(admin_token="admin-token",
                                                  api_keys={"team": GATEWAY_KEY},
                                                  health_interval=0.2),
                            workers=(worker,))
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30, headers=ADMIN) as http:
            assert _wait_state(http, "openai-up", "unhealthy") == "unhealthy"
            assert proxy.refused
            assert not [r for r in upstream.requests if r.path != "/v1/models"]
            assert upstream.requests == []


async def test_a_request_while_the_proxy_is_down_fails_and_never_goes_direct() -> None:
    """Before any probe noticed: the request itself fails at the proxy."""
    with FakeUpstream(api_key=KEY) as upstream, \
            EgressProxy(credentials=f"egress:{PROXY_PASSWORD}") as proxy:
        worker = make_remote_worker(RemoteSpec(
            name="openai-up", dialect="openai", url=upstream.url, api_key=KEY,
            models=("openai-model",), proxy=proxy.url, connect_timeout=2))
        request = ChatRequest(model="openai-model", dialect="openai_chat",
                              messages=(Message(role="user", parts=(TextPart("hi"),)),))
        await worker.start()
        try:
            answer = await worker.complete(request)
            assert answer.parts == [TextPart("echo: hi")]
            assert len(upstream.requests) == 1 and len(proxy.passed) == 1
            proxy.stop()
            with pytest.raises(UpstreamUnavailable) as failed:
                await worker.complete(request)
            assert "egress proxy" in str(failed.value)
            assert PROXY_PASSWORD not in str(failed.value)
            assert not await worker.health()
            assert len(upstream.requests) == 1  # nothing went around the proxy
        finally:
            await worker.aclose()


async def test_a_socks5_proxy_takes_a_remote_workers_requests() -> None:
    with FakeUpstream(api_key=KEY) as upstream, \
            EgressProxy(credentials=f"egress:{PROXY_PASSWORD}") as proxy:
        worker = make_remote_worker(RemoteSpec(
            name="anthropic-up", dialect="anthropic", url=upstream.anthropic_url, api_key=KEY,
            models=("anthropic-model",), proxy=proxy.socks_url, connect_timeout=2))
        request = ChatRequest(model="anthropic-model", dialect="anthropic",
                              messages=(Message(role="user", parts=(TextPart("socks"),)),))
        await worker.start()
        try:
            answer = await worker.complete(request)
            assert answer.parts == [TextPart("echo: socks")]
            assert await worker.count_tokens(request) > 0
            assert await worker.health()
            root = upstream.anthropic_url.removeprefix("http://")
            assert proxy.passed and set(proxy.passed) == {("SOCKS5", root)}
            proxy.stop()
            seen = len(upstream.requests)
            with pytest.raises(UpstreamUnavailable) as failed:
                await worker.complete(request)
            assert PROXY_PASSWORD not in str(failed.value)
            assert not await worker.health()
            assert len(upstream.requests) == seen
        finally:
            await worker.aclose()


async def test_a_socks5_proxy_that_refuses_our_credentials_is_unhealthy() -> None:
    with FakeUpstream(api_key=KEY) as upstream, EgressProxy(credentials="egress:right") as proxy:
        worker = make_remote_worker(RemoteSpec(
            name="openai-up", dialect="openai", url=upstream.url, api_key=KEY,
            models=("openai-model",), proxy=proxy.socks_url.replace("right", "wrong")))
        await worker.start()
        try:
            assert not await worker.health()
            assert proxy.refused and upstream.requests == []
        finally:
            await worker.aclose()


def test_a_gemini_workers_relay_count_and_probe_go_through_the_proxy() -> None:
    """The Gemini dialect's own paths (a relayed generateContent and its stream,
    countTokens, the probe) take the proxy too: the upstream saw exactly what
    passed the proxy, nothing more."""
    with FakeGemini(api_key=KEY, models=("gemini-model",)) as fake, \
            EgressProxy(credentials=f"egress:{PROXY_PASSWORD}") as proxy:
        worker = WorkerSettings(name="gemini-up", dialect="gemini", url=fake.url, api_key=KEY,
                                models=("gemini-model",), proxy=proxy.url)
        settings = Settings(server=ServerSettings(admin_token="admin-token",
                                                  api_keys={"team": GATEWAY_KEY},
                                                  health_interval=0.2), workers=(worker,))
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30,
                             headers={"x-goog-api-key": GATEWAY_KEY}) as http:
            body = {"contents": [{"role": "user", "parts": [{"text": "through the proxy"}]}]}
            for method, query in (("generateContent", ""), ("streamGenerateContent", "?alt=sse"),
                                  ("countTokens", "")):
                r = http.post(f"/v1beta/models/gemini-model:{method}{query}", json=body)
                assert r.status_code == 200, (method, r.text)
            with httpx.Client(base_url=srv.url, timeout=30, headers=ADMIN) as admin:
                assert _wait_state(admin, "gemini-up", "ready") == "ready"
            time.sleep(0.5)  # a few health probes
            host = fake.url.removeprefix("http://").split("/")[0]
            through = [t for _m, t in proxy.passed if host in t]
            paths = [path for path, _body in fake.requests]
            assert {"/v1beta/models/gemini-model:generateContent",
                    "/v1beta/models/gemini-model:streamGenerateContent",
                    "/v1beta/models/gemini-model:countTokens"} <= set(paths)
            assert any(t.endswith("/models") or "/models?" in t for t in through)  # the probe
            assert len(paths) <= len(through)  # none reached the upstream around the proxy
