"""Micro-benchmark: how should the gateway talk to its worker processes?

Candidates, both carrying the canonical events as JSON (pool.wire codec):

* ``frames``: the chosen protocol, length-prefixed orjson frames multiplexed by
  request id over a socketpair (pool.process.ProcessWorker + pool.worker_main);
* ``http``: HTTP/1.1 over a Unix socket, an aiohttp client (UnixConnector) and
  a tiny raw asyncio server in the child, one request per POST, events as a
  chunked body of JSON lines.

For each, R requests at concurrency C, each answered with E text events;
prints parent and child CPU per request and per event (from process_time and
/proc/PID/stat) and wall time::

    .venv/bin/python bench/worker_protocol.py            # both, default scenarios
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import time
from typing import Any, AsyncIterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import orjson  # noqa: E402

from pool import wire, worker_main  # noqa: E402
from pool.model import (ChatRequest, Event, Finish, Message, Sampling, Start,  # noqa: E402
                        TextDelta, TextPart)

_TICK = os.sysconf("SC_CLK_TCK")


def _answer_events(request: ChatRequest) -> list[Event]:
    n = request.sampling.max_tokens or 1
    return [Start(id="x", model=request.model), *(TextDelta(" word") for _ in range(n)),
            Finish("stop")]


async def _answer(request: ChatRequest) -> AsyncIterator[Event]:
    for event in _answer_events(request):
        yield event


# --- the HTTP candidate's child ------------------------------------------------------

class _HttpChild(asyncio.Protocol):
    """Just enough HTTP/1.1: POST with content-length in, chunked JSON lines out."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].lower()
            i = head.find(b"content-length:")
            length = int(head[i + 15:head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0
                              else None]) if i >= 0 else 0
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4:head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            self._respond(wire.request_from_dict(orjson.loads(body)))

    def _respond(self, request: ChatRequest) -> None:
        write = self.transport.write
        write(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"
              b"transfer-encoding: chunked\r\n\r\n")
        for event in _answer_events(request):
            line = orjson.dumps(wire.event_to_dict(event)) + b"\n"
            write(b"%x\r\n%s\r\n" % (len(line), line))
        write(b"0\r\n\r\n")


async def _serve_http(path: str) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(_HttpChild, path)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


# --- the parent side ---------------------------------------------------------------------

def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _request(events: int) -> ChatRequest:
    return ChatRequest(model="m", messages=(Message("user", (TextPart("hello " * 20),)),),
                       dialect="openai_chat", sampling=Sampling(max_tokens=events))


async def _load(one: Any, requests: int, concurrency: int) -> None:
    todo = iter(range(requests))

    async def lane() -> None:
        for _ in todo:
            await one()

    await asyncio.gather(*(lane() for _ in range(concurrency)))


async def bench_frames(requests: int, concurrency: int, events: int) -> dict[str, float]:
    from pool.process import ProcessSpec, ProcessWorker
    worker = ProcessWorker(ProcessSpec(
        name="bench", command=(sys.executable, os.path.abspath(__file__), "--child", "frames"),
        health_interval=3600), base_env=os.environ)
    await worker.start()
    request = _request(events)

    async def one() -> None:
        n = 0
        async for _ in worker.stream(request):
            n += 1
        assert n == events + 2

    try:
        await _load(one, 50, concurrency)  # warm-up
        return await _measure(one, worker.pid or 0, requests, concurrency, events)
    finally:
        await worker.aclose()


async def bench_http(requests: int, concurrency: int, events: int) -> dict[str, float]:
    import aiohttp
    path = os.path.join(tempfile.mkdtemp(), "w.sock")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, os.path.abspath(__file__), "--child", "http", path,
        stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    await proc.stdout.readline()
    body = orjson.dumps(wire.request_to_dict(_request(events)))
    session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path, limit=0))

    async def one() -> None:
        n = 0
        async with session.post("http://worker/generate", data=body,
                                headers={"content-type": "application/json"}) as resp:
            async for line in resp.content:
                wire.event_from_dict(orjson.loads(line))
                n += 1
        assert n == events + 2

    try:
        await _load(one, 50, concurrency)
        return await _measure(one, proc.pid, requests, concurrency, events)
    finally:
        await session.close()
        proc.terminate()
        await proc.wait()


async def _measure(one: Any, pid: int, requests: int, concurrency: int,
                   events: int) -> dict[str, float]:
    child0, parent0, wall0 = _cpu(pid), time.process_time(), time.perf_counter()
    await _load(one, requests, concurrency)
    child, parent, wall = _cpu(pid) - child0, time.process_time() - parent0, \
        time.perf_counter() - wall0
    return {"parent_us_per_req": parent / requests * 1e6,
            "child_us_per_req": child / requests * 1e6,
            "parent_us_per_event": parent / (requests * (events + 2)) * 1e6,
            "req_per_s": requests / wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs="+")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if args.child:
        if args.child[0] == "frames":
            worker_main.run(_answer)
        else:
            asyncio.run(_serve_http(args.child[1]))
        return
    print("| protocol | events/req | requests | parent µs/req | child µs/req "
          "| parent µs/event | req/s |")
    print("|---|---|---|---|---|---|---|")
    for events, requests in ((1, 3000), (200, 300)):
        for name, fn in (("frames", bench_frames), ("http", bench_http)):
            r = asyncio.run(fn(requests, args.concurrency, events))
            print(f"| {name} | {events} | {requests} | {r['parent_us_per_req']:.0f} "
                  f"| {r['child_us_per_req']:.0f} | {r['parent_us_per_event']:.1f} "
                  f"| {r['req_per_s']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
