"""Graceful shutdown of a real ``poolgate serve`` process: on SIGTERM it stops
admitting, lets the streams in flight finish, then exits."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.server_http import with_server_http

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def demo_upstream():
    proc = subprocess.Popen([sys.executable, "-m", "app.demo_upstream", "--port", "0"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        port = int(re.search(r":(\d+)", line).group(1))
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


def test_sigterm_lets_streams_finish(tmp_path, demo_upstream):
    port = _free_port()
    config = tmp_path / "poolgate.toml"
    config.write_text(f"""
[server]
port = {port}
log_level = "warning"
shutdown_timeout = 20

[[workers]]
name = "demo"
dialect = "openai"
url = "http://127.0.0.1:{demo_upstream}/v1"
models = ["slow-d100"]
""")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--config", str(config)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=with_server_http(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "poolgate did not start"
            time.sleep(0.05)

        received: list[str] = []
        started = threading.Event()

        def stream() -> None:
            body = {"model": "slow-d100", "stream": True, "max_tokens": 15,
                    "messages": [{"role": "user", "content": "one two three four five six seven "
                                  "eight nine ten eleven twelve thirteen fourteen fifteen"}]}
            with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    received.append(line)
                    started.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(10)
        os.kill(proc.pid, signal.SIGTERM)
        # no new requests once shutting down
        time.sleep(0.3)
        with pytest.raises(httpx.TransportError):
            httpx.get(base + "/healthz", timeout=2)
        reader.join(timeout=30)
        assert "data: [DONE]" in received, "the stream in flight was cut short"
        # uvicorn re-raises the signal once shut down: exit by SIGTERM, after the stream
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
