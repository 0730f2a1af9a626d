"""``server.http = "granian"``: a real ``poolgate serve`` process on granian
answers, streams, notices a client that leaves a stream (``client_disconnected``
in the access line, its in-flight slot free again) and shuts down on SIGTERM with its access
lines written. (The rest of the suite runs on granian with
``TEST_SERVER_HTTP=granian``: tests/support/server_http.py.)"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.support.gateway_process import GatewayProcess
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

KEY = "sk-granian-test"
CONFIG = """
[server]
port = {port}
http = "granian"
state_dir = "STATE"
max_in_flight = 1
queue_timeout = 0.5
api_keys = { team = "sk-granian-test" }

[[workers]]
name = "demo"
dialect = "openai"
url = "http://127.0.0.1:UPSTREAM/v1"
models = ["mock-gpt", "slow-d100"]
"""


@pytest.fixture
def demo_upstream() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-m", "app.demo_upstream", "--port", "0"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        yield int(re.search(r":(\d+)", proc.stdout.readline()).group(1))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.fixture
def gateway(tmp_path: Path, demo_upstream: int) -> Iterator[GatewayProcess]:
    config = CONFIG.replace("STATE", str(tmp_path / "state")).replace(
        "UPSTREAM", str(demo_upstream))
    gw = GatewayProcess(tmp_path, "granian", config, {})
    try:
        yield gw
    finally:
        gw.close()


def _chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 15, **extra, "messages": [
        {"role": "user", "content": "one two three four five six seven eight nine ten eleven "
                                    "twelve thirteen fourteen fifteen"}]}


def _access(gw: GatewayProcess) -> dict[str, dict[str, Any]]:
    return {line["request_id"]: line for line in
            (json.loads(text) for text in gw.log().splitlines() if text.startswith("{"))
            if line.get("event") == "http.request"}


def _left_mid_stream(gw: GatewayProcess) -> None:
    """Ask for a slow stream, read its first event, then close the socket."""
    body = json.dumps(_chat("slow-d100", stream=True)).encode()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                     b"content-type: application/json\r\nx-request-id: leaver\r\n"
                     b"authorization: Bearer " + KEY.encode() + b"\r\n"
                     b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        seen = b""
        while b"data: " not in seen:
            seen += sock.recv(65536)
        assert seen.startswith(b"HTTP/1.1 200"), seen


def test_poolgate_serves_on_granian(gateway: GatewayProcess) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=gateway.url, headers=auth, timeout=30) as http:
        answer = http.post("/v1/chat/completions", json=_chat("mock-gpt"),
                           headers={"x-request-id": "plain"})
        assert answer.status_code == 200, answer.text
        assert answer.headers["server"] == "granian"
        assert answer.json()["usage"]["completion_tokens"] == 15
        with http.stream("POST", "/v1/chat/completions", json=_chat("mock-gpt", stream=True),
                         headers={"x-request-id": "streamed"}) as streamed:
            assert streamed.status_code == 200
            assert "data: [DONE]" in streamed.read().decode()

        _left_mid_stream(gateway)
        # the slot of the stream that lost its client is free again: with
        # max_in_flight = 1 a leaked one would turn this into a 429
        deadline = time.monotonic() + 10
        while "leaver" not in _access(gateway):
            assert time.monotonic() < deadline, gateway.log()
            time.sleep(0.1)
        after = http.post("/v1/chat/completions", json=_chat("mock-gpt"),
                          headers={"x-request-id": "after"})
        assert after.status_code == 200, after.text

    gateway.proc.send_signal(signal.SIGTERM)
    assert gateway.proc.wait(timeout=30) in (0, -signal.SIGTERM), gateway.log()
    lines = _access(gateway)
    # as on uvicorn: the status its headers went out with, the error says it all
    assert lines["leaver"]["error"] == "client_disconnected", lines["leaver"]
    assert (lines["leaver"]["tokens_out"] or 0) < 15  # cut short, not read to its end
    assert [lines[rid]["status"] for rid in ("plain", "streamed", "after")] == [200, 200, 200]
    assert '"event":"server.listening"' in gateway.log()


def test_a_stream_longer_than_the_shutdown_timeout_does_not_hold_the_exit(
        tmp_path: Path, demo_upstream: int) -> None:
    config = CONFIG.replace("STATE", str(tmp_path / "state")).replace(
        "UPSTREAM", str(demo_upstream)).replace("queue_timeout = 0.5",
                                                "queue_timeout = 0.5\nshutdown_timeout = 1")
    gateway = GatewayProcess(tmp_path, "granian", config, {})
    try:
        body = _chat("slow-d100", stream=True, max_tokens=60)
        body["messages"][0]["content"] = " ".join(f"word{i}" for i in range(80))  # 6 s of tokens
        with httpx.Client(base_url=gateway.url, timeout=30,
                          headers={"authorization": f"Bearer {KEY}", "x-request-id": "long"}) as http:
            with http.stream("POST", "/v1/chat/completions", json=body) as streamed:
                lines = streamed.iter_lines()
                assert next(lines).startswith("data: ")
                gateway.proc.send_signal(signal.SIGTERM)
                stopped_at = time.monotonic()
                try:  # cut short: an error frame, or the connection closed
                    received = [line for line in lines if line.startswith("data: {")]
                except httpx.HTTPError:
                    received = []
        # the lifespan shut down past the timeout and the process exited cleanly,
        # not with granian's own timeout error
        assert gateway.proc.wait(timeout=20) in (0, -signal.SIGTERM), gateway.log()
        assert time.monotonic() - stopped_at < 1 + 5 + 2
        log = gateway.log()
        assert "Traceback" not in log and '"event":"server.shutdown_timeout"' in log, log
        assert _access(gateway)["long"]["tokens_out"] < 60
        assert len(received) < 60
    finally:
        gateway.close()
