"""What a client's same-dialect request may turn on at the operator's upstream,
through a real gateway: fields, betas and server tools beyond the defaults
only where a worker's configuration allows them; image URLs inline only by
default, and poolgate's own fetch refuses loopback addresses."""

from __future__ import annotations

import base64
from typing import Any, Iterator

import httpx
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.upstreams import FakeUpstream
from tests.support.server import ServerThread

from .conftest import UPSTREAM_KEY

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()
HEADERS = {"anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def gw(fake_upstream: FakeUpstream) -> Iterator[tuple[str, FakeUpstream]]:
    def worker(name: str, model: str, dialect: str, **kw: Any) -> WorkerSettings:
        url = fake_upstream.url if dialect == "openai" else fake_upstream.anthropic_url
        return WorkerSettings(name=name, dialect=dialect, url=url, api_key=UPSTREAM_KEY,
                              models=(model,), **kw)

    settings = Settings(server=ServerSettings(), workers=(
        worker("ant", "claude-default", "anthropic"),
        worker("ant-wide", "claude-wide", "anthropic", pass_fields=("service_tier", "mcp_servers"),
               pass_betas=("mcp-client",), server_tools=("web_fetch",)),
        worker("oai", "gpt-default", "openai"),
        worker("oai-fetch", "gpt-fetch", "openai", image_urls="fetch"),
        worker("oai-forward", "gpt-forward", "openai", image_urls="forward"),
    ))
    with ServerThread(create_app(settings)) as srv:
        yield srv.url, fake_upstream


def _messages(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}],
            **extra}


EXTRAS = {"service_tier": "auto", "container": "cont_1",
          "mcp_servers": [{"type": "url", "url": "https://mcp.example/sse", "name": "m"}]}
BETAS = "claude-code-20250219,web-fetch-2025-09-10,code-execution-2025-08-25,mcp-client-2025-04-04"


def _caused(fake: FakeUpstream, before: int, *needles: str) -> list[Any]:
    """What reached the fake upstream since ``before`` that a test could have
    caused: a fetch (no upstream key; poolgate's image fetcher sends none) or a
    request whose body names one of ``needles``. The fake is shared by the
    whole session, so other modules' gateways (health checks, probes) may
    reach it meanwhile; those are keyed and name none of this test's values."""
    keyed = {"authorization", "x-api-key"}
    return [r for r in fake.requests[before:]
            if not keyed & r.headers.keys() or any(n in str(r.body) for n in needles)]


def test_default_worker_drops_extra_fields_and_betas(gw: tuple[str, FakeUpstream]) -> None:
    url, fake = gw
    r = httpx.post(url + "/v1/messages", headers={**HEADERS, "anthropic-beta": BETAS},
                   json=_messages("claude-default", **EXTRAS), timeout=30)
    assert r.status_code == 200, r.text
    sent = fake.last
    assert not set(EXTRAS) & sent.body.keys()
    assert sent.body["messages"] == [{"role": "user", "content": "hi"}]
    assert sent.headers["anthropic-beta"] == "claude-code-20250219"


def test_a_widened_worker_passes_what_it_names(gw: tuple[str, FakeUpstream]) -> None:
    url, fake = gw
    tools = [{"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 2}]
    r = httpx.post(url + "/v1/messages", headers={**HEADERS, "anthropic-beta": BETAS},
                   json=_messages("claude-wide", tools=tools, **EXTRAS), timeout=30)
    assert r.status_code == 200, r.text
    sent = fake.last
    assert sent.body["service_tier"] == "auto" and sent.body["mcp_servers"] == EXTRAS["mcp_servers"]
    assert sent.body["tools"] == tools and "container" not in sent.body
    assert sent.headers["anthropic-beta"] == "claude-code-20250219,mcp-client-2025-04-04"


@pytest.mark.parametrize("tool", [{"type": "web_fetch_20250910", "name": "web_fetch"},
                                  {"type": "code_execution_20250825", "name": "code_execution"}])
def test_server_tools_are_refused_by_default(gw: tuple[str, FakeUpstream], tool: Any) -> None:
    url, fake = gw
    before = len(fake.requests)
    r = httpx.post(url + "/v1/messages", headers=HEADERS, timeout=30,
                   json=_messages("claude-default", tools=[
                       {"name": "f", "input_schema": {"type": "object"}}, tool]))
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"].startswith("tools[1].type:")
    assert _caused(fake, before, tool["type"]) == []  # nothing reached the upstream
    r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": "gpt-default", "messages": [{"role": "user", "content": "hi"}],
        "store": True, "service_tier": "priority", "web_search_options": {}})
    assert r.status_code == 200, r.text
    assert not {"store", "service_tier", "web_search_options"} & fake.last.body.keys()


def _image_chat(model: str, image_url: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": image_url}}]}]}


def test_image_urls_default_to_inline_only(gw: tuple[str, FakeUpstream]) -> None:
    url, fake = gw
    before = len(fake.requests)
    for target in ("http://10.0.0.7/admin.png", "https://example.com/cat.png", "file:///etc/passwd"):
        r = httpx.post(url + "/v1/chat/completions", json=_image_chat("gpt-default", target),
                       timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"].startswith("messages")
    r = httpx.post(url + "/v1/messages", headers=HEADERS, timeout=30, json={
        "model": "claude-default", "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/x.png"}}]}]})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages:")
    assert _caused(fake, before, "admin.png", "cat.png", "/etc/passwd", "169.254") == []
    inline = httpx.post(url + "/v1/chat/completions", timeout=30,
                        json=_image_chat("gpt-default", f"data:image/png;base64,{PNG}"))
    assert inline.status_code == 200, inline.text


def test_fetch_refuses_loopback_and_forward_forwards(gw: tuple[str, FakeUpstream]) -> None:
    url, fake = gw
    port = httpx.URL(fake.url).port
    before = len(fake.requests)

    for target in (f"http://127.0.0.1:{port}/v1/models", f"http://localhost:{port}/v1/models",
                   f"http://[::1]:{port}/x.png", f"http://[::ffff:127.0.0.1]:{port}/x.png",
                   f"http://0.0.0.0:{port}/x.png"):
        r = httpx.post(url + "/v1/chat/completions", json=_image_chat("gpt-fetch", target),
                       timeout=30)
        assert r.status_code == 400, (target, r.text)
        assert "private or loopback" in r.json()["error"]["message"]
    assert _caused(fake, before, f":{port}/") == []  # neither fetched nor forwarded
    target = "http://10.0.0.7/admin.png"
    r = httpx.post(url + "/v1/chat/completions", json=_image_chat("gpt-forward", target),
                   timeout=30)
    assert r.status_code == 200, r.text
    assert target in str(fake.last.body["messages"])
