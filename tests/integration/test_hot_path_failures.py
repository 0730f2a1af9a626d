"""The hot path fails loudly, never silently (issue 21, section 5): a stream
whose response start fails or is cancelled gives its admission slot and its
upstream request back; a client that leaves mid-upload is a 499, not a 500;
a server whose ``receive()`` cannot be driven without a task still has its
departed clients noticed."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Iterator

import httpx
import pytest

from app.factory import create_app
from tests.fakes.upstreams import FakeUpstream
from tests.support.server import ServerThread

from .conftest import ADMIN_TOKEN, CLIENT_KEY, OPENAI_MODEL, gateway_settings

AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
IDLE = {"openai-up": 0, "anthropic-up": 0, "slow-up": 0}


def _wait(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _in_flight(url: str) -> dict[str, int]:
    return httpx.get(url + "/internal/stats", headers=ADMIN).json()["in_flight"]


def _hanging_stream(first_after: int = 2) -> dict[str, Any]:
    return {"model": OPENAI_MODEL, "stream": True,
            "messages": [{"role": "user", "content": f"[[hang-after:{first_after}]] a b c d"}]}


class FailingStart:
    """The gateway app behind a server whose ``send`` of a stream's response
    start fails (``raise``) or is cancelled (``cancel``): what a client gone at
    that instant, or a server shutting down, does to the response."""

    def __init__(self, app: Any, mode: str) -> None:
        self.app = app
        self.mode = mode
        self.state = app.state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return

        async def failing_send(message: dict[str, Any]) -> None:
            headers = dict(message.get("headers", ()))
            if (message["type"] == "http.response.start"
                    and headers.get(b"content-type", b"").startswith(b"text/event-stream")):
                if self.mode == "raise":
                    raise ConnectionResetError("the client left as the response started")
                task = asyncio.current_task()
                assert task is not None
                task.cancel()
                await asyncio.sleep(0)  # cancelled here, inside send()
            await send(message)

        await self.app(scope, receive, failing_send)


@pytest.mark.parametrize("mode", ["raise", "cancel"])
@pytest.mark.parametrize("first_after", [0, 2], ids=["worker-pending", "first-event-in"])
def test_a_failed_response_start_gives_back_the_slot_and_the_upstream(
        fake_upstream: FakeUpstream, mode: str, first_after: int) -> None:
    app = create_app(gateway_settings(fake_upstream))
    before = fake_upstream.disconnects
    with ServerThread(FailingStart(app, mode)) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            # uvicorn answers the failed start with its own 500
            r = client.post("/v1/chat/completions", json=_hanging_stream(first_after),
                            headers=AUTH)
            assert r.status_code == 500
        # the slot is back and the fake upstream saw its request closed
        _wait(lambda: _in_flight(srv.url) == IDLE)
        _wait(lambda: fake_upstream.disconnects > before)


# --- a client that leaves mid-upload ------------------------------------------

@pytest.fixture(scope="module")
def served(fake_upstream: FakeUpstream) -> Iterator[ServerThread]:
    with ServerThread(create_app(gateway_settings(fake_upstream))) as srv:
        yield srv


def _requests_counted(url: str, path_dialect: str, status: int) -> float:
    text = httpx.get(url + "/metrics", headers={"authorization": "Bearer metrics-secret-token"}).text
    total = 0.0
    for line in text.splitlines():
        if (line.startswith("poolgate_requests_total{") and f'dialect="{path_dialect}"' in line
                and f'status="{status}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("path,dialect", [("/v1/chat/completions", "openai_chat"),
                                          ("/v1/messages", "anthropic"),
                                          ("/v1/responses", "openai_responses"),
                                          ("/internal/workers", None)])
def test_a_client_gone_mid_upload_is_a_499_without_a_traceback(
        served: ServerThread, caplog: pytest.LogCaptureFixture, path: str,
        dialect: str | None) -> None:
    import socket

    import structlog

    before_499 = _requests_counted(served.url, dialect, 499)
    before_500 = _requests_counted(served.url, dialect, 500)
    body = json.dumps({"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "x" * 500}]})
    token = CLIENT_KEY if dialect is not None else ADMIN_TOKEN  # an operator route on Starlette
    head = (f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    with structlog.testing.capture_logs() as logs:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(head + body[:100].encode())  # part of the body, then gone
            time.sleep(0.2)
        _wait(lambda: any(e["event"] == "http.request" and e.get("path") == path for e in logs))
    [line] = [e for e in logs if e["event"] == "http.request" and e.get("path") == path]
    assert line["status"] == 499 and line["error"] == "client_disconnected"
    assert line["log_level"] == "info"
    assert not [e for e in logs if e["log_level"] in ("error", "critical")]
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]
    if dialect is not None:  # requests of the API are counted by dialect
        assert _requests_counted(served.url, dialect, 499) == before_499 + 1
        assert _requests_counted(served.url, dialect, 500) == before_500


# --- a server whose receive() needs a task ------------------------------------

class ScopedReceive:
    """The gateway app behind a server whose ``receive()`` opens an anyio cancel
    scope (as anyio-based servers and middlewares do): it needs a task to run
    in, so the task-less watch of open streams cannot drive it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state = app.state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import anyio

        async def scoped_receive() -> Any:
            with anyio.CancelScope():
                return await receive()

        await self.app(scope, scoped_receive if scope["type"] == "http" else receive, send)


def test_a_receive_that_needs_a_task_is_still_watched(fake_upstream: FakeUpstream) -> None:
    import structlog

    app = create_app(gateway_settings(fake_upstream))
    before = fake_upstream.disconnects
    with structlog.testing.capture_logs() as logs:
        with ServerThread(ScopedReceive(app)) as srv:
            for _ in range(2):  # the second stream on the task watcher from the start
                with httpx.Client(base_url=srv.url, timeout=30) as client:
                    with client.stream("POST", "/v1/chat/completions", json=_hanging_stream(),
                                       headers=AUTH) as r:
                        assert r.status_code == 200
                        next(line for line in r.iter_lines() if line.startswith("data: "))
                # the client left: its slot and its upstream request are given back
                _wait(lambda: _in_flight(srv.url) == IDLE)
            _wait(lambda: fake_upstream.disconnects >= before + 2)
    warnings = [e for e in logs if e["event"] == "stream.watch_fallback"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
