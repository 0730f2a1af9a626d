#!/usr/bin/env python3
"""What the shared Redis stores cost on the request path: poolgate's CPU per
request and median latency with ``server.redis_url`` set, against the memory
stores, as ratios, at c=1 and c=16 (target: ≤ 0.3 ms added p50).

Starts a ``redis-server`` on a free loopback port (no persistence), then runs
``bench/run.py`` alternately without and with ``--redis`` on the same
scenarios (``ns_c1``, ``ns_c16``: non-stream, where a fixed per-request cost
shows most), each ``--repeat`` times, keeping the medians. Both sides run a
key policy (``--teams 1``: rpm/tpm/budget windows counted per request) and two
workers for the model (``--openai-workers 2``: the routing policy looks the
session's binding up per request), so the Redis side pays what a replica
pays: the rate-window lease (a script call when it runs low or old, in the
background), the binding read (one a second for a hot session), the token
charges after the answers (one script call per 50 ms). The Redis server's own
CPU is reported apart. On a shared machine other processes' load moves the
c=16 medians most: rerun when the memory side's p50 moves between rounds.

    .venv/bin/python bench/redis_stores.py                # 3 s runs, 2 rounds
    .venv/bin/python bench/redis_stores.py -d 5 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CLK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def start_redis(tmp: str) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--daemonize", "no", "--dir", tmp,
                             "--logfile", f"{tmp}/redis.log"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("redis-server did not start")
        time.sleep(0.01)


def run_once(name: str, a: argparse.Namespace, out: Path,
             redis_url: str | None, extra: tuple[str, ...] = ()) -> tuple[dict, int]:
    """Per scenario: gateway CPU per request, p50, requests, errors; and how
    often the gateway logged Redis down. ``extra``: more bench/run.py arguments."""
    target = out / f"{name}-{time.strftime('%H%M%S')}"
    argv = [sys.executable, str(HERE / "run.py"), "--scenarios", a.scenarios,
            "-d", str(a.duration), "--warmup", str(a.warmup), "--out", str(target),
            "--python", sys.executable,  # run.py serves app.cli from this checkout
            "--targets", "direct,poolgate", "--open-streams", "0",
            "--teams", "1", "--openai-workers", "2",
            "--repeat", "1"]  # one round: this runner repeats and interleaves itself
    if redis_url:
        argv += ["--redis", redis_url]
    argv += extra
    if a.no_pin:
        argv.append("--no-pin")
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: bench/run.py failed:\n{done.stderr[-2000:]}")
    results = json.loads((target / "results.json").read_text())["results"]
    log_path = target / "poolgate.log"
    # a call over server.redis_timeout (a loop starved by other load) marks Redis down for a
    # probe interval; the replica then counts locally, which is not what is being measured
    downs = log_path.read_text().count('"redis.down"') if log_path.exists() else 0
    per = {}
    for scenario, r in results.items():
        p = r["poolgate"]
        ok = p.get("ok_requests") or 0
        per[scenario] = {"cpu_ms": p["gateway_cpu_s"] * 1000 / ok if ok else float("nan"),
                         "p50_ms": (p.get("latency_ms") or {}).get("p50", float("nan")),
                         "requests": ok, "errors": p.get("errors") or 0}
    return per, downs


def median(runs: list[dict], scenario: str, field: str) -> float:
    return statistics.median(r[scenario][field] for r in runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="ns_c1,ns_c16")
    ap.add_argument("-d", "--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--out", help="results directory (default /tmp/poolgate-bench/redis-<stamp>)")
    a = ap.parse_args(argv)
    out = Path(a.out or f"/tmp/poolgate-bench/redis-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="poolgate-bench-redis-")
    proc, url = start_redis(tmp)
    memory: list[dict] = []
    shared: list[dict] = []
    redis_cpu = 0.0
    redis_requests = 0
    downs: list[int] = []
    try:
        for i in range(a.repeat):  # alternate, so drift on a shared machine hits both sides
            memory.append(run_once(f"memory{i}", a, out, None)[0])
            before = process_cpu_s(proc.pid)
            per, down = run_once(f"redis{i}", a, out, url)
            shared.append(per)
            downs.append(down)
            redis_cpu += process_cpu_s(proc.pid) - before
            redis_requests += sum(s["requests"] for s in shared[-1].values())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [
        f"poolgate with the Redis stores vs memory, {time.strftime('%Y-%m-%d %H:%M')}: "
        f"{a.duration} s per run, median of {a.repeat}; both with a key policy and two workers "
        "per model.", "",
        "| scenario | gw CPU ms/req memory | redis | ×memory | p50 ms memory | redis | "
        "added p50 ms (median of the rounds' differences) |", "|---|---:|---:|---:|---:|---:|---:|"]
    summary = {}
    for scenario in a.scenarios.split(","):
        cm, cr = median(memory, scenario, "cpu_ms"), median(shared, scenario, "cpu_ms")
        pm, pr = median(memory, scenario, "p50_ms"), median(shared, scenario, "p50_ms")
        summary[scenario] = {"cpu_ms_memory": cm, "cpu_ms_redis": cr, "cpu_ratio": cr / cm,
                             "p50_ms_memory": pm, "p50_ms_redis": pr, "added_p50_ms": pr - pm}
        # round by round (each Redis run right after its memory run): drift cancels better
        paired = statistics.median(r[scenario]["p50_ms"] - m[scenario]["p50_ms"]
                                   for m, r in zip(memory, shared))
        summary[scenario]["added_p50_ms_paired"] = paired
        lines.append(f"| `{scenario}` | {cm:.3f} | {cr:.3f} | **{cr / cm:.2f}** | {pm:.2f} | "
                     f"{pr:.2f} | **{pr - pm:+.2f}** ({paired:+.2f}) |")
    errors = sum(s["errors"] for run in memory + shared for s in run.values())
    per_req = redis_cpu * 1000 / redis_requests if redis_requests else float("nan")
    lines += ["", f"redis-server CPU: {per_req:.3f} ms per request (measured windows and "
              f"warm-ups, over the measured requests); failed requests: {errors}; Redis marked "
              f"down (a call over `redis_timeout`, local counting until the next probe) "
              f"per Redis run: {downs}" + (" — rerun on a quieter machine" if any(downs) else "")
              + "."]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"summary": summary, "memory": memory,
                                                  "redis": shared, "redis_down": downs}, indent=1))
    print(text)
    print(f"results in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
