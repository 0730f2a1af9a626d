#!/usr/bin/env python3
"""Thousands of slow streams open at once in one gateway process: memory, idle CPU, TTFT.

For each target (``floor``: bench/floor.py, ``poolgate``: ``poolgate serve``), a
fresh gateway pinned to its own core in front of the demo upstream:

1. warm-up: 50 quick streams and 200 slow streams opened and closed, then the
   gateway's VmRSS ("idle") and the TTFT of 20 sequential quick streams;
2. ramp: N streams of ``mock-gpt-d1000-n600`` (a token a second for ten
   minutes) opened by this process (aiohttp, one connection each, at most
   ``--parallel`` opening at a time, each counted open at its first content
   chunk), within ``--ramp-timeout`` seconds;
3. held open: VmRSS again (RSS per open stream = (open − idle) / opened), the
   gateway's CPU over ``--hold`` seconds (the streams tick once a second each),
   the tokens the client received meanwhile, the foreign CPU load, and the TTFT
   of 20 new sequential quick streams (``mock-gpt``, 16 tokens) while they are open;
4. every stream closed by the client, VmRSS once more, gateway stopped.

Each stream holds two sockets in the gateway (client side and upstream side),
so N is bounded by the hard RLIMIT_NOFILE / 2 (soft limits are raised to the
hard one in every process started here). Ephemeral ports: each direction
(client → gateway, gateway → upstream) has its own destination, so each has the
whole ``ip_local_port_range``.

    .venv/bin/python bench/open_streams.py                  # N = 9,900, floor and poolgate
    .venv/bin/python bench/open_streams.py --quick          # N = 1,000
    .venv/bin/python bench/open_streams.py -n 2000 --targets poolgate --tracemalloc
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (processes, ports, configs)
from loadgen import is_content  # noqa: E402
from machine import ForeignLoad, rss_kib  # noqa: E402
from report import open_streams_table  # noqa: E402

HERE = Path(__file__).resolve().parent
QUICK_MODEL = "mock-gpt"
TTFT_PROBES = 20
SETTLE_S = 3.0


@dataclass
class Holder:
    """The client side of the open streams."""

    opened: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    reads: int = 0
    tokens: int = 0
    tasks: list[asyncio.Task] = field(default_factory=list)

    def fail(self, kind: str) -> None:
        self.failed[kind] = self.failed.get(kind, 0) + 1


def chat_body(model: str, max_tokens: int) -> bytes:
    return json.dumps({"model": model, "max_tokens": max_tokens, "stream": True,
                       "messages": [{"role": "user", "content": "hold this stream open"}]}).encode()


HEADERS = {"content-type": "application/json", "authorization": f"Bearer {bench.API_KEY}"}


async def _hold_one(s: aiohttp.ClientSession, url: str, body: bytes, h: Holder,
                    gate: asyncio.Semaphore) -> None:
    opened = False
    resp = None
    try:
        async with gate:
            resp = await s.post(url, data=body, headers=HEADERS)
            if resp.status != 200:
                h.fail(f"status_{resp.status}")
                resp.release()
                return
            async for data in resp.content.iter_any():
                h.reads += 1
                n = sum(is_content(line, False) for line in data.split(b"\n"))
                h.tokens += n
                if n:
                    break
            else:
                h.fail("ended_before_first_token")
                return
            h.opened += 1
            opened = True
        async for data in resp.content.iter_any():
            h.reads += 1
            h.tokens += data.count(b'"content":"')
        h.fail("ended_while_held")
    except asyncio.CancelledError:
        raise
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        h.fail(type(exc).__name__ + ("_while_held" if opened else ""))
    finally:
        if resp is not None:
            resp.close()   # drops the connection: the gateway sees the client go


async def open_many(s: aiohttp.ClientSession, url: str, n: int, parallel: int,
                    timeout: float) -> tuple[Holder, float]:
    """Open ``n`` slow streams; returns once all are open (or failed) or at ``timeout``."""
    h = Holder()
    body = chat_body(bench.SLOW_MODEL, 600)
    gate = asyncio.Semaphore(parallel)
    t0 = time.perf_counter()
    h.tasks = [asyncio.create_task(_hold_one(s, url, body, h, gate)) for _ in range(n)]
    deadline = t0 + timeout
    while h.opened + sum(h.failed.values()) < n and time.perf_counter() < deadline:
        await asyncio.sleep(0.2)
    return h, time.perf_counter() - t0


async def close_all(h: Holder) -> None:
    for t in h.tasks:
        t.cancel()
    await asyncio.gather(*h.tasks, return_exceptions=True)


async def ttft_probes(url: str, count: int, budget: float = 60.0) -> dict:
    """TTFT (ms) of ``count`` sequential quick streams on one keep-alive connection
    (10 s each at most; no new one starts after ``budget`` seconds)."""
    body = chat_body(QUICK_MODEL, 16)
    out: list[float] = []
    errors = 0
    deadline = time.perf_counter() + budget
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1),
                                     timeout=aiohttp.ClientTimeout(total=10)) as s:
        for _ in range(count):
            if time.perf_counter() > deadline:
                errors += 1
                continue
            t0 = time.perf_counter()
            first = None
            try:
                async with s.post(url, data=body, headers=HEADERS) as resp:
                    async for data in resp.content.iter_any():
                        if first is None and any(is_content(x, False) for x in data.split(b"\n")):
                            first = time.perf_counter()
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                pass
            if first is None:
                errors += 1
            else:
                out.append((first - t0) * 1000)
    if not out:
        return {"errors": errors}
    out.sort()
    return {"p50": round(statistics.median(out), 2), "max": round(out[-1], 2),
            "p90": round(out[int(0.9 * (len(out) - 1))], 2), "n": len(out), "errors": errors}


# ------------------------------------------------------------------ one target
def start_gateway(target: str, a: argparse.Namespace, ctx: dict) -> tuple[bench.Proc, str]:
    out: Path = ctx["out"]
    port = bench.free_port()
    probe = [a.python, str(HERE / "memprobe.py"), "--dump", str(out / "tracemalloc" / target)]
    if target == "floor":
        argv = (probe + ["--floor"] if a.tracemalloc else [a.python, str(HERE / "floor.py")]) + [
            "--upstream", ctx["upstream_url"], "--port", str(port)]
    else:
        config = out / f"poolgate-open-{port}.toml"
        config.write_text(bench.config_toml(port, ctx["upstream_port"], None,  # as users run it
                                            max_in_flight=a.n + 1000,
                                            health_interval=a.health_interval or None,
                                            state_dir=out / f"state-open-{port}"))
        serve = ["serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
        argv = (probe if a.tracemalloc else bench.poolgate_argv(a)) + serve
    gw = bench.Proc(f"{target} (open streams)", argv, out / f"open-{target}.log", ctx["gw_cpu"])
    url = f"http://127.0.0.1:{port}"
    probe = chat_body(QUICK_MODEL, 4)
    bench.wait_ready(gw, lambda: bench.http("POST", url + "/v1/chat/completions", probe)[0] == 200, 120)
    return gw, url


async def snapshot(gw: bench.Proc, target: str, label: str, a: argparse.Namespace) -> None:
    """With --tracemalloc: ask memprobe in the gateway to dump, and wait for it (≤ 300 s)."""
    if not a.tracemalloc:
        return
    where = a.out_dir / "tracemalloc" / target
    (where / "next").write_text(label)
    os.kill(gw.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 300
    while not (where / f"{label}.done").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.5)


async def measure_target(target: str, a: argparse.Namespace, ctx: dict) -> dict:
    gw, url = start_gateway(target, a, ctx)
    chat = url + "/v1/chat/completions"
    res: dict = {"target": target, "n": a.n}
    connector = aiohttp.TCPConnector(limit=0)
    s = aiohttp.ClientSession(connector=connector,
                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))
    h: Holder | None = None
    try:
        await ttft_probes(chat, 50)
        warm, _ = await open_many(s, chat, min(200, max(20, a.n // 10)), a.parallel, 60)
        await close_all(warm)
        await asyncio.sleep(SETTLE_S)
        await snapshot(gw, target, "idle", a)
        res["rss_idle_kib"] = rss_kib(gw.pid)
        res["upstream_rss_idle_kib"] = rss_kib(ctx["upstream"].pid)
        res["ttft_idle_ms"] = await ttft_probes(chat, TTFT_PROBES)
        cpu0 = gw.cpu_s()
        h, res["ramp_s"] = await open_many(s, chat, a.n, a.parallel, a.ramp_timeout)
        res["ramp_gw_cpu_s"] = round(gw.cpu_s() - cpu0, 2)
        res["opened"], res["failed_open"] = h.opened, dict(h.failed)
        bench.log(f"{target}: {h.opened}/{a.n} open in {res['ramp_s']:.1f} s, failed {h.failed}")
        await asyncio.sleep(SETTLE_S)
        res["rss_open_kib"] = rss_kib(gw.pid)
        res["upstream_rss_open_kib"] = rss_kib(ctx["upstream"].pid)
        foreign = ForeignLoad(lambda: (gw.cpu_s(), ctx["upstream"].cpu_s()))
        foreign.start()
        cpu0, tokens0, t0 = gw.cpu_s(), h.tokens, time.perf_counter()
        await asyncio.sleep(a.hold)
        wall = time.perf_counter() - t0
        res["gw_cpu_per_s"] = round((gw.cpu_s() - cpu0) / wall, 3)
        res["tokens_per_s"] = round((h.tokens - tokens0) / wall, 1)
        res["ttft_open_ms"] = await ttft_probes(chat, TTFT_PROBES)
        res["foreign_load"] = foreign.stop()
        await snapshot(gw, target, "open", a)
        res["still_open"] = h.opened - sum(v for k, v in h.failed.items() if k.endswith("_while_held"))
        res["failed_held"] = {k: v for k, v in h.failed.items() if k.endswith("_while_held")}
        opened = max(h.opened, 1)
        res["kib_per_stream"] = round((res["rss_open_kib"] - res["rss_idle_kib"]) / opened, 2)
        res["upstream_kib_per_stream"] = round(
            (res["upstream_rss_open_kib"] - res["upstream_rss_idle_kib"]) / opened, 2)
        await close_all(h)
        h = None
        await asyncio.sleep(SETTLE_S)
        res["rss_after_kib"] = rss_kib(gw.pid)
        bench.log(f"{target}: {res['kib_per_stream']} KiB/stream, {res['gw_cpu_per_s']} CPU-s/s, "
                  f"TTFT idle {res['ttft_idle_ms'].get('p50')} open {res['ttft_open_ms'].get('p50')} ms, "
                  f"foreign {res['foreign_load']}")
    finally:
        if h is not None:
            await close_all(h)
        await s.close()
        gw.stop()
    return res


# ------------------------------------------------------------------ running
async def run_targets(a: argparse.Namespace, ctx: dict) -> dict[str, dict]:
    results = {}
    for target in a.targets:
        results[target] = await measure_target(target, a, ctx)
    return results


def run(a: argparse.Namespace, ctx: dict, client_cpu: str | None) -> dict[str, dict]:
    """Every target of ``a`` against the running upstream in ``ctx``; this process is
    the client (pinned to ``client_cpu``, its file limit raised)."""
    bench.raise_nofile()
    if client_cpu is not None:
        os.sched_setaffinity(0, {int(client_cpu)})
    return asyncio.run(run_targets(a, ctx))


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=9900, help="streams to hold open (≤ 9,950)")
    ap.add_argument("--quick", action="store_true", help="-n 1000 --hold 5")
    ap.add_argument("--targets", default="floor,poolgate")
    ap.add_argument("--hold", type=float, default=10.0, help="seconds of CPU measurement (≤ 120)")
    ap.add_argument("--parallel", type=int, default=256, help="streams opening at a time")
    ap.add_argument("--ramp-timeout", type=float, default=300.0, help="seconds (≤ 400)")
    ap.add_argument("--health-interval", type=float, default=600.0,
                    help="poolgate's server.health_interval for this run (0: the default, 10 s); "
                         "with 10 s, a probe answered late by a saturated loop (> 5 s) takes the "
                         "upstream out mid-ramp and new streams get 429")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="run poolgate under bench/memprobe.py and dump idle/open snapshots")
    ap.add_argument("--python", default=str(bench.VENV / "python") if (bench.VENV / "python").exists()
                    else sys.executable)
    ap.add_argument("--poolgate", default="", help="a poolgate executable (default: this checkout's)")
    ap.add_argument("--cpus", default="0,0,1", help="cores for upstream,client,gateway")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--out", help="results directory (default /tmp/poolgate-bench/open-<stamp>)")
    a = ap.parse_args(argv)
    if a.quick:
        a.n, a.hold = 1000, 5.0
    a.targets = a.targets.split(",")
    if not set(a.targets) <= {"floor", "poolgate"}:
        ap.error("--targets: floor and/or poolgate")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if not 1 <= a.n <= min(9950, (hard - 100) // 2):
        ap.error(f"-n must be in [1, {min(9950, (hard - 100) // 2)}] (hard RLIMIT_NOFILE {hard})")
    if not 0 < a.hold <= 120 or not 0 < a.ramp_timeout <= 400 or not 1 <= a.parallel <= 1024:
        ap.error("--hold in (0, 120], --ramp-timeout in (0, 400], --parallel in [1, 1024]")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.out_dir = Path(a.out or f"/tmp/poolgate-bench/open-{time.strftime('%Y%m%d-%H%M%S')}")
    a.out_dir.mkdir(parents=True, exist_ok=True)
    cpus, pinning = bench.cpu_plan(a)
    signal.signal(signal.SIGTERM, bench._interrupt)
    upstream = None
    try:
        port = bench.free_port()
        upstream = bench.Proc("demo upstream", [a.python, "-m", "app.demo_upstream", "--port", str(port)],
                              a.out_dir / "upstream.log", cpus["upstream"])
        url = f"http://127.0.0.1:{port}"
        bench.wait_ready(upstream, lambda: bench.http("GET", url + "/health")[0] == 200, 30)
        ctx = {"out": a.out_dir, "upstream": upstream, "upstream_url": url, "upstream_port": port,
               "gw_cpu": cpus["gateway"]}
        results = run(a, ctx, cpus["load"])
        text = open_streams_table(results)
        (a.out_dir / "open_streams.json").write_text(json.dumps(results, indent=1))
        (a.out_dir / "open_streams.md").write_text(text)
        print(f"{a.n} open streams, {pinning}\n\n{text}")
        bench.log(f"results in {a.out_dir}")
        return 0
    except (RuntimeError, KeyboardInterrupt) as exc:
        bench.log(f"bench stopped: {exc or type(exc).__name__}")
        return 1
    finally:
        if upstream is not None:
            upstream.stop()


if __name__ == "__main__":
    sys.exit(main())
