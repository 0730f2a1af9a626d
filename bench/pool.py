#!/usr/bin/env python3
"""Two pool measurements: what does a pool of workers cost, and how fast does it heal?

**Overhead.** The same load (chat completions non-stream and SSE with 64
chunks, 16 connections, every request with an ``x-session-id`` out of 64) through
poolgate with ONE remote worker and with FOUR remote workers, all pointing at
the same demo upstream and serving the same model under the default
session-affinity routing. Reports throughput, latency and the gateway's CPU per
request for both, and the ratio 4 workers ÷ 1 worker.

**Recovery.** poolgate with process workers (``python -m tests.fakes.echo_worker``,
restart backoff 0.1 s). Each iteration SIGKILLs a worker's pid (read from
``/internal/workers``), then sends requests in a tight loop (1 s timeout each)
until one succeeds on that worker again, i.e. on its new process; the time from
the kill to that success is the recovery time. Once with a model served by ONE
process worker, once with a model served by TWO (the other keeps serving: the
failed requests in the window are counted).

CPU layout, process handling and output as in ``bench/run.py`` (whose helpers
this uses): upstream and load generator on core 0, poolgate (and its process
workers) on core 1; 127.0.0.1, free ports, children stopped by PID at the end.

    .venv/bin/python bench/pool.py                  # 5 s runs, 10 kills each
    .venv/bin/python bench/pool.py --quick          # 2 s runs, 5 kills each
    .venv/bin/python bench/pool.py --only recovery --iterations 3
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as bench  # noqa: E402  (bench/run.py: processes, ports, loadgen runner)
from run import API_KEY, ROOT, Proc, Scenario, fmt, free_port, log, wait_ready  # noqa: E402

ADMIN_TOKEN = "bench-admin"
SESSIONS = 64
OVERHEAD = {
    "ns_c16": Scenario("openai", "nonstream", 16, "mock-gpt", 16, "chat, non-stream"),
    "st_c16": Scenario("openai", "stream", 16, "mock-gpt", 64, "chat, SSE, 64 chunks unpaced"),
}
RECOVERY_MODELS = {1: "echo-solo", 2: "echo-pair"}   # workers serving the model -> model
VICTIM = {1: "solo", 2: "pair-a"}
REQUEST_TIMEOUT = 1.0       # each request of the recovery loop
RECOVERY_LIMIT = 30.0       # an iteration that takes longer is an error


# ------------------------------------------------------------------ configs
def _server(port: int) -> str:
    return f"""[server]
host = "127.0.0.1"
port = {port}
api_keys = {{ bench = "{API_KEY}" }}
log_level = "warning"
"""


def remote_pool_toml(port: int, upstream_port: int, n: int) -> str:
    """``n`` remote workers, all on the same upstream and model."""
    workers = "".join(f"""
[[workers]]
name = "remote-{i}"
kind = "remote"
dialect = "openai"
url = "http://127.0.0.1:{upstream_port}/v1"
models = ["mock-gpt"]
""" for i in range(n))
    return _server(port) + workers


def process_pool_toml(port: int, python: str) -> str:
    """``solo`` serves ``echo-solo`` alone; ``pair-a`` and ``pair-b`` serve ``echo-pair``."""
    command = ", ".join(json.dumps(p) for p in (python, "-m", "tests.fakes.echo_worker"))
    workers = "".join(f"""
[[workers]]
name = "{name}"
kind = "process"
models = ["{model}"]
cwd = {json.dumps(str(ROOT))}
command = [{command}]
backoff_initial = 0.1
backoff_max = 0.1
crash_loop_threshold = 1000
""" for name, model in (("solo", "echo-solo"), ("pair-a", "echo-pair"), ("pair-b", "echo-pair")))
    return _server(port) + workers


# ------------------------------------------------------------------ small HTTP client
class Client:
    """Keep-alive HTTP/1.1 to the gateway; a fresh connection after any failure."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
             timeout: float) -> tuple[int | None, http.client.HTTPResponse | None, bytes]:
        for attempt in (1, 2):
            reused = self.conn is not None
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            self.conn.timeout = timeout
            if self.conn.sock is not None:
                self.conn.sock.settimeout(timeout)
            try:
                self.conn.request(method, path, body=body, headers=headers)
                r = self.conn.getresponse()
                return r.status, r, r.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()        # an idle keep-alive connection the server closed: once more
                if not reused or attempt == 2:
                    return None, None, b""
            except (OSError, http.client.HTTPException):
                self.close()
                return None, None, b""
        return None, None, b""

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def workers(client: Client) -> dict[str, dict]:
    status, _, data = client.call("GET", "/internal/workers", None,
                                  {"authorization": f"Bearer {ADMIN_TOKEN}"}, 5.0)
    if status != 200:
        raise RuntimeError(f"/internal/workers answered {status}")
    return {w["name"]: w for w in json.loads(data)["workers"]}


def all_ready(client: Client, names: list[str]) -> dict[str, dict]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ws = workers(client)
        if all(ws[n]["state"] == "ready" and ws[n]["pid"] for n in names):
            return ws
        time.sleep(0.05)
    raise RuntimeError(f"workers {names} not ready after 30 s")


def is_descendant(pid: int, ancestor: int) -> bool:
    """Only ever signal a process our gateway started."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, IndexError, ValueError):
            return False
    return False


# ------------------------------------------------------------------ recovery
def recover_once(client: Client, gateway: Proc, n_workers: int, iteration: int) -> dict:
    model, victim = RECOVERY_MODELS[n_workers], VICTIM[n_workers]
    names = [victim] if n_workers == 1 else ["pair-a", "pair-b"]
    old = all_ready(client, names)[victim]["pid"]
    if not is_descendant(old, gateway.pid):
        raise RuntimeError(f"pid {old} of {victim} is not a child of our gateway")
    time.sleep(0.2)     # let the last probe/ping settle
    headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    body = json.dumps({"model": model, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "are you back?"}]}).encode()
    sent = failed = elsewhere = 0
    ready = None        # when /internal/workers first showed the new process ready
    os.kill(old, signal.SIGKILL)
    t0 = time.perf_counter()
    while True:
        if time.perf_counter() - t0 > RECOVERY_LIMIT:
            raise RuntimeError(f"{victim} not serving {RECOVERY_LIMIT:.0f} s after kill -9")
        if ready is None:
            w = workers(client)[victim]
            if w["state"] == "ready" and w["pid"] not in (None, old):
                ready = time.perf_counter() - t0
        headers["x-session-id"] = f"recovery-{n_workers}-{iteration}-{sent}"   # a new session each
        sent += 1
        status, r, _ = client.call("POST", "/v1/chat/completions", body, headers, REQUEST_TIMEOUT)
        if status != 200:
            failed += 1
            continue
        if r.getheader("x-poolgate-worker") == victim:
            # the old process is dead: a success from this worker is its new process
            elapsed = time.perf_counter() - t0
            ready = elapsed if ready is None else ready
            break
        elsewhere += 1
    new = workers(client)[victim]["pid"]
    if new in (None, old):
        raise RuntimeError(f"{victim} answered but /internal/workers shows pid {new} (was {old})")
    return {"seconds": round(elapsed, 4), "ready_s": round(ready, 4), "requests": sent, "failed": failed,
            "served_elsewhere": elsewhere, "old_pid": old, "new_pid": new}


def measure_recovery(a: argparse.Namespace, out: Path, cpus: dict, procs: list[Proc]) -> dict:
    port = free_port()
    config = out / "poolgate-process.toml"
    config.write_text(process_pool_toml(port, a.python))
    gateway = Proc("poolgate (process workers)",
                   [*bench.poolgate_argv(a), "serve", "--config", str(config), "--host",
                    "127.0.0.1", "--port", str(port)], out / "poolgate-process.log", cpus["gateway"])
    procs.append(gateway)
    client = Client(port)
    try:
        wait_ready(gateway, lambda: client.call("GET", "/readyz", None, {}, 2.0)[0] == 200, 60)
        all_ready(client, ["solo", "pair-a", "pair-b"])
        results = {}
        for n in (1, 2):
            runs = [recover_once(client, gateway, n, i) for i in range(a.iterations)]
            secs = [r["seconds"] for r in runs]
            results[str(n)] = {
                "iterations": runs, "min_s": min(secs), "median_s": statistics.median(secs),
                "max_s": max(secs),
                "median_ready_s": statistics.median(r["ready_s"] for r in runs), "failed": sum(r["failed"] for r in runs),
                "requests": sum(r["requests"] for r in runs)}
            log(f"recovery, {n} worker(s): min {min(secs) * 1000:.0f} ms, median "
                f"{statistics.median(secs) * 1000:.0f} ms, max {max(secs) * 1000:.0f} ms, "
                f"{results[str(n)]['failed']} failed of {results[str(n)]['requests']} requests")
        return results
    finally:
        client.close()
        gateway.stop()
        procs.remove(gateway)


# ------------------------------------------------------------------ overhead
def measure_overhead(a: argparse.Namespace, out: Path, cpus: dict, procs: list[Proc]) -> dict:
    up_port = free_port()
    upstream_url = f"http://127.0.0.1:{up_port}"
    upstream = Proc("demo upstream", [a.python, "-m", "app.demo_upstream", "--port", str(up_port)],
                    out / "upstream.log", cpus["upstream"])
    procs.append(upstream)
    wait_ready(upstream, lambda: bench.http("GET", upstream_url + "/health")[0] == 200, 30)
    results: dict[str, dict] = {name: {} for name in OVERHEAD}
    probe = json.dumps({"model": "mock-gpt", "max_tokens": 4,
                        "messages": [{"role": "user", "content": "ready?"}]}).encode()
    extra = ("--session-ids", str(SESSIONS))
    for n in (1, 4):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        config = out / f"poolgate-{n}w.toml"
        config.write_text(remote_pool_toml(port, up_port, n))
        gateway = Proc(f"poolgate ({n} workers)",
                       [*bench.poolgate_argv(a), "serve", "--config", str(config), "--host",
                        "127.0.0.1", "--port", str(port)], out / f"poolgate-{n}w.log",
                       cpus["gateway"])
        procs.append(gateway)
        try:
            wait_ready(gateway, lambda: bench.http("POST", url + "/v1/chat/completions",
                                                   probe)[0] == 200, 120)
            for name, sc in OVERHEAD.items():
                if a.warmup > 0:
                    bench.run_loadgen(a.python, url, sc, a.warmup, cpus["load"],
                                      out / f"warm-{name}-{n}w.json", extra)
                cpu0 = gateway.cpu_s()
                res = bench.run_loadgen(a.python, url, sc, a.duration, cpus["load"],
                                        out / f"{name}-{n}w.json", extra)
                res["gateway_cpu_s"] = round(gateway.cpu_s() - cpu0, 3)
                res["load_avg_1m"] = round(os.getloadavg()[0], 2)
                results[name][str(n)] = res
                log(f"{name} {n} worker(s): rps={res.get('rps')} chunks/s="
                    f"{res.get('chunks_per_s', '-')} errors={res.get('errors')} "
                    f"served_by={res.get('served_by')}")
            if not gateway.alive():
                raise RuntimeError(f"poolgate died; see {gateway.log_path}")
        finally:
            gateway.stop()
            procs.remove(gateway)
    return results


# ------------------------------------------------------------------ report
def _cpu_ms(r: dict) -> float | None:
    ok = r.get("ok_requests") or 0
    return r["gateway_cpu_s"] * 1000 / ok if ok and "gateway_cpu_s" in r else None


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def overhead_table(results: dict) -> list[str]:
    lines = [
        "| scenario | what | 1 worker | 4 workers | ×(4÷1) | gw CPU ms/req, 1 | 4 | ×(4÷1) | "
        "p50 ms, 1 | 4 | requests per worker (4) | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, by_n in results.items():
        sc = OVERHEAD[name]
        key = "chunks_per_s" if sc.mode == "stream" else "rps"
        one, four = by_n.get("1", {}), by_n.get("4", {})
        c1, c4 = _cpu_ms(one), _cpu_ms(four)
        spread = " / ".join(str(v) for v in (four.get("served_by") or {}).values()) or "–"
        errors = sum((r.get("errors") or 0) + (r.get("chunk_mismatch") or 0) for r in (one, four))
        lines.append(
            f"| `{name}` | {sc.what}, {'chunks/s' if key == 'chunks_per_s' else 'req/s'} | "
            f"{fmt(one.get(key), 0)} | {fmt(four.get(key), 0)} | "
            f"**{fmt(_ratio(four.get(key), one.get(key)), 2)}** | {fmt(c1, 3)} | {fmt(c4, 3)} | "
            f"**{fmt(_ratio(c4, c1), 2)}** | {fmt((one.get('latency_ms') or {}).get('p50'), 2)} | "
            f"{fmt((four.get('latency_ms') or {}).get('p50'), 2)} | {spread} | {errors} |")
    return lines


def recovery_table(results: dict) -> list[str]:
    lines = [
        "| workers serving the model | kills | min ms | median ms | max ms | median ms to "
        "`ready` | requests in the windows | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in results.items():
        lines.append(f"| {n} | {len(r['iterations'])} | {fmt(r['min_s'] * 1000, 0)} | "
                     f"{fmt(r['median_s'] * 1000, 0)} | {fmt(r['max_s'] * 1000, 0)} | "
                     f"{fmt(r['median_ready_s'] * 1000, 0)} | "
                     f"{r['requests']} | {r['failed']} |")
    return lines


def report(meta: dict, overhead: dict | None, recovery: dict | None) -> str:
    lines = [f"poolgate pool bench, {meta['when']}: pinning {meta['pinning']}, {meta['nproc']} CPUs, "
             f"load average {meta['load_avg_1m']}.", ""]
    if overhead:
        lines += [f"Pool overhead: {meta['duration_s']} s per run, 16 connections, "
                  f"x-session-id rotating over {SESSIONS} sessions, session-affinity routing.", "",
                  *overhead_table(overhead), ""]
    if recovery:
        lines += [f"Recovery after kill -9 of a process worker (backoff 0.1 s): time from the kill "
                  f"to the first request served by the new process; requests in a tight loop, "
                  f"{REQUEST_TIMEOUT:.0f} s timeout each.", "", *recovery_table(recovery), ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("overhead", "recovery"), help="run one measurement")
    ap.add_argument("-d", "--duration", type=float, default=5.0, help="seconds per load run (≤ 10)")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds before each run (0: none)")
    ap.add_argument("--iterations", type=int, default=None, help="kills per recovery setup (10)")
    ap.add_argument("--quick", action="store_true", help="-d 2 --warmup 0.5 --iterations 5")
    ap.add_argument("--poolgate", default="",
                    help="a poolgate executable (default: python -m app.cli from this checkout)")
    ap.add_argument("--python", default=str(bench.VENV / "python") if (bench.VENV / "python").exists()
                    else sys.executable, help="python for the upstream, loadgen and workers")
    ap.add_argument("--cpus", default="0,0,1", help="cores for upstream,loadgen,poolgate")
    ap.add_argument("--no-pin", action="store_true", help="do not use taskset")
    ap.add_argument("--out", help="results directory (default /tmp/poolgate-bench/pool-<stamp>)")
    a = ap.parse_args(argv)
    if a.quick:
        a.duration, a.warmup = 2.0, 0.5
    if a.iterations is None:
        a.iterations = 5 if a.quick else 10
    if not 0 < a.duration <= 10 or not 0 <= a.warmup <= 10:
        ap.error("--duration must be in (0, 10] and --warmup in [0, 10]")
    if not 1 <= a.iterations <= 100:
        ap.error("--iterations must be in [1, 100]")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    out = Path(a.out or f"/tmp/poolgate-bench/pool-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    cpus, pinning = bench.cpu_plan(a)
    os.environ["POOLGATE_ADMIN_TOKEN"] = ADMIN_TOKEN      # inherited by our gateways only
    procs: list[Proc] = []
    signal.signal(signal.SIGTERM, bench._interrupt)
    try:
        overhead = measure_overhead(a, out, cpus, procs) if a.only != "recovery" else None
        recovery = measure_recovery(a, out, cpus, procs) if a.only != "overhead" else None
        meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "duration_s": a.duration,
                "pinning": pinning, "nproc": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 2), "iterations": a.iterations}
        text = report(meta, overhead, recovery)
        (out / "results.json").write_text(json.dumps(
            {"meta": meta, "overhead": overhead, "recovery": recovery}, indent=1))
        (out / "report.md").write_text(text)
        print(text)
        log(f"results in {out}")
        return 0
    except (RuntimeError, KeyboardInterrupt) as exc:
        log(f"pool bench stopped: {exc or type(exc).__name__}")
        return 1
    finally:
        for proc in reversed(procs):
            proc.stop()


if __name__ == "__main__":
    sys.exit(main())
