#!/usr/bin/env python3
"""Benchmark poolgate against a bare upstream and against the floor: how much does the gateway add?

Starts the demo upstream (``python -m app.demo_upstream``), the floor
(``bench/floor.py``: our bare Starlette + aiohttp pass-through) and ``poolgate
serve`` (this checkout's ``app.cli``) with a generated config whose remote
workers point at the upstream, then runs each scenario with ``loadgen.py``
straight at the upstream ("direct"), through the floor and through poolgate, and
prints a markdown table: requests per gateway CPU-second, CPU per request, the
poolgate / floor ratios against issue 14's targets (``report.py``: met / missed),
added median latency and TTFT, and the foreign CPU load during each row. Then
``open_streams.py`` holds ``--open-streams`` slow streams open in a fresh floor and
poolgate (RSS per open stream, CPU while they tick, TTFT of new requests).

CPU layout with two or more cores and ``taskset``: upstream and load generator
on core 0, the gateways on core 1 (``--cpus UP,LOAD,GW`` to change, ``--no-pin`` to
disable). Everything binds 127.0.0.1 on free ports; the processes started here
are stopped by PID (their own process groups) at the end, also on errors and
Ctrl-C. Results go to ``--out`` (default /tmp/poolgate-bench/<stamp>/).

    .venv/bin/python bench/run.py                 # every scenario, 3 rounds of 5 s, 9,900 open streams
    .venv/bin/python bench/run.py --quick         # 1 round of 2 s each, 1,000 open streams
    .venv/bin/python bench/run.py --quiet         # and a row with log_level = "warning" per scenario
    .venv/bin/python bench/run.py --scenarios ns_c16,st_c16_d5 -d 10 --open-streams 0
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from configs import API_KEY, SLOW_MODEL, config_toml, teams_config  # noqa: E402,F401 (re-exported)
from machine import ForeignLoad  # noqa: E402
from report import (HEAD, LEGEND, OPEN_STREAMS_KIB, OPEN_STREAMS_TTFT_MS, fmt,  # noqa: E402
                    open_streams_table, pooled, row)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = ROOT / ".venv" / "bin"
CLK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Scenario:
    api: str
    mode: str
    c: int
    model: str
    max_tokens: int
    what: str


SCENARIOS = {
    "ns_c1": Scenario("openai", "nonstream", 1, "mock-gpt", 16, "chat, non-stream, 1 connection"),
    "ns_c16": Scenario("openai", "nonstream", 16, "mock-gpt", 16, "chat, non-stream"),
    "st_c16": Scenario("openai", "stream", 16, "mock-gpt", 64, "chat, SSE, 64 chunks unpaced"),
    "st_c16_d5": Scenario("openai", "stream", 16, "mock-gpt-d5", 64, "chat, SSE, 64 chunks 5 ms apart"),
    "msg_c16": Scenario("anthropic", "nonstream", 16, "mock-claude", 16, "messages, non-stream"),
    "msgst_c16": Scenario("anthropic", "stream", 16, "mock-claude", 64, "messages, SSE, 64 chunks"),
    "msg_xl_c16": Scenario("anthropic", "nonstream", 16, "mock-gpt", 16,
                           "messages → OpenAI upstream, non-stream"),
    "msgst_xl_c16": Scenario("anthropic", "stream", 16, "mock-gpt", 64,
                             "messages → OpenAI upstream, SSE, 64 chunks"),
    # The upstream speaks no Responses API: "direct" is the same load as chat
    # completions, so the ratio is poolgate's Responses stream vs a direct chat stream.
    "resst_c16": Scenario("responses", "stream", 16, "mock-gpt", 64,
                          "responses → OpenAI upstream, SSE, 64 chunks"),
    # Gemini clients: likewise "direct" is chat completions at the upstream
    "gem_xl_c16": Scenario("gemini", "nonstream", 16, "mock-gpt", 16,
                           "gemini → OpenAI upstream, non-stream"),
    "gemst_xl_c16": Scenario("gemini", "stream", 16, "mock-gpt", 64,
                             "gemini → OpenAI upstream, SSE, 64 chunks"),
}


def log(*parts: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ------------------------------------------------------------------ processes
def raise_nofile() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (run in every child: open streams need
    two sockets each in a gateway)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Proc:
    """A child in its own session (pgid == pid), so stopping it stops only what it started."""

    def __init__(self, name: str, argv: list[str], log_path: Path, cpu: str | None,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        pin = ["taskset", "-c", cpu] if cpu is not None else []
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(pin + argv, cwd=ROOT, stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      preexec_fn=raise_nofile,
                                      env={**os.environ, **env} if env else None)
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu_s(self) -> float:
        """CPU seconds of the process and its live descendants."""
        total, todo = 0.0, [self.pid]
        while todo:
            pid = todo.pop()
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / CLK
                for task in Path(f"/proc/{pid}/task").iterdir():
                    todo += [int(p) for p in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
        return total

    def stop(self) -> None:
        if self.alive():
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.popen.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._log.close()


def wait_ready(proc: Proc, check, timeout: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}; see {proc.log_path}")
        try:
            if check():
                return time.perf_counter() - start
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{proc.name} not ready after {timeout:.0f} s; see {proc.log_path}")


# ------------------------------------------------------------------ measuring
def run_loadgen(py: str, url: str, sc: Scenario, duration: float, cpu: str | None,
                out: Path, extra: tuple[str, ...] = ()) -> dict:
    argv = ([] if cpu is None else ["taskset", "-c", cpu]) + [
        py, str(HERE / "loadgen.py"), "--url", url, "--api", sc.api, "--mode", sc.mode,
        "-c", str(sc.c), "-d", str(duration), "--model", sc.model,
        "--max-tokens", str(sc.max_tokens), "--api-key", API_KEY, "--timeout", "30",
        "--out", str(out), *extra]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=duration + 90)
    if not out.exists():
        return {"ok": False, "error": done.stderr.strip()[-800:]}
    return json.loads(out.read_text())


def upstream_requests(upstream_url: str) -> int:
    """Chat and messages requests the upstream saw (not the gateways' health probes)."""
    stats = json.loads(http("GET", upstream_url + "/stats")[1])
    return sum(stats[k] for k in ("chat", "chat_stream", "messages", "messages_stream"))


def measure(name: str, sc: Scenario, target: str, url: str, args, ctx: dict,
            round_no: int = 0) -> dict:
    """One load run of ``sc`` at ``target`` ("direct", "floor", "poolgate", "quiet" or
    "granian")."""
    out_dir: Path = ctx["out"]
    if round_no:
        name = f"{name}-r{round_no + 1}"
    if target in ("direct", "floor") and sc.api in ("responses", "gemini"):
        sc = replace(sc, api="openai")  # the upstream's nearest equivalent
    if args.warmup > 0:
        run_loadgen(ctx["py"], url, sc, args.warmup, ctx["cpu_load"], out_dir / f"warm-{name}-{target}.json")
    gw: Proc | None = ctx.get(target)
    up: Proc = ctx["upstream"]
    seen0 = upstream_requests(ctx["upstream_url"])
    up0, gw0 = up.cpu_s(), gw.cpu_s() if gw else 0.0
    foreign = ForeignLoad(lambda: (p.cpu_s() for p in ctx["procs"] if p.alive()))
    foreign.start()
    res = run_loadgen(ctx["py"], url, sc, args.duration, ctx["cpu_load"], out_dir / f"{name}-{target}.json")
    res["foreign_load"] = foreign.stop()
    res["upstream_cpu_s"] = round(up.cpu_s() - up0, 3)
    res["upstream_seen"] = upstream_requests(ctx["upstream_url"]) - seen0
    res["load_avg_1m"] = round(os.getloadavg()[0], 2)
    if gw:
        res["gateway_cpu_s"] = round(gw.cpu_s() - gw0, 3)
    ok = res.get("ok_requests", 0)
    log(f"{name:13s} {target:8s} rps={res.get('rps')} p50={(res.get('latency_ms') or {}).get('p50')} "
        f"chunks/s={res.get('chunks_per_s', '-')} errors={res.get('errors')} "
        f"mismatch={res.get('chunk_mismatch')} upstream_seen={res['upstream_seen']} (ok {ok}) "
        f"gw_cpu_s={res.get('gateway_cpu_s', '-')} foreign={res['foreign_load']}")
    return res


# ------------------------------------------------------------------ report
def report(results: dict, meta: dict, open_streams: dict | None = None) -> str:
    lines = [
        f"poolgate bench, {meta['when']}, commit {meta['commit']}: {meta['duration_s']} s per run, "
        f"pinning {meta['pinning']}, {meta['nproc']} CPUs, poolgate ready in "
        f"{fmt(meta['startup_s'], 2)} s.", "", LEGEND, "", HEAD]
    for name, r in results.items():
        sc = SCENARIOS[name]
        lines.append(row(name, sc.what, sc.mode == "stream", sc.c, r))
        if "quiet" in r:  # --quiet: the same against poolgate with no access log
            lines.append(row(name, sc.what + ', log_level "warning"', sc.mode == "stream", sc.c,
                             {**r, "poolgate": r["quiet"]}))
        if "granian" in r:  # --granian: the same against poolgate on granian
            lines.append(row(name, sc.what + ', server.http "granian"', sc.mode == "stream", sc.c,
                             {**r, "poolgate": r["granian"]}))
    spread = [f"`{name}` {', '.join(fmt(x, 2) for x in r['round_ratios'])}"
              for name, r in results.items()
              if len(r.get("round_ratios") or ()) > 1 and None not in r["round_ratios"]]
    spread += [f"`{name}` on granian {', '.join(fmt(x, 2) for x in r['granian_round_ratios'])}"
               for name, r in results.items()
               if len(r.get("granian_round_ratios") or ()) > 1
               and None not in r["granian_round_ratios"]]
    if spread:
        lines += ["", f"Each row pools {meta['repeat']} interleaved rounds (CPU and requests "
                  "summed). The ratio its target is judged on, round by round: "
                  + "; ".join(spread) + "."]
    if open_streams:
        n = max(r["n"] for r in open_streams.values())
        lines += ["", f"{n:,} slow streams open at once (bench/open_streams.py; target for poolgate: "
                  f"≤ {OPEN_STREAMS_KIB:g} KiB per open stream and TTFT p50 while open ≤ the "
                  f"floor's + {OPEN_STREAMS_TTFT_MS:g} ms):", "", open_streams_table(open_streams)]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help=f"comma-separated, of: {', '.join(SCENARIOS)}")
    ap.add_argument("-d", "--duration", type=float, default=5.0, help="seconds per run (≤ 120)")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds before each run (0: none)")
    ap.add_argument("--quick", action="store_true", help="-d 2 --warmup 0.5")
    ap.add_argument("--repeat", type=int, default=None, metavar="N",
                    help="N interleaved rounds per scenario (default 3; --quick: 1), pooled in "
                         "the table (CPU and requests summed), each round's ratio listed below it")
    ap.add_argument("--poolgate", default="",
                    help="a poolgate executable (default: python -m app.cli from this checkout)")
    ap.add_argument("--python", default=str(VENV / "python") if (VENV / "python").exists()
                    else sys.executable, help="python for the upstream and the load generator")
    ap.add_argument("--log-level", default=None,
                    help="poolgate's server.log_level (default: none set, so info: the access log on)")
    ap.add_argument("--quiet", action="store_true",
                    help="also a poolgate with log_level = \"warning\" (no access log): an extra "
                         "row per scenario")
    ap.add_argument("--granian", action="store_true",
                    help="also a poolgate with server.http = \"granian\" (else the same config): "
                         "an extra row per scenario, measured in the same rounds")
    ap.add_argument("--cpus", default="0,0,1", help="cores for upstream,loadgen,poolgate")
    ap.add_argument("--no-pin", action="store_true", help="do not use taskset")
    ap.add_argument("--out", help="results directory (default /tmp/poolgate-bench/<stamp>)")
    ap.add_argument("--targets", default="direct,floor,poolgate",
                    help="gateways per scenario, of: direct, floor, poolgate (direct and poolgate always)")
    ap.add_argument("--open-streams", type=int, default=9900, metavar="N",
                    help="then hold N slow streams open in a fresh floor and poolgate "
                         "(bench/open_streams.py; --quick: 1000; 0: skip)")
    ap.add_argument("--hold", type=float, default=10.0,
                    help="seconds the open streams' CPU is measured (--quick: 5)")
    ap.add_argument("--teams", type=int, default=0, metavar="N",
                    help="a key policy and the usage ledger on, with N keys configured "
                         "(bench/teams.py compares; 0: one plain api key, no state dir)")
    ap.add_argument("--redis", metavar="URL",
                    help="server.redis_url: the shared stores in this Redis (bench/redis_stores.py)")
    ap.add_argument("--database", metavar="URL",
                    help="server.database_url: keys and the ledger in this database "
                         "(bench/database.py; default with --teams: SQLite in the state dir)")
    ap.add_argument("--openai-workers", type=int, default=1, metavar="N",
                    help="N remote workers for the OpenAI models (>1: routing runs per request)")
    a = ap.parse_args(argv)
    if a.quick:
        a.duration, a.warmup = 2.0, 0.5
        a.open_streams = min(a.open_streams, 1000)
        a.hold = min(a.hold, 5.0)
    a.targets = [t for t in ("direct", "floor", "poolgate")
                 if t in a.targets.split(",") or t != "floor"] + (["quiet"] if a.quiet else []) + (["granian"] if a.granian else [])
    if a.repeat is None:
        a.repeat = 1 if a.quick else 3
    unknown = [s for s in a.scenarios.split(",") if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenarios: {', '.join(unknown)}")
    if not 0 < a.duration <= 120:
        ap.error("--duration must be in (0, 120]")
    if not 1 <= a.repeat <= 10:
        ap.error("--repeat must be in [1, 10]")
    return a


def cpu_plan(a: argparse.Namespace) -> tuple[dict[str, str | None], str]:
    cpus = a.cpus.split(",")
    if a.no_pin or not shutil.which("taskset") or (os.cpu_count() or 1) < 2 or len(cpus) != 3:
        return dict.fromkeys(("upstream", "load", "gateway")), "off"
    plan = dict(zip(("upstream", "load", "gateway"), cpus))
    return plan, f"upstream+loadgen on {plan['upstream']}/{plan['load']}, poolgate on {plan['gateway']}"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def poolgate_argv(a: argparse.Namespace) -> list[str]:
    """``python -m app.cli`` from this checkout (cwd), so a worktree benches its own code
    (the venv's console script may be installed editable from another checkout);
    ``--poolgate PATH`` runs that executable instead."""
    if a.poolgate:
        return [a.poolgate]
    return [a.python, "-m", "app.cli"]


def git_commit() -> str:
    """The checkout's commit, ``+dirty`` when it has uncommitted changes."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev or "unknown") + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(a.out or f"/tmp/poolgate-bench/{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    cpus, pinning = cpu_plan(a)
    procs: list[Proc] = []
    # Ctrl-C and SIGTERM both end in the finally below, which stops our children
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        up_port, gw_port = free_port(), free_port()
        upstream_url = f"http://127.0.0.1:{up_port}"
        upstream = Proc("demo upstream", [a.python, "-m", "app.demo_upstream", "--port", str(up_port)],
                        out / "upstream.log", cpus["upstream"])
        procs.append(upstream)
        wait_ready(upstream, lambda: http("GET", upstream_url + "/health")[0] == 200, 30)
        probe = json.dumps({"model": "mock-gpt", "max_tokens": 4,
                            "messages": [{"role": "user", "content": "ready?"}]}).encode()
        ctx = {"py": a.python, "out": out, "upstream": upstream,
               "upstream_url": upstream_url, "cpu_load": cpus["load"], "procs": procs}
        urls = {"direct": upstream_url}
        # as users run it: the default log level (the access log on), an API key, the
        # usage ledger in state_dir; --quiet: the same with log_level = "warning" as well;
        # --granian: the same on granian (server.http) as well
        for target, level, server_http in (("poolgate", a.log_level, None),
                                           ("quiet", "warning", None),
                                           ("granian", a.log_level, "granian")):
            if target not in a.targets:
                continue
            config = out / f"{target}.toml"
            teams, env = (teams_config(a.teams, out / f"state-{target}") if a.teams > 0
                          else (None, None))
            config.write_text(config_toml(gw_port, up_port, level, teams, a.redis,
                                          a.openai_workers, state_dir=out / f"state-{target}",
                                          database_url=a.database, http=server_http))
            gateway = Proc(target, [*poolgate_argv(a), "serve", "--config", str(config), "--host",
                                    "127.0.0.1", "--port", str(gw_port)], out / f"{target}.log",
                           cpus["gateway"], env=env)
            procs.append(gateway)
            url = f"http://127.0.0.1:{gw_port}"
            ready = wait_ready(gateway, lambda: http("POST", url + "/v1/chat/completions",
                                                     probe)[0] == 200, 120)
            if target == "poolgate":
                startup = ready
            log(f"{target} ready in {ready:.2f} s on {url}; upstream {upstream_url}; {pinning}")
            ctx[target], urls[target] = gateway, url
            gw_port = free_port()
        if "floor" in a.targets:
            floor_url = f"http://127.0.0.1:{(floor_port := free_port())}"
            ctx["floor"] = floor = Proc("floor", [a.python, str(HERE / "floor.py"), "--upstream",
                                                  upstream_url, "--port", str(floor_port)],
                                        out / "floor.log", cpus["gateway"])
            procs.append(floor)
            wait_ready(floor, lambda: http("POST", floor_url + "/v1/chat/completions", probe)[0] == 200, 60)
            urls["floor"] = floor_url
        results = {}
        for name in a.scenarios.split(","):
            sc = SCENARIOS[name]
            # rounds interleaved (direct, floor, poolgate, direct, ...): a noisy spell hits both
            rounds = [{t: measure(name, sc, t, urls[t], a, ctx, i) for t in a.targets}
                      for i in range(a.repeat)]
            results[name] = pooled(name, rounds)
            for proc in procs:
                if not proc.alive():
                    raise RuntimeError(f"{proc.name} died during {name}; see {proc.log_path}")
        open_streams = None
        if a.open_streams:
            import open_streams as holder    # lazily: it imports this module
            opts = holder.parse_args(["-n", str(a.open_streams), "--hold", str(a.hold),
                                      "--python", a.python, "--cpus", a.cpus, "--out", str(out)]
                                     + (["--no-pin"] if a.no_pin else [])
                                     + (["--poolgate", a.poolgate] if a.poolgate else []))
            opts.out_dir = out
            os_ctx = {"out": out, "upstream": upstream, "upstream_url": upstream_url,
                      "upstream_port": up_port, "gw_cpu": cpus["gateway"]}
            for proc in procs[1:]:
                proc.stop()           # the bench's gateways: the open streams start fresh ones
            open_streams = holder.run(opts, os_ctx, cpus["load"])
        meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "duration_s": a.duration,
                "repeat": a.repeat,
                "pinning": pinning, "nproc": os.cpu_count(), "startup_s": startup,
                "commit": git_commit(), "targets": a.targets,
                "scenarios": {n: asdict(SCENARIOS[n]) for n in results}}
        text = report(results, meta, open_streams)
        (out / "results.json").write_text(json.dumps({"meta": meta, "results": results,
                                                      "open_streams": open_streams}, indent=1))
        (out / "report.md").write_text(text)
        print(text)
        log(f"results in {out}")
        return 0
    except (RuntimeError, KeyboardInterrupt) as exc:
        log(f"bench stopped: {exc or type(exc).__name__}")
        return 1
    finally:
        for proc in reversed(procs):
            proc.stop()


if __name__ == "__main__":
    sys.exit(main())
