"""poolgate's own CPU per request, without a server in front: requests handed
straight to the ASGI app in this process (no uvicorn, no load generator), the
upstream the demo upstream in a child process. What it measures is the gateway's
application code plus its aiohttp client, per request, with far less noise than
an end-to-end run: compare two checkouts (or two commits) in one sitting.

    .venv/bin/python -m bench.inproc                      # chat and messages, 20,000 each
    .venv/bin/python -m bench.inproc --routes chat -n 50000 --repeat 5

Each row: the least and the median over ``--repeat`` rounds of this process's CPU
time (``time.process_time``) per request, ``-c`` requests at a time (the least is
the one a busy machine disturbed least).
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


async def _round(app: Any, path: str, body: bytes, n: int, c: int) -> float:
    async def lane(count: int) -> None:
        for _ in range(count):
            status = await _one(app, path, body)
            if status != 200:
                raise SystemExit(f"{path}: status {status}")

    started = time.process_time()
    await asyncio.gather(*(lane(n // c) for _ in range(c)))
    return (time.process_time() - started) / (n // c * c) * 1e6


async def _serve(app: Any, routes: list[str], n: int, c: int, repeat: int) -> None:
    from app.cli import _settle_gc
    lifespan_in: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    lifespan_out: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    life = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                     lifespan_in.get, lifespan_out.put))
    await lifespan_in.put({"type": "lifespan.startup"})
    started = await lifespan_out.get()
    assert started["type"] == "lifespan.startup.complete", started
    _settle_gc()
    try:
        for name in routes:
            path, payload = ROUTES[name]
            body = orjson.dumps(payload)
            await _round(app, path, body, min(n, 2000), c)  # warm-up
            rounds = [await _round(app, path, body, n, c) for _ in range(repeat)]
            print(f"{name:10s} c={c:<3d} min {min(rounds):7.2f}  median {statistics.median(rounds):7.2f}"
                  f" us CPU/request (rounds: {', '.join(f'{r:.1f}' for r in rounds)})", flush=True)
    finally:
        await lifespan_in.put({"type": "lifespan.shutdown"})
        await life


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routes", default="chat,messages", help=f"of {', '.join(ROUTES)}")
    ap.add_argument("-n", type=int, default=20000, help="requests per round")
    ap.add_argument("-c", type=int, default=16, help="requests at a time")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    up_port = _free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "app.demo_upstream", "--port", str(up_port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", up_port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or upstream.poll() is not None:
                    raise SystemExit("the demo upstream did not start") from None
                time.sleep(0.1)
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "poolgate.toml"
            config.write_text(config_toml(_free_port(), up_port, "warning"))
            from app.factory import create_app
            from app.settings import load_settings
            app = create_app(load_settings(str(config), os.environ, {}))
            uvloop.run(_serve(app, a.routes.split(","), a.n, a.c, a.repeat))
    finally:
        upstream.terminate()
        upstream.wait(10)


if __name__ == "__main__":
    main()
