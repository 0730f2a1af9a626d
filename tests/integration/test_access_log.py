"""The access log of a real ``poolgate serve`` as users run it (default log level,
API keys, a ledger in ``state_dir``), its stdout read by the test: the fields of
the line for a normal request, an error, a stream and a 429 are the ones
structlog's pipeline wrote before the batched writer (listed here explicitly);
a flood of requests has a line each, or the drops are counted; the lines still
buffered when the process is SIGTERMed are written before it exits."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.server_http import with_server_http

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KEY, LIMITED, METRICS = "sk-access-log-test", "sk-access-limited", "metrics-access-log-test"

# The access line of each kind of request, field by field (the order too), as
# main wrote it through structlog before the batched writer.
ENVELOPE = ["method", "path", "status", "latency_ms", "key"]
ROUTED = ["dialect", "model", "worker", "stream", "tokens_in", "tokens_out"]
TAIL = ["event", "request_id", "level", "timestamp"]
EXPECTED = {
    "ok": ENVELOPE + ROUTED + TAIL,
    "stream": ENVELOPE + ROUTED + ["ttft_ms"] + TAIL,
    "unknown_model": ENVELOPE + ROUTED + ["error"] + TAIL,
    "bad_key": ENVELOPE + ["error"] + TAIL,
    "limited": ENVELOPE + ROUTED + ["error"] + TAIL,
    "health": ENVELOPE + TAIL,
}
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z$")


@pytest.fixture
def demo_upstream() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-m", "app.demo_upstream", "--port", "0"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        port = int(re.search(r":(\d+)", proc.stdout.readline()).group(1))
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


class Served:
    """``poolgate serve`` in its own process, stdout to a file."""

    def __init__(self, tmp: Path, upstream: int) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.out = tmp / "stdout.log"
        config = tmp / "poolgate.toml"
        config.write_text(f"""
[server]
port = {self.port}
state_dir = "{tmp / 'state'}"

[server.keys.team]
secret_env = "ACCESS_TEST_KEY"

[server.keys.limited]
secret_env = "ACCESS_TEST_LIMITED"
rpm = 1

[[workers]]
name = "demo"
dialect = "openai"
url = "http://127.0.0.1:{upstream}/v1"
models = ["mock-gpt"]
""")
        env = {"PATH": "/usr/bin:/bin", "ACCESS_TEST_KEY": KEY, "ACCESS_TEST_LIMITED": LIMITED,
               "POOLGATE_METRICS_TOKEN": METRICS, "PYTHONPATH": str(REPO), "HOME": str(tmp)}
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "serve", "--config", str(config)],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=with_server_http(env))
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.base + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and self.proc.poll() is None, self.text()
            time.sleep(0.05)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def stop(self) -> bool:
        """SIGTERM; whether it then stopped as it should (uvicorn re-raises the signal
        once shut down: the exit status is the signal's)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60) in (0, -signal.SIGTERM)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text().splitlines() if line.startswith("{")]

    def access(self) -> dict[str, dict[str, Any]]:
        return {r["request_id"]: r for r in self.lines() if r.get("event") == "http.request"}


@pytest.fixture
def served(tmp_path: Path, demo_upstream: int) -> Iterator[Served]:
    server = Served(tmp_path, demo_upstream)
    try:
        yield server
    finally:
        server.stop()


def _chat(model: str = "mock-gpt", **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            **extra}


def test_the_access_lines_have_the_fields_they_had(served: Served) -> None:
    def post(rid: str, key: str, body: dict[str, Any]) -> httpx.Response:
        return http.post("/v1/chat/completions", json=body,
                         headers={"authorization": f"Bearer {key}", "x-request-id": rid})

    with httpx.Client(base_url=served.base, timeout=30) as http:
        assert post("ok", KEY, _chat()).status_code == 200
        with http.stream("POST", "/v1/chat/completions", json=_chat(stream=True),
                         headers={"authorization": f"Bearer {KEY}", "x-request-id": "stream"}) as r:
            assert r.status_code == 200 and "[DONE]" in r.read().decode()
        assert post("unknown_model", KEY, _chat("no-such-model")).status_code == 404
        assert post("bad_key", "sk-wrong", _chat()).status_code == 401
        assert post("first", LIMITED, _chat()).status_code == 200
        assert post("limited", LIMITED, _chat()).status_code == 429
        assert http.get("/healthz", headers={"x-request-id": "health"}).status_code == 200
    assert served.stop()
    lines = served.access()
    for rid, fields in EXPECTED.items():
        assert list(lines[rid]) == fields, (rid, lines[rid])
    ok, stream = lines["ok"], lines["stream"]
    assert ok["method"] == "POST" and ok["path"] == "/v1/chat/completions"
    assert ok["status"] == 200 and ok["key"] == "team" and ok["level"] == "info"
    assert ok["dialect"] == "openai_chat" and ok["model"] == "mock-gpt" and ok["worker"] == "demo"
    assert ok["stream"] is False and ok["tokens_out"] == 4 and ok["tokens_in"] > 0
    assert stream["stream"] is True and stream["ttft_ms"] > 0 and stream["tokens_out"] == 4
    assert lines["unknown_model"]["status"] == 404 and lines["unknown_model"]["worker"] is None
    assert lines["bad_key"] == {**lines["bad_key"], "status": 401, "key": "anonymous",
                                "error": "authentication"}
    assert lines["limited"]["status"] == 429 and lines["limited"]["key"] == "limited"
    assert lines["health"]["path"] == "/healthz" and lines["health"]["key"] == "anonymous"
    assert all(TIMESTAMP.match(r["timestamp"]) and r["latency_ms"] >= 0 for r in lines.values())
    assert all(secret not in served.text() for secret in (KEY, LIMITED, METRICS))


async def _flood(base: str, n: int, c: int) -> list[str]:
    """``n`` chat completions, ``c`` at a time; the request ids answered."""
    done: list[str] = []
    async with httpx.AsyncClient(base_url=base, timeout=60,
                                 limits=httpx.Limits(max_connections=c)) as http:
        async def lane(i: int) -> None:
            for j in range(i, n, c):
                rid = f"flood-{j}"
                r = await http.post("/v1/chat/completions", json=_chat(),
                                    headers={"authorization": f"Bearer {KEY}", "x-request-id": rid})
                assert r.status_code == 200, r.text
                done.append(rid)
        await asyncio.gather(*(lane(i) for i in range(c)))
    return done


def test_a_flood_has_a_line_per_request_or_counts_the_dropped(served: Served) -> None:
    answered = asyncio.run(_flood(served.base, 1500, 16))
    metrics = httpx.get(served.base + "/metrics", headers={"authorization": f"Bearer {METRICS}"})
    counted = re.search(r"^poolgate_access_log_dropped_total (\S+)$", metrics.text, re.M)
    assert served.stop()
    lines = served.lines()
    logged = {r["request_id"] for r in lines if r.get("event") == "http.request"}
    dropped = sum(r["dropped"] for r in lines if r.get("event") == "access_log.dropped")
    missing = set(answered) - logged
    assert len(answered) == 1500 and len(missing) == dropped, (len(missing), dropped)
    assert counted is not None and float(counted.group(1)) == dropped
    logged_flood = [r for r in lines if r.get("request_id", "").startswith("flood-")
                    and r.get("event") == "http.request"]
    assert len(logged_flood) == len(logged & set(answered))  # one line each, none twice


def test_the_buffered_lines_are_written_when_the_server_is_stopped(served: Served) -> None:
    with httpx.Client(base_url=served.base, timeout=30) as http:
        for i in range(20):
            r = http.post("/v1/chat/completions", json=_chat(),
                          headers={"authorization": f"Bearer {KEY}", "x-request-id": f"last-{i}"})
            assert r.status_code == 200
    served.proc.send_signal(signal.SIGTERM)  # at once: the last lines are still buffered
    assert served.stop()
    access = served.access()
    assert all(f"last-{i}" in access for i in range(20)), sorted(access)
