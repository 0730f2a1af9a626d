#!/usr/bin/env python3
"""Gateway memory with slow readers: does a client that reads slowly make the
gateway buffer its whole answer? (issue 15, item 4)

Starts ``poolgate serve`` with one process worker (this file, run as
``worker``: every answer is ``--events`` text deltas of ``--chunk`` bytes,
produced as fast as the worker's loop allows), opens ``--clients`` streaming
chat completions that each read ``--read`` bytes every ``--every`` seconds,
and samples the gateway's RSS (``/proc/<pid>/status``: VmRSS) for
``--seconds``. While they are open it times one non-streamed request on the
same worker: a slow reader must not hold up the others.

``--root DIR`` runs the gateway and worker code of another checkout (e.g. the
commit before the fix, unpacked with ``git archive <rev> | tar -x -C DIR``),
so before and after are the same load::

    .venv/bin/python bench/slow_readers.py                       # this checkout
    .venv/bin/python bench/slow_readers.py --root /tmp/before    # another one

Bounded: ``--seconds`` of sampling (default 20) plus start-up; the gateway is
stopped by PID at the end (its process group: the worker with it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]


# --------------------------------------------------------------- the worker
def worker(events: int, chunk: int) -> None:
    sys.path.insert(0, os.getcwd())  # the checkout under test (cwd), not this file's
    from pool import worker_main
    from pool.model import Finish, Start, TextDelta, Usage

    piece = "x" * (chunk - 1) + " "

    async def answer(request):  # noqa: ANN001, ANN202 - the worker protocol's handler
        yield Start()
        for i in range(events):
            yield TextDelta(piece)
            if i % 16 == 15:
                await asyncio.sleep(0)  # let other requests (and the ping) in
        yield Usage(input_tokens=1, output_tokens=events)
        yield Finish("stop")

    worker_main.run(answer)


# --------------------------------------------------------------- measuring
def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group we started (the worker goes with it), then SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(port: int, a: argparse.Namespace) -> str:
    command = [sys.executable, str(HERE), "worker", "--events", str(a.events),
               "--chunk", str(a.chunk)]
    return f"""[server]
host = "127.0.0.1"
port = {port}
log_level = "warning"
queue_timeout = 60

[[workers]]
name = "long"
kind = "process"
models = ["long"]
cwd = {json.dumps(str(a.root))}
command = {json.dumps(command)}
max_in_flight = {a.clients + 8}
health_timeout = 5.0
"""


def body(stream: bool) -> bytes:
    return json.dumps({"model": "long", "stream": stream,
                       "messages": [{"role": "user", "content": "go"}]}).encode()


def request(port: int, stream: bool) -> bytes:
    data = body(stream)
    return (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
            ).encode() + data


async def slow_reader(port: int, a: argparse.Namespace, stop: asyncio.Event,
                      got: list[int]) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # little room in the kernel
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    writer.write(request(port, True))
    total = 0
    try:
        while not stop.is_set():
            data = await reader.read(a.read)
            if not data:
                break
            total += len(data)
            try:
                await asyncio.wait_for(stop.wait(), a.every)
            except TimeoutError:
                pass
    finally:
        got.append(total)
        writer.close()


async def one_request(port: int) -> tuple[float, int]:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request(port, False).replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nconnection: close\r\n", 1))
    data = await reader.read()
    writer.close()
    status = int(data.split(b" ", 2)[1]) if data else 0
    return time.perf_counter() - started, status


async def measure(port: int, pid: int, a: argparse.Namespace) -> dict:
    stop = asyncio.Event()
    got: list[int] = []
    base = rss_mib(pid)
    readers = [asyncio.create_task(slow_reader(port, a, stop, got)) for _ in range(a.clients)]
    samples: list[float] = []
    side: tuple[float, int] | None = None
    started = time.monotonic()
    while time.monotonic() - started < a.seconds:
        await asyncio.sleep(0.5)
        samples.append(rss_mib(pid))
        if side is None and time.monotonic() - started > a.seconds / 2:
            side = await asyncio.wait_for(one_request(port), 60)
    stop.set()
    await asyncio.gather(*readers, return_exceptions=True)
    return {"clients": a.clients, "answer_mib": a.events * a.chunk / 2**20,
            "rss_base_mib": round(base, 1), "rss_peak_mib": round(max(samples), 1),
            "rss_end_mib": round(samples[-1], 1),
            "rss_growth_mib": round(max(samples) - base, 1),
            "read_by_clients_mib": round(sum(got) / 2**20, 2),
            "other_request_s": round(side[0], 3) if side else None,
            "other_request_status": side[1] if side else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", nargs="?", default="bench", choices=["bench", "worker"])
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to run")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--events", type=int, default=2048, help="text deltas per answer")
    ap.add_argument("--chunk", type=int, default=2048, help="bytes per text delta")
    ap.add_argument("--read", type=int, default=512, help="bytes a client reads at a time")
    ap.add_argument("--every", type=float, default=0.5, help="seconds between a client's reads")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long to sample")
    a = ap.parse_args(argv)
    if a.mode == "worker":
        worker(a.events, a.chunk)
        return 0
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="poolgate-slow-") as tmp:
        cfg = Path(tmp) / "poolgate.toml"
        cfg.write_text(config(port, a))
        log = open(Path(tmp) / "gateway.log", "wb")
        gateway = subprocess.Popen(
            [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
             "serve", "--config", str(cfg)], cwd=a.root, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    _, status = asyncio.run(one_request(port))
                    if status == 200:
                        break
                except OSError:
                    pass
                if gateway.poll() is not None or time.monotonic() > deadline:
                    print((Path(tmp) / "gateway.log").read_text()[-2000:], file=sys.stderr)
                    return 1
                time.sleep(0.2)
            result = asyncio.run(measure(port, gateway.pid, a))
        finally:
            stop(gateway)
            log.close()
    result["root"] = str(a.root)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
