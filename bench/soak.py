#!/usr/bin/env python3
"""Soak: many mixed requests against a real gateway; does anything leak?

Starts the demo upstream (``python -m app.demo_upstream``) and ``poolgate
serve`` from this checkout with three workers: the upstream as an OpenAI and
as an Anthropic remote worker, and a process worker
(``tests.fakes.echo_worker``). Then ``--requests`` requests (default 20,000)
at ``--concurrency`` (default 32), mixed evenly over OpenAI chat, Anthropic
messages and Responses (a third of those continuing a stored response with
``previous_response_id``), each streamed or not, on the remote and the
process workers; ``--disconnect`` of the streams (default 5 %) are dropped by
the client after their first chunk.

Printed at the end (JSON): the gateway's RSS at start (after one warm-up
request of each kind) and end, latency p50/p99 (whole request; dropped streams
excluded), errors (a non-2xx status, a transport error, or a stream without
its terminal event), and the admission stats once the gateway settles:
``leaked`` is what is still in flight or waiting (must be zero).

Bounded: no request starts after ``--max-seconds`` (default 900), each has a
30 s timeout; both servers are stopped by PID (their process groups) at the end.

    .venv/bin/python bench/soak.py
    .venv/bin/python bench/soak.py --requests 2000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import API_KEY, ROOT, free_port  # noqa: E402
from slow_readers import rss_mib, stop  # noqa: E402

ADMIN = "soak-admin"
KINDS = ("chat", "messages", "responses")
# a stream's successful end (max_output_tokens makes some Responses incomplete: fine)
TERMINAL = {"chat": (b"data: [DONE]",), "messages": (b"event: message_stop",),
            "responses": (b"event: response.completed", b"event: response.incomplete")}


def config(port: int, upstream: int) -> str:
    echo = json.dumps([sys.executable, "-m", "tests.fakes.echo_worker"])
    return f"""[server]
host = "127.0.0.1"
port = {port}
api_keys = {{ soak = "{API_KEY}" }}
admin_token = "{ADMIN}"
log_level = "warning"
queue_timeout = 30

[[workers]]
name = "up-openai"
kind = "remote"
dialect = "openai"
url = "http://127.0.0.1:{upstream}/v1"
models = ["mock-gpt"]

[[workers]]
name = "up-anthropic"
kind = "remote"
dialect = "anthropic"
url = "http://127.0.0.1:{upstream}"
models = ["mock-claude"]

[[workers]]
name = "echo"
kind = "process"
models = ["echo"]
cwd = {json.dumps(str(ROOT))}
command = {echo}
"""


class Soak:
    def __init__(self, url: str, a: argparse.Namespace) -> None:
        self.url = url
        self.a = a
        self.rng = random.Random(a.seed)
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.dropped = 0
        self.stored: list[str] = []  # response ids to continue

    def _error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    def plan(self) -> tuple[str, str, bool, bool, str | None]:
        rng = self.rng
        kind = rng.choice(KINDS)
        model = rng.choice(["mock-gpt", "mock-claude", "echo"])
        stream = rng.random() < 0.5
        drop = stream and rng.random() < self.a.disconnect
        previous = (rng.choice(self.stored[-200:]) if kind == "responses" and self.stored
                    and rng.random() < 1 / 3 else None)
        return kind, model, stream, drop, previous

    def body(self, kind: str, model: str, stream: bool, previous: str | None) -> tuple[str, dict]:
        text = f"soak {self.rng.randrange(10**6)} please answer briefly"
        if kind == "chat":
            return "/v1/chat/completions", {"model": model, "stream": stream, "max_tokens": 16,
                                            "messages": [{"role": "user", "content": text}]}
        if kind == "messages":
            return "/v1/messages", {"model": model, "stream": stream, "max_tokens": 16,
                                    "messages": [{"role": "user", "content": text}]}
        body = {"model": model, "stream": stream, "input": text, "max_output_tokens": 16}
        if previous is not None:
            body["previous_response_id"] = previous
        return "/v1/responses", body

    async def one(self, http: aiohttp.ClientSession) -> None:
        kind, model, stream, drop, previous = self.plan()
        path, body = self.body(kind, model, stream, previous)
        key = f"{kind}/{'stream' if stream else 'json'}"
        self.counts[key] = self.counts.get(key, 0) + 1
        started = time.perf_counter()
        try:
            async with http.post(self.url + path, json=body) as r:
                if r.status != 200:
                    await r.read()
                    self._error(f"{key} {r.status}")
                    return
                if not stream:
                    data = await r.json()
                    if kind == "responses" and data.get("id"):
                        self.stored.append(data["id"])
                else:
                    seen = b""
                    async for chunk in r.content.iter_any():
                        if drop:
                            self.dropped += 1
                            r.close()  # the client goes away mid-stream
                            return
                        seen = (seen + chunk)[-4096:]
                    if not any(end in seen for end in TERMINAL[kind]):
                        self._error(f"{key} no terminal event")
                        return
            self.latencies.append(time.perf_counter() - started)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self._error(f"{key} {type(exc).__name__}")

    async def run(self) -> float:
        a = self.a
        timeout = aiohttp.ClientTimeout(total=30)
        headers = {"authorization": f"Bearer {API_KEY}"}
        left = a.requests
        deadline = time.monotonic() + a.max_seconds
        connector = aiohttp.TCPConnector(limit=a.concurrency)
        async with aiohttp.ClientSession(timeout=timeout, headers=headers,
                                         connector=connector) as http:
            async def lane() -> None:
                nonlocal left
                while left > 0 and time.monotonic() < deadline:
                    left -= 1
                    await self.one(http)

            started = time.perf_counter()
            await asyncio.gather(*(lane() for _ in range(a.concurrency)))
            return time.perf_counter() - started


async def settle(url: str) -> dict:
    """The admission stats once nothing is in flight (or after 15 s)."""
    headers = {"authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for _ in range(150):
            async with http.get(url + "/internal/stats") as r:
                stats = (await r.json())["admission"]
            if not stats["in_flight"] and not stats["waiting"]:
                break
            await asyncio.sleep(0.1)
    return stats


def start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


async def warm(url: str) -> None:
    soak = Soak(url, argparse.Namespace(seed=0, disconnect=0.0))
    async with aiohttp.ClientSession(headers={"authorization": f"Bearer {API_KEY}"}) as http:
        for kind in KINDS:
            for model in ("mock-gpt", "mock-claude", "echo"):
                for stream in (False, True):
                    path, body = soak.body(kind, model, stream, None)
                    async with http.post(url + path, json=body) as r:
                        await r.read()
                        if r.status != 200:
                            raise RuntimeError(f"warm-up {path} {model}: {r.status}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--disconnect", type=float, default=0.05, help="share of streams dropped")
    ap.add_argument("--max-seconds", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=15)
    a = ap.parse_args(argv)
    port, upstream_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="poolgate-soak-") as tmp:
        cfg = Path(tmp) / "poolgate.toml"
        cfg.write_text(config(port, upstream_port))
        upstream = start([sys.executable, "-m", "app.demo_upstream", "--port",
                          str(upstream_port)], Path(tmp) / "upstream.log")
        gateway = start([sys.executable, "-c", "import sys; from app.cli import main; "
                         "sys.exit(main())", "serve", "--config", str(cfg)],
                        Path(tmp) / "gateway.log")
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    asyncio.run(warm(url))
                    break
                except (OSError, RuntimeError, aiohttp.ClientError):
                    if time.monotonic() > deadline or gateway.poll() is not None:
                        print((Path(tmp) / "gateway.log").read_text()[-3000:], file=sys.stderr)
                        return 1
                    time.sleep(0.3)
            rss_start = rss_mib(gateway.pid)
            soak = Soak(url, a)
            seconds = asyncio.run(soak.run())
            stats = asyncio.run(settle(url))
            rss_end = rss_mib(gateway.pid)
        finally:
            stop(gateway)
            stop(upstream)
    lat = sorted(soak.latencies)
    done = len(lat) + sum(soak.errors.values()) + soak.dropped
    result = {
        "requests": done, "seconds": round(seconds, 1), "per_second": round(done / seconds, 1),
        "concurrency": a.concurrency, "mix": dict(sorted(soak.counts.items())),
        "dropped_streams": soak.dropped, "errors": sum(soak.errors.values()),
        "errors_by_kind": soak.errors,
        "p50_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
        "p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1000, 1) if lat else None,
        "rss_start_mib": round(rss_start, 1), "rss_end_mib": round(rss_end, 1),
        "admission_after": {k: stats[k] for k in ("in_flight", "waiting", "by_key", "by_worker",
                                                  "admitted")},
        "leaked": stats["in_flight"] + stats["waiting"],
    }
    print(json.dumps(result, indent=2))
    return 0 if result["leaked"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
