"""app.protocol: the gateway's uvicorn connections keep lists where uvicorn keeps
empty deques, and still serve open streams, disconnects and pipelined requests."""

from __future__ import annotations

import json
import socket
import time
from typing import Iterator

import httpx
import pytest
import structlog
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.cli import build_server
from app.factory import create_app
from app.protocol import LeanHttpToolsProtocol, lean_state
from app.protocol_check import lean_protocol, self_test
from app.settings import Settings
from tests.support.server import ServerThread

from .conftest import ADMIN_TOKEN, CLIENT_KEY, OPENAI_MODEL, gateway_settings

AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}


@pytest.fixture(scope="module")
def served(fake_upstream) -> Iterator[ServerThread]:
    with ServerThread(create_app(gateway_settings(fake_upstream)), http="uvicorn") as srv:
        yield srv


def _protocols(srv: ServerThread) -> list:
    return list(srv.server.server_state.connections)


def _in_flight(srv: ServerThread) -> dict[str, int]:
    r = httpx.get(srv.url + "/internal/stats", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    return r.json()["in_flight"]


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_open_stream_runs_on_lists_and_ends_when_the_client_leaves(served: ServerThread) -> None:
    body = {"model": OPENAI_MODEL, "stream": True,
            "messages": [{"role": "user", "content": "[[hang-after:2]] one two three four"}]}
    with httpx.Client(base_url=served.url, timeout=30) as client:
        with client.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["object"] == "chat.completion.chunk"
            [protocol] = _protocols(served)
            assert type(protocol) is LeanHttpToolsProtocol
            assert lean_state(protocol) == {"pipeline": True, "writable": True, "message": True}
    # the client left: the server sees the disconnect through the lean message event,
    # and the stream gives its slot back
    _wait(lambda: not _protocols(served))
    _wait(lambda: _in_flight(served) == {"openai-up": 0, "anthropic-up": 0, "slow-up": 0})


def test_pipelined_requests_are_answered_in_order(served: ServerThread) -> None:
    def request(content: str) -> bytes:
        body = json.dumps({"model": OPENAI_MODEL,
                           "messages": [{"role": "user", "content": content}]}).encode()
        return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                b"authorization: Bearer " + CLIENT_KEY.encode() + b"\r\n"
                b"content-type: application/json\r\ncontent-length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)

    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(request("first answer") + request("second answer"))  # one write: pipelined
        received = b""
        while received.count(b"HTTP/1.1 200") < 2 or not received.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, f"connection closed early: {received!r}"
            received += chunk
    first, second = received.index(b"first answer"), received.index(b"second answer")
    assert first < second


def test_plain_answer_through_the_lean_protocol(served: ServerThread) -> None:
    body = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "hi there"}]}
    r = httpx.post(served.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"]


# --- the start-up self-test ---------------------------------------------------

class _DropsPipelined(LeanHttpToolsProtocol):
    """Swaps as it should, but a pipelined request is never answered: a
    uvicorn whose use of its pipeline changed."""

    def on_response_complete(self) -> None:
        self.pipeline.clear()
        super().on_response_complete()


def test_the_self_test_passes_on_this_uvicorn() -> None:
    assert self_test() is None
    with structlog.testing.capture_logs() as logs:
        assert lean_protocol() is LeanHttpToolsProtocol
    assert [(e["event"], e["state"]) for e in logs] == [("protocol.swap", "on")]


@pytest.mark.parametrize("candidate,reason", [
    (HttpToolsProtocol, "not swapped"),  # a uvicorn that keeps these otherwise
    (_DropsPipelined, "TimeoutError"),  # one whose swapped parts misbehave
], ids=["not-swapped", "misbehaves"])
def test_a_failed_self_test_falls_back_to_uvicorns_protocol(candidate: type, reason: str) -> None:
    assert reason in (self_test(candidate, timeout=0.5) or "")
    with structlog.testing.capture_logs() as logs:
        assert lean_protocol(candidate) is HttpToolsProtocol
    [line] = logs
    assert (line["event"], line["state"], line["log_level"]) == ("protocol.swap", "off", "warning")


def test_poolgate_serve_checks_the_swap_at_start() -> None:
    with structlog.testing.capture_logs() as logs:
        server = build_server(create_app(Settings()), Settings())
    assert server.config.http is LeanHttpToolsProtocol
    assert [e["state"] for e in logs if e["event"] == "protocol.swap"] == ["on"]
