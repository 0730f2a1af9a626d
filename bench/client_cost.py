"""What an upstream client costs per request: pool.remote.h1's against aiohttp's
(what the remote workers used before) and httpx's (``--with-httpx``; the test
extra has it).

Both POST the same chat completion to the demo upstream (a child process on
core 0), ``-c`` requests at a time, and read the whole body; this process runs
on core 1 and counts its own CPU time (``time.process_time``) per request.
The rounds of the two clients interleave; each row gives the least and the
median round.

    .venv/bin/python -m bench.client_cost              # 3 rounds of 20,000 each
    .venv/bin/python -m bench.client_cost -n 50000 --repeat 5
    .venv/bin/python -m bench.client_cost --with-httpx
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from typing import Awaitable, Callable

import aiohttp
import orjson
import uvloop
from yarl import URL

from bench.inproc import _free_port, start_demo_upstream
from pool.remote import h1

Client = tuple[Callable[[], Awaitable[bytes]], Callable[[], Awaitable[None]]]  # one request; close
BODY = orjson.dumps({"model": "mock-gpt", "max_tokens": 16,
                     "messages": [{"role": "user", "content": "hi"}]})
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-bench"}


async def _aiohttp_client(url: URL) -> Client:
    # as pool.remote.client made it for a worker: no cookie jar, no decompression
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
                                    auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                    headers={"accept-encoding": "identity"})

    async def one() -> bytes:
        resp = await session.post(url, data=BODY, headers=HEADERS, allow_redirects=False)
        data = await resp.read()
        resp.release()
        return data
    return one, session.close


async def _h1_client(url: URL) -> Client:
    origin = h1.Origin(url, headers={"accept-encoding": "identity"})

    async def one() -> bytes:
        resp = await origin.request("POST", url, HEADERS, BODY)
        parts = [resp.read_nowait()]
        while not resp.is_eof():
            parts.append(await resp.readany())
        resp.release()
        return b"".join(parts)
    return one, origin.aclose


async def _httpx_client(url: URL) -> Client:
    import httpx  # the test extra's: only for this comparison

    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None,
                                                   max_keepalive_connections=None),
                               headers={"accept-encoding": "identity"}, trust_env=False)
    target = str(url)

    async def one() -> bytes:
        resp = await client.post(target, content=BODY, headers=HEADERS)
        return resp.content
    return one, client.aclose


async def _round(one: Callable[[], Awaitable[bytes]], n: int, c: int) -> float:
    async def worker(k: int) -> None:
        for _ in range(k):
            if not await one():
                raise RuntimeError("an empty answer")
    started = time.process_time()
    await asyncio.gather(*(worker(n // c) for _ in range(c)))
    return (time.process_time() - started) / (n // c * c) * 1e6


async def _measure(url: URL, n: int, c: int, repeat: int,
                   with_httpx: bool) -> dict[str, list[float]]:
    clients = {"aiohttp": await _aiohttp_client(url), "h1": await _h1_client(url)}
    if with_httpx:
        clients["httpx"] = await _httpx_client(url)
    rounds: dict[str, list[float]] = {name: [] for name in clients}
    try:
        for one, _ in clients.values():  # warm: connections open, caches filled
            await _round(one, 2000, c)
        for _ in range(repeat):
            for name, (one, _) in clients.items():
                rounds[name].append(await _round(one, n, c))
    finally:
        for _, close in clients.values():
            await close()
    return rounds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=20000, help="requests per round")
    ap.add_argument("-c", type=int, default=16, help="requests at a time")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--with-httpx", action="store_true", help="and httpx's AsyncClient")
    a = ap.parse_args(argv)
    port = _free_port()
    upstream = start_demo_upstream(port, ("taskset", "-c", "0"))
    try:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {1})
        url = URL(f"http://127.0.0.1:{port}/v1/chat/completions")
        rounds = uvloop.run(_measure(url, a.n, a.c, a.repeat, a.with_httpx))
    finally:
        upstream.terminate()
        upstream.wait(10)
    for name, values in rounds.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:8} c={a.c}  min {min(values):6.1f}  median {statistics.median(values):6.1f}"
              f" us CPU/request (rounds: {shown})")
    ratio = statistics.median(rounds["h1"]) / statistics.median(rounds["aiohttp"])
    print(f"h1 / aiohttp, medians: {ratio:.2f}")


if __name__ == "__main__":
    main()
