#!/usr/bin/env python3
"""What teams cost on the request path: poolgate's CPU per request with a key
policy and the usage ledger on, against a plain API key without them, and with
10,000 keys configured against one.

Runs ``bench/run.py`` three times on the same scenarios (by default
``ns_c16``, the non-stream load, where a fixed per-request cost shows most):

* ``off``: one plain ``api_keys`` entry, no state directory (the ledger then
  lives in memory: it is always on, so ``off`` measures the gateway as it
  was configured before teams, not a build without the ledger);
* ``policy``: ``[server.keys.bench]`` with model globs, ``max_in_flight``,
  ``rpm``, ``tpm`` and day/month budgets (limits far above the load), and the
  ledger in a SQLite file under ``state_dir``;
* ``10k``: the same plus 9,999 more policy keys.

and prints the gateway CPU ms per request of each and the two ratios
(target: policy/off ≤ 1.05, 10k/policy ≈ 1.00). CPU per request is noisy at
a few percent between identical runs on a shared machine: ``--repeat`` runs
each configuration several times and keeps the median.

    .venv/bin/python bench/teams.py                 # 2 s runs, once each
    .venv/bin/python bench/teams.py -d 5 --repeat 3
    .venv/bin/python bench/teams.py --micro         # only the in-process part below

End-to-end numbers on a loaded shared machine move by ±10 % run to run, more
than the effect measured, so ``--micro`` also times, in this process, exactly
what teams add to a request — finding the key among N, the policy check and
window count, the charge when the answer ends, the ledger row (its append,
and the writer thread's insert per row) — with 1 key and with 10,000.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS = {"off": 0, "policy": 1, "10k": 10_000}


def cpu_per_request(results: dict) -> float:
    """Gateway CPU ms per completed request, over every scenario of one run."""
    cpu = sum(r["poolgate"].get("gateway_cpu_s", 0.0) for r in results.values())
    ok = sum(r["poolgate"].get("ok_requests", 0) for r in results.values())
    if not ok:
        raise RuntimeError("no request completed through poolgate")
    return cpu * 1000 / ok


def run_once(name: str, keys: int, a: argparse.Namespace, out: Path) -> float:
    target = out / f"{name}-{time.strftime('%H%M%S')}"
    argv = [sys.executable, str(HERE / "run.py"), "--scenarios", a.scenarios,
            "-d", str(a.duration), "--warmup", str(a.warmup), "--out", str(target),
            # the checkout's code, not an installed console script's
            "--poolgate", str(target / "no-such-script"), "--python", sys.executable,
            "--repeat", "1"]  # one round: this runner repeats and interleaves itself
    if keys:
        argv += ["--teams", str(keys)]
    if a.no_pin:
        argv.append("--no-pin")
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: bench/run.py failed:\n{done.stderr[-2000:]}")
    return cpu_per_request(json.loads((target / "results.json").read_text())["results"])


def _per_call_us(fn, n: int) -> float:
    start = time.process_time()
    fn(n)
    return (time.process_time() - start) / n * 1e6


def micro(keys: int, n: int = 200_000) -> dict[str, float]:
    """µs of CPU per request for each piece teams add, with ``keys`` policy keys."""
    sys.path.insert(0, str(ROOT))
    from auth.keys import KeyRing
    from auth.limits import KeyPolicy, MemoryLimits
    from app.teams import Teams
    from sessions.ledger import StateDB, UsageLedger

    secrets = {f"k{i}": f"sk-micro-{i}-{os.urandom(6).hex()}" for i in range(keys)}
    name, secret = f"k{keys - 1}", secrets[f"k{keys - 1}"]
    ring = KeyRing(secrets)
    huge = 10 ** 15
    teams = Teams([KeyPolicy(k, models=("mock-*",), max_in_flight=huge, rpm=huge, tpm=huge,
                             budget_day=huge, budget_month=huge) for k in secrets],
                  MemoryLimits())

    def identify(count: int) -> None:
        for _ in range(count):
            ring.identify(secret)

    def admit(count: int) -> None:
        async def loop() -> None:
            for _ in range(count):
                await teams.admit(name, "mock-gpt")
        asyncio.run(loop())

    def charge(count: int) -> None:
        for _ in range(count):
            teams.charge(name, 32)

    with tempfile.TemporaryDirectory() as state:
        db = StateDB(state)
        ledger = UsageLedger(db, flush_interval=3600)  # flushed by hand, timed apart

        def add(count: int) -> None:
            for _ in range(count):
                ledger.add(time.time(), name, "mock-gpt", "w", 16, 16, 0, 200, None)

        def flush(count: int) -> None:
            ledger.flush()

        result = {"identify": _per_call_us(identify, n), "admit": _per_call_us(admit, n),
                  "charge": _per_call_us(charge, n), "ledger_add": _per_call_us(add, n // 4)}
        result["ledger_write"] = _per_call_us(flush, n // 4)  # the rows add() queued
        ledger.close()
        db.close()
    result["total"] = sum(result.values())
    return result


def micro_report(n: int) -> tuple[str, float]:
    """The table, and the total µs per request with one key."""
    one, many = micro(1, n), micro(10_000, n)
    rows = "".join(f"| {k} | {one[k]:.2f} | {many[k]:.2f} |\n" for k in one)
    return ("In-process CPU µs per request of what teams add (1 key vs 10,000 keys):\n\n"
            "| piece | 1 key | 10,000 keys |\n|---|---:|---:|\n" + rows
            + f"\n10,000 keys vs 1: **{many['total'] / one['total']:.3f}×**\n"), one["total"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="ns_c16")
    ap.add_argument("-d", "--duration", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--micro", action="store_true", help="only the in-process timing")
    ap.add_argument("--out", default=f"/tmp/poolgate-bench/teams-{time.strftime('%Y%m%d-%H%M%S')}")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    micro_text, added_us = micro_report(200_000)
    if a.micro:
        print(micro_text)
        return 0
    samples: dict[str, list[float]] = {name: [] for name in CONFIGS}
    order = list(CONFIGS.items())
    for round_ in range(a.repeat):
        # interleaved, every other round reversed: drift in the machine's load hits all alike
        for name, keys in (order if round_ % 2 == 0 else order[::-1]):
            samples[name].append(run_once(name, keys, a, out))
            print(f"{name:7s} {samples[name][-1]:.3f} ms CPU/request", file=sys.stderr)
    ms = {name: statistics.median(v) for name, v in samples.items()}
    text = (f"poolgate teams bench, {time.strftime('%Y-%m-%d %H:%M')}: scenarios {a.scenarios}, "
            f"{a.duration} s per run, median of {a.repeat}\n\n"
            "| configuration | gateway CPU ms/request |\n|---|---:|\n"
            + "".join(f"| {name} | {ms[name]:.3f} |\n" for name in CONFIGS)
            + f"\npolicy + ledger vs off: **{ms['policy'] / ms['off']:.3f}×**; "
            f"10,000 keys vs 1: **{ms['10k'] / ms['policy']:.3f}×**\n\n" + micro_text
            + f"\nAdded to the `off` gateway's {ms['off'] * 1000:.0f} µs per request: "
            f"**{1 + added_us / (ms['off'] * 1000):.3f}×**\n")
    (out / "report.md").write_text(text)
    (out / "samples.json").write_text(json.dumps(samples, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
