"""poolgate's own CPU per request, without a server in front: requests handed
straight to the ASGI app in this process (no uvicorn, no load generator), the
upstream the demo upstream in a child process. What it measures is the gateway's
application code plus its upstream client (pool.remote.h1), per request, with far
less noise than an end-to-end run: compare two checkouts (or two commits) in one
sitting.

    .venv/bin/python -m bench.inproc                      # chat and messages, 20,000 each
    .venv/bin/python -m bench.inproc --routes chat -n 50000 --repeat 5
    .venv/bin/python -m bench.inproc --access-log off,batched,structlog   # the access line's cost

Each row: the least and the median over ``--repeat`` rounds of this process's CPU
time (``time.process_time``) per request, ``-c`` requests at a time (the least is
the one a busy machine disturbed least).

``--access-log`` runs the gateway as users do, with the access log on
(``batched``: the server's writer, ``app.access_log``; ``structlog``: the line
through structlog's pipeline, as before the batched writer; ``off``: log level
warning), each mode its own app, the modes' rounds interleaved; the lines go to
``/dev/null`` (the writer thread's CPU counts: it is this process's). The
difference of two modes' rows is the access line's CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import uvloop

from bench.configs import API_KEY, config_toml

ROUTES = {
    "chat": ("/v1/chat/completions", {"model": "mock-gpt", "max_tokens": 16,
                                      "messages": [{"role": "user", "content": "Say hello."}]}),
    "messages": ("/v1/messages", {"model": "mock-claude", "max_tokens": 16,
                                  "messages": [{"role": "user", "content": "Say hello."}]}),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_demo_upstream(port: int, prefix: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """``python -m app.demo_upstream`` on ``port`` (after ``prefix``, e.g. a
    ``taskset``), once it takes connections; the caller ends it."""
    upstream = subprocess.Popen([*prefix, sys.executable, "-m", "app.demo_upstream",
                                 "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return upstream
        except OSError:
            if time.monotonic() > deadline or upstream.poll() is not None:
                upstream.kill()
                upstream.wait(10)
                raise SystemExit("the demo upstream did not start") from None
            time.sleep(0.1)


def _scope(path: str, body: bytes) -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1"), (b"user-agent", b"bench"), (b"accept", b"*/*"),
               (b"content-type", b"application/json"),
               (b"authorization", f"Bearer {API_KEY}".encode()),
               (b"content-length", str(len(body)).encode())]
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000)}


async def _one(app: Any, path: str, body: bytes) -> int:
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(_scope(path, body), receive, send)
    return status


async def _round(app: Any, path: str, body: bytes, n: int, c: int) -> tuple[float, float]:
    """CPU per request in µs: the process's (every thread), and the event loop's
    thread's alone (what runs on the requests' path; a writer thread's is not)."""
    async def lane(count: int) -> None:
        for _ in range(count):
            status = await _one(app, path, body)
            if status != 200:
                raise SystemExit(f"{path}: status {status}")

    started, started_thread = time.process_time(), time.thread_time()
    await asyncio.gather(*(lane(n // c) for _ in range(c)))
    done = n // c * c
    return ((time.process_time() - started) / done * 1e6,
            (time.thread_time() - started_thread) / done * 1e6)


class _Lifespan:
    """An app's lifespan, driven by hand: ``start`` then ``stop``."""

    def __init__(self, app: Any) -> None:
        self.queue_in: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.queue_out: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.task = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"},
                                               "state": {}}, self.queue_in.get, self.queue_out.put))

    async def start(self) -> None:
        await self.queue_in.put({"type": "lifespan.startup"})
        started = await self.queue_out.get()
        assert started["type"] == "lifespan.startup.complete", started

    async def stop(self) -> None:
        await self.queue_in.put({"type": "lifespan.shutdown"})
        await self.task


class _LineClock:
    """Wall time of each ``access_log.write`` call (the access line's part of a
    request, on the request's path), in ns: its median is robust to the
    preemptions a busy machine adds to a few calls."""

    def __init__(self) -> None:
        from app import access_log
        self.module = access_log
        self.write = access_log.write
        self.spent: list[int] = []

    def __enter__(self) -> "_LineClock":
        write, spent, clock = self.write, self.spent, time.perf_counter_ns

        def timed(record: Any) -> None:
            started = clock()
            write(record)
            spent.append(clock() - started)
        self.module.write = timed
        return self

    def __exit__(self, *exc: object) -> None:
        self.module.write = self.write


def _log_mode(mode: str, sink: Any) -> None:
    """Logging as ``poolgate serve`` sets it up, the access lines written as ``mode`` says."""
    from app.observability import configure_logging
    configure_logging("info" if mode != "off" else "warning", "json", stream=sink,
                      cache_loggers=True, batch_access=mode == "batched")


async def _serve(apps: dict[str, Any], routes: list[str], n: int, c: int, repeat: int,
                 sink: Any) -> None:
    from app.cli import _settle_gc
    lives = [_Lifespan(app) for app in apps.values()]
    for life in lives:
        await life.start()
    _settle_gc()
    try:
        for name in routes:
            path, payload = ROUTES[name]
            body = orjson.dumps(payload)
            rounds: dict[str, list[float]] = {mode: [] for mode in apps}
            threads: dict[str, list[float]] = {mode: [] for mode in apps}
            for mode, app in apps.items():
                _log_mode(mode, sink)
                await _round(app, path, body, min(n, 2000), c)  # warm-up
            clocks = {mode: _LineClock() for mode in apps}
            for _ in range(repeat):  # interleaved: a noisy spell hits every mode
                for mode, app in apps.items():
                    _log_mode(mode, sink)
                    with clocks[mode]:
                        cpu, thread = await _round(app, path, body, n, c)
                    rounds[mode].append(cpu)
                    threads[mode].append(thread)
            for mode, cpu in rounds.items():
                label = f"{name} [{mode}]" if len(apps) > 1 else name
                print(f"{label:22s} c={c:<3d} min {min(cpu):7.2f}  median {statistics.median(cpu):7.2f}"
                      f" us CPU/request (rounds: {', '.join(f'{r:.1f}' for r in cpu)}); loop thread"
                      f" median {statistics.median(threads[mode]):7.2f}", flush=True)
            for mode, clock in clocks.items():
                if mode != "off" and clock.spent:
                    spent = sorted(clock.spent)
                    print(f"{'':22s} access_log.write [{mode}], on the request's path: median "
                          f"{spent[len(spent) // 2] / 1000:.2f} us, p90 "
                          f"{spent[len(spent) * 9 // 10] / 1000:.2f} us wall "
                          f"({len(spent)} calls)", flush=True)
            base, base_thread = rounds.get("off"), threads.get("off")
            for mode, cpu in rounds.items():
                if base is not None and base_thread is not None and mode != "off":
                    paired = [a - b for a, b in zip(cpu, base)]
                    paired_thread = [a - b for a, b in zip(threads[mode], base_thread)]
                    print(f"{'':22s} access line [{mode}]: {min(cpu) - min(base):+.2f} us by the "
                          f"least rounds, {statistics.median(cpu) - statistics.median(base):+.2f} us "
                          f"by the medians, {statistics.median(paired):+.2f} us by the median of the "
                          f"rounds' differences; on the event loop's thread (in-request) "
                          f"{statistics.median(paired_thread):+.2f} us", flush=True)
    finally:
        from app import access_log
        access_log.close()
        for life in lives:
            await life.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routes", default="chat,messages", help=f"of {', '.join(ROUTES)}")
    ap.add_argument("-n", type=int, default=20000, help="requests per round")
    ap.add_argument("-c", type=int, default=16, help="requests at a time")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--access-log", default="off",
                    help="comma-separated modes, of: off (log level warning), batched "
                         "(the server's access log), structlog (the line through structlog)")
    a = ap.parse_args(argv)
    modes = a.access_log.split(",")
    if not modes or any(m not in ("off", "batched", "structlog") for m in modes):
        ap.error("--access-log takes off, batched and structlog")
    up_port = _free_port()
    upstream = start_demo_upstream(up_port)
    try:
        with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as sink:
            from app.factory import create_app
            from app.settings import load_settings
            apps = {}
            for mode in modes:
                config = Path(tmp) / f"poolgate-{mode}.toml"
                config.write_text(config_toml(_free_port(), up_port,  # the ledger on, as users run it
                                              None if mode != "off" else "warning",
                                              state_dir=Path(tmp) / f"state-{mode}"))
                apps[mode] = create_app(load_settings(str(config), os.environ, {}))
            uvloop.run(_serve(apps, a.routes.split(","), a.n, a.c, a.repeat, sink))
    finally:
        upstream.terminate()
        upstream.wait(10)


if __name__ == "__main__":
    main()
