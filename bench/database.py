#!/usr/bin/env python3
"""What the shared database costs on the request path: poolgate's CPU per
request and median latency with ``server.database_url`` on PostgreSQL,
against the SQLite file in ``state_dir`` (the default), at c=1 and c=16.
Target: the ledger stays off the request path, at most 0.05 ms added p50.

Starts a throwaway PostgreSQL cluster on a free loopback port (as the tests
do: ``initdb`` as the ``postgres`` user when run as root), then runs
``bench/run.py`` alternately on SQLite and on PostgreSQL on the same
scenarios (``ns_c1``, ``ns_c16``: non-stream, where a fixed per-request cost
shows most), each ``--repeat`` times, keeping the medians. Both sides run a
key policy with budgets (``--teams 1``): every answer is a ledger row. The
PostgreSQL server's own CPU is reported apart; at the end, the rows in the
database are counted against the requests answered (none may be missing).

    .venv/bin/python bench/database.py                # 3 s runs, 2 rounds
    .venv/bin/python bench/database.py -d 5 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from redis_stores import CLK, median, run_once  # noqa: E402


def _cluster_cpu(pid: int) -> float:
    """CPU seconds of the postmaster and of its children it reaped (the backends
    of connections that closed: the gateway's, once it stopped)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / CLK


def main(argv: list[str] | None = None) -> int:
    from tests.support.postgres_server import PostgresServer

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="ns_c1,ns_c16")
    ap.add_argument("-d", "--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--out", help="results directory (default /tmp/poolgate-bench/db-<stamp>)")
    a = ap.parse_args(argv)
    out = Path(a.out or f"/tmp/poolgate-bench/db-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    server = PostgresServer().start()
    sqlite: list[dict] = []
    shared: list[dict] = []
    pg_cpu = 0.0
    answered = 0
    try:
        for i in range(a.repeat):  # alternate, so drift on a shared machine hits both sides
            sqlite.append(run_once(f"sqlite{i}", a, out, None)[0])
            url = server.create_database(f"bench{i}")
            before = _cluster_cpu(server.proc.pid)
            per, _ = run_once(f"postgres{i}", a, out, None, ("--database", url))
            pg_cpu += _cluster_cpu(server.proc.pid) - before
            shared.append(per)
            answered += sum(s["requests"] + s["errors"] for s in per.values())
        import psycopg

        stored = 0
        for i in range(a.repeat):
            with psycopg.connect(server.url(f"bench{i}")) as conn:
                stored += conn.execute("SELECT COUNT(*) FROM usage").fetchone()[0]
    finally:
        server.close()
    lines = [
        f"poolgate on PostgreSQL vs SQLite, {time.strftime('%Y-%m-%d %H:%M')}: {a.duration} s "
        f"per run, median of {a.repeat}; both with a key policy with budgets (a ledger row per "
        "answer).", "",
        "| scenario | gw CPU ms/req SQLite | PostgreSQL | ×SQLite | p50 ms SQLite | PostgreSQL | "
        "added p50 ms (median of the rounds' differences) |", "|---|---:|---:|---:|---:|---:|---:|"]
    summary = {}
    for scenario in a.scenarios.split(","):
        cs, cp = median(sqlite, scenario, "cpu_ms"), median(shared, scenario, "cpu_ms")
        ps, pp = median(sqlite, scenario, "p50_ms"), median(shared, scenario, "p50_ms")
        paired = statistics.median(r[scenario]["p50_ms"] - m[scenario]["p50_ms"]
                                   for m, r in zip(sqlite, shared))
        summary[scenario] = {"cpu_ms_sqlite": cs, "cpu_ms_postgres": cp, "cpu_ratio": cp / cs,
                             "p50_ms_sqlite": ps, "p50_ms_postgres": pp, "added_p50_ms": pp - ps,
                             "added_p50_ms_paired": paired}
        lines.append(f"| `{scenario}` | {cs:.3f} | {cp:.3f} | **{cp / cs:.2f}** | {ps:.2f} | "
                     f"{pp:.2f} | **{pp - ps:+.3f}** ({paired:+.3f}) |")
    requests = sum(s["requests"] for run in shared for s in run.values())
    per_req = pg_cpu * 1000 / requests if requests else float("nan")
    lines += ["", f"PostgreSQL CPU (postmaster and the gateway's backend): {per_req:.3f} ms per request; "
              f"ledger rows in PostgreSQL: {stored} for {answered} requests measured "
              "(warm-ups add rows: at least as many rows as requests)."]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"summary": summary, "sqlite": sqlite,
                                                  "postgres": shared}, indent=1))
    print(text)
    print(f"results in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
