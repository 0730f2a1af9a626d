"""pool.remote.lean: an aiohttp response made lean streams the same bytes,
without holding its headers."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import structlog

from pool.remote.lean import LeanQueue, lean_response, lean_state
from pool.remote.lean_check import self_test
from tests.fakes.egress_proxy import EgressProxy

from .conftest import OPENAI_MODEL, UPSTREAM_KEY


async def _body(url: str, content: str, lean: bool) -> tuple[bytes, dict[str, bool] | None]:
    body = json.dumps({"model": OPENAI_MODEL, "stream": True,
                       "messages": [{"role": "user", "content": content}]})
    headers = {"authorization": f"Bearer {UPSTREAM_KEY}", "content-type": "application/json"}
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.post(url + "/chat/completions", data=body, headers=headers) as resp:
            assert resp.status == 200
            state = None
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert resp.request_info.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
            if lean:
                lean_response(resp)
                state = lean_state(resp)
                # the headers let go of: the credentials are not held while it streams
                assert not resp.headers and not resp.raw_headers
                assert "authorization" not in resp.request_info.headers
            parts = [chunk async for chunk in resp.content.iter_any()]
            return b"".join(parts), state


async def test_a_lean_response_streams_the_same_bytes(fake_upstream) -> None:
    content = "one two three four five six seven eight nine ten " * 20
    plain, _ = await _body(fake_upstream.url, content, lean=False)
    lean, state = await _body(fake_upstream.url, content, lean=True)
    assert state == {"body": True, "chunks": True, "responses": True, "headers": True}
    assert lean.endswith(b"data: [DONE]\n\n") and lean.count(b"\n\n") > 50

    def texts(raw: bytes) -> list[str]:  # ids and timestamps differ between the two answers
        return [json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                for line in raw.decode().split("\n")
                if line.startswith("data: {") and '"choices":[{' in line]

    assert texts(lean) == texts(plain) and "".join(texts(lean)).strip()


# --- the start-up self-test ---------------------------------------------------

async def test_the_self_test_passes_on_this_aiohttp() -> None:
    assert await self_test() is None


def _corrupting(resp: object) -> None:
    """Lean, but the body reader's queue no longer holds what aiohttp put
    there: an aiohttp whose use of it changed."""
    lean_response(resp)
    resp.content._buffer.append(b"x")  # type: ignore[attr-defined]


async def test_a_swap_that_misbehaves_or_does_not_take_fails_the_self_test() -> None:
    assert "bytes read" in (await self_test(_corrupting) or "")
    assert "not lean" in (await self_test(lambda resp: None) or "")


def test_the_gateway_checks_the_swap_at_start(fake_upstream) -> None:
    from app.factory import create_app
    from tests.support.server import ServerThread

    from .conftest import gateway_settings

    app = create_app(gateway_settings(fake_upstream))
    with structlog.testing.capture_logs() as logs:
        with ServerThread(app):
            gw = app.state.gateway
            assert gw.remote_lean is True
            assert all(w.spec.lean for w in gw.pool.workers)
    assert [(e["state"], e["log_level"]) for e in logs if e["event"] == "remote.swap"] == [
        ("on", "info")]


async def test_a_worker_whose_swap_is_off_leaves_aiohttp_as_it_is(fake_upstream) -> None:
    with EgressProxy() as proxy:
        await _swap_off_leaves_aiohttp(fake_upstream, proxy)


async def _swap_off_leaves_aiohttp(fake_upstream: Any, proxy: EgressProxy) -> None:
    from dataclasses import replace

    from pool.model import ChatRequest, Message, TextPart
    from pool.remote import RemoteSpec, make_remote_worker

    # a worker reaches its upstream through aiohttp only by an egress proxy (else pool.remote.h1)
    spec = RemoteSpec(name="up", dialect="openai", url=fake_upstream.url, api_key=UPSTREAM_KEY,
                      models=(OPENAI_MODEL,), proxy=proxy.url)
    seen: list[dict[str, bool]] = []
    for lean in (True, False):
        worker = make_remote_worker(replace(spec, lean=lean))
        await worker.start()
        try:
            request = ChatRequest(model=OPENAI_MODEL, stream=True, dialect="openai_chat",
                                  messages=(Message("user", (TextPart("[[hang-after:2]] one two three"),)),))
            events = worker.stream(request)
            await events.__anext__()
            # the connection's protocol, with the open response's queue of responses
            [protocol] = worker._client._session.connector._acquired
            seen.append({"responses": type(protocol._buffer) is LeanQueue})
            await events.aclose()
        finally:
            await worker.aclose()
    assert seen == [{"responses": True}, {"responses": False}]
