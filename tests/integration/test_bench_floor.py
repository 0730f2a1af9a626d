"""bench/floor.py (the bare pass-through the hot path is measured against) and
bench/open_streams.py (many slow streams held open), run for real on the demo upstream."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.headers.get("content-type", ""), r.read()


def wait_up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "server exited"
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{url} not up after 30 s")


@pytest.fixture
def upstream_and_floor() -> Iterator[tuple[str, str]]:
    up_port, floor_port = free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "app.demo_upstream", "--port", str(up_port)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        up = f"http://127.0.0.1:{up_port}"
        wait_up(up + "/health", procs[0])
        procs.append(subprocess.Popen([sys.executable, str(BENCH / "floor.py"), "--upstream", up,
                                       "--port", str(floor_port)], cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        floor = f"http://127.0.0.1:{floor_port}"
        wait_up(floor + "/health", procs[1])
        yield up, floor
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(10)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"model": "mock-gpt", "max_tokens": 8,
                              "messages": [{"role": "user", "content": "one two three"}]}),
    ("/v1/chat/completions", {"model": "mock-gpt", "max_tokens": 8, "stream": True,
                              "messages": [{"role": "user", "content": "one two three"}]}),
    ("/v1/messages", {"model": "mock-claude", "max_tokens": 8, "stream": True,
                      "messages": [{"role": "user", "content": "one two three"}]}),
])
def test_floor_relays_the_upstream_bytes(upstream_and_floor: tuple[str, str], path: str,
                                         body: dict) -> None:
    up, floor = upstream_and_floor
    direct, relayed = post(up + path, body), post(floor + path, body)
    assert relayed == direct          # status, content type and the very bytes
    assert direct[0] == 200 and (b"data:" in direct[2]) == bool(body.get("stream"))


def test_open_streams_holds_streams_open_through_floor_and_poolgate(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH / "open_streams.py"), "-n", "30", "--hold", "1",
                           "--no-pin", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "open_streams.json").read_text())
    assert list(results) == ["floor", "poolgate"]
    for r in results.values():
        assert r["opened"] == r["still_open"] == 30 and not r["failed_open"] and not r["failed_held"]
        assert r["rss_open_kib"] > 0 and r["rss_idle_kib"] > 0
        assert r["ttft_idle_ms"]["n"] == r["ttft_open_ms"]["n"] == 20
        assert r["tokens_per_s"] > 0          # the held streams kept ticking
    assert "| poolgate | 30 / 30 |" in done.stdout
