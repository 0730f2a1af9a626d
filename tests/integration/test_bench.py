"""bench/: the load generator against the demo upstream, and the config the runner writes."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.demo_upstream import DemoUpstream, start_demo_upstream
from app.settings import load_settings

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def upstream() -> Iterator[DemoUpstream]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(start_demo_upstream(), loop).result(5)
    yield server
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def _load(name: str, file: str) -> Any:
    """A module of bench/ (they import each other as top-level modules)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module                     # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def loadgen(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(BENCH / "loadgen.py"), *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(("api", "mode", "model", "max_tokens"), [
    ("openai", "nonstream", "mock-gpt", 16),
    ("openai", "stream", "mock-gpt-d1", 64),
    ("anthropic", "nonstream", "mock-claude", 16),
    ("anthropic", "stream", "mock-claude", 64),
])
def test_loadgen_counts_requests_and_chunks(upstream: DemoUpstream, api: str, mode: str,
                                            model: str, max_tokens: int) -> None:
    before = upstream.stats["requests"]
    r = loadgen("--url", upstream.anthropic_url, "--api", api, "--mode", mode, "--model", model,
                "--max-tokens", str(max_tokens), "-c", "4", "-n", "40", "-d", "20")
    assert r["ok_requests"] == r["requests"] == 40 and r["errors"] == 0
    assert r["chunk_mismatch"] == 0 and r["chunks_total"] == 40 * max_tokens
    assert upstream.stats["requests"] - before == 40
    assert 0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p99"]
    if mode == "stream":
        assert 0 < r["ttft_ms"]["p50"] <= r["latency_ms"]["p50"]


def test_loadgen_reports_failures(upstream: DemoUpstream) -> None:
    done = subprocess.run([sys.executable, str(BENCH / "loadgen.py"), "--url",
                           upstream.anthropic_url + "/nowhere", "-c", "2", "-n", "6"],
                          capture_output=True, text=True, timeout=60)
    r = json.loads(done.stdout)
    assert done.returncode == 1 and not r["ok"]
    assert r["error_detail"] == {"status_404": 6}


def test_runner_config_is_accepted_by_the_gateway_settings(tmp_path: Path) -> None:
    run = _load("bench_run", "run.py")
    path = tmp_path / "poolgate.toml"
    path.write_text(run.config_toml(18000, 18001, "warning"))
    settings = load_settings(str(path), {})
    assert settings.server.plain_api_keys() == {"bench": run.API_KEY}
    assert {w.dialect: (w.url, w.models) for w in settings.workers} == {
        "openai": ("http://127.0.0.1:18001/v1", ("mock-gpt", "mock-gpt-d5", run.SLOW_MODEL)),
        "anthropic": ("http://127.0.0.1:18001", ("mock-claude",))}
    assert set(run.SCENARIOS) >= {"ns_c16", "st_c16_d5", "msg_c16", "msgst_c16", "msg_xl_c16"}
    # --teams N: a full key policy and the ledger, among N keys
    teams, env = run.teams_config(3, tmp_path / "state")
    path.write_text(run.config_toml(18000, 18001, "warning", teams))
    settings = load_settings(str(path), env)
    keys = settings.server.keys
    assert list(keys) == ["bench", "k1", "k2"] and not settings.server.api_keys
    assert keys["bench"].secret.get_secret_value() == run.API_KEY
    assert keys["bench"].models == ("mock-*",) and keys["bench"].budget_tokens.day
    assert settings.server.state_dir == str(tmp_path / "state")
    # --database URL (bench/database.py): the ledger and keys in that database
    url = "postgresql://postgres@127.0.0.1:5432/bench0"
    path.write_text(run.config_toml(18000, 18001, "warning", teams, database_url=url))
    assert load_settings(str(path), env).server.database_url.get_secret_value() == url


def test_runner_benches_the_default_configuration(tmp_path: Path) -> None:
    """bench/run.py runs poolgate as users do: the default log level (the access
    log on), an API key, the ledger in state_dir; --quiet adds log_level warning."""
    run = _load("bench_run", "run.py")
    a = run.parse_args([])
    assert a.log_level is None and a.targets == ["direct", "floor", "poolgate"] and a.repeat == 3
    path = tmp_path / "poolgate.toml"
    path.write_text(run.config_toml(18000, 18001, a.log_level, state_dir=tmp_path / "state"))
    server = load_settings(str(path), {}).server
    assert server.log_level == "info" and server.state_dir == str(tmp_path / "state")
    assert server.plain_api_keys() == {"bench": run.API_KEY}
    quiet = run.parse_args(["--quiet", "--quick"])
    assert quiet.targets[-1] == "quiet" and quiet.repeat == 1
    script = (BENCH / "serve_for_shared_bench.sh").read_text()
    assert "state_dir" in script and 'log_level = "warning"\n' not in script


def test_runner_benches_granian_beside_uvicorn(tmp_path: Path) -> None:
    """bench/run.py --granian: a second poolgate, the same config on server.http granian."""
    run = _load("bench_run", "run.py")
    a = run.parse_args(["--granian", "--quick"])
    assert a.targets == ["direct", "floor", "poolgate", "granian"]
    path = tmp_path / "poolgate.toml"
    path.write_text(run.config_toml(18000, 18001, None, state_dir=tmp_path / "s", http="granian"))
    server = load_settings(str(path), {}).server
    assert server.http == "granian" and server.log_level == "info"
    path.write_text(run.config_toml(18000, 18001, None, state_dir=tmp_path / "s"))
    assert load_settings(str(path), {}).server.http == "uvicorn"


def test_pool_bench_measures_recovery_after_kill_9(tmp_path: Path) -> None:
    """One kill -9 per setup (one process worker, two): a positive recovery time,
    and the model served by two workers loses (next to) no request meanwhile."""
    done = subprocess.run([sys.executable, str(BENCH / "pool.py"), "--only", "recovery",
                           "--iterations", "1", "--no-pin", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    recovery = json.loads((tmp_path / "results.json").read_text())["recovery"]
    assert set(recovery) == {"1", "2"}
    for r in recovery.values():
        (run,) = r["iterations"]
        assert 0 < run["ready_s"] <= run["seconds"] == r["median_s"] < 30
        assert run["new_pid"] != run["old_pid"]
    assert recovery["2"]["failed"] <= 2
    assert "| 1 | 1 |" in done.stdout and "| 2 | 1 |" in done.stdout


def test_loadgen_rotates_session_ids_and_counts_serving_workers(upstream: DemoUpstream) -> None:
    r = loadgen("--url", upstream.anthropic_url, "--session-ids", "8", "-c", "2", "-n", "10",
                "-d", "20")
    assert r["ok_requests"] == 10 and r["errors"] == 0
    assert r["served_by"] == {"-": 10}      # the bare upstream names no worker
    assert "served_by" not in loadgen("--url", upstream.anthropic_url, "-c", "1", "-n", "2")


@pytest.mark.parametrize("policy", ["session_affinity", "prefix_cache"])
def test_prefix_bench_config_is_accepted_by_the_gateway_settings(tmp_path: Path,
                                                                 policy: str) -> None:
    spec = importlib.util.spec_from_file_location("bench_prefix", BENCH / "prefix.py")
    assert spec is not None and spec.loader is not None
    prefix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prefix)
    path = tmp_path / "poolgate.toml"
    path.write_text(prefix.config(policy, "/models/tiny.gguf", 3, 8123))
    settings = load_settings(str(path), {})
    assert settings.routing.policy == policy
    assert [(w.name, w.capacity, w.threads) for w in settings.workers] == [
        (f"llama{i}", 1, 1) for i in range(3)]


def test_inproc_bench_serves_both_routes_through_the_asgi_app() -> None:
    """bench/inproc.py: every request answered 200 (it exits otherwise), a CPU
    figure per route."""
    done = subprocess.run([sys.executable, "-m", "bench.inproc", "-n", "200", "-c", "4",
                           "--repeat", "1"], capture_output=True, text=True, timeout=60,
                          cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if "us CPU/request" in line]
    assert [r[0] for r in rows] == ["chat", "messages"]
    assert all(float(r[3]) > 0 for r in rows)  # "min <us>"


def test_client_cost_bench_measures_both_clients() -> None:
    """bench/client_cost.py: aiohttp's and pool.remote.h1's CPU per request, and the ratio
    (every answer non-empty: it exits otherwise)."""
    done = subprocess.run([sys.executable, "-m", "bench.client_cost", "-n", "400", "-c", "4",
                           "--repeat", "1"], capture_output=True, text=True, timeout=90,
                          cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if "us CPU/request" in line]
    assert [r[0] for r in rows] == ["aiohttp", "h1"]
    assert all(float(r[3]) > 0 for r in rows)  # "min <us>"
    assert re.search(r"h1 / aiohttp, medians: [0-9.]+", done.stdout)


def test_inproc_bench_isolates_the_access_line() -> None:
    """bench/inproc.py --access-log: a row per mode, and the access line's cost."""
    done = subprocess.run([sys.executable, "-m", "bench.inproc", "-n", "200", "-c", "4",
                           "--repeat", "1", "--routes", "chat", "--access-log", "off,batched"],
                          capture_output=True, text=True, timeout=60, cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr
    rows = [line.split()[:2] for line in done.stdout.splitlines() if "us CPU/request" in line]
    assert rows == [["chat", "[off]"], ["chat", "[batched]"]]
    assert "access line [batched]:" in done.stdout
    # the line's own time on the request's path, call by call
    assert re.search(r"access_log.write \[batched\], on the request's path: median [0-9.]+ us",
                     done.stdout), done.stdout
    assert "http.request" not in done.stdout  # the lines went to /dev/null


def test_repeated_rounds_are_pooled_and_listed() -> None:
    """bench/run.py --repeat: a row pools its rounds (CPU and requests summed,
    so the ratio is total against total) and lists each round's ratio."""
    report = _load("bench_report", "report.py")

    def run(ok: int, cpu: float, p50: float, foreign: float = 0.0) -> dict:
        return {"ok_requests": ok, "requests": ok, "gateway_cpu_s": cpu, "rps": ok / 5,
                "latency_ms": {"p50": p50}, "foreign_load": foreign, "errors": 0}

    rounds = [{"direct": run(100, 0.0, 0.1), "floor": run(1000, 1.0, 1.0),
               "poolgate": run(900, 0.5, 2.0, 0.3)},
              {"direct": run(100, 0.0, 0.1), "floor": run(1000, 1.0, 3.0),
               "poolgate": run(1000, 1.0, 4.0)},
              {"direct": run(100, 0.0, 0.1), "floor": run(1000, 2.0, 2.0),
               "poolgate": run(1100, 2.0, 3.0)}]
    row = report.pooled("ns_c16", rounds)
    assert [round(x, 3) for x in row["round_ratios"]] == [1.8, 1.0, 1.1]
    assert row["poolgate"]["ok_requests"] == 3000 and row["poolgate"]["gateway_cpu_s"] == 3.5
    assert row["poolgate"]["latency_ms"]["p50"] == 3.0  # the median round's
    assert row["poolgate"]["foreign_load"] == 0.3       # the worst round's
    text, ratio = report.verdict("ns_c16", row["floor"], row["poolgate"])
    # total against total (3000 in 3.5 s against 3000 in 4 s), not the rounds' mean (1.3)
    assert round(ratio, 3) == 1.143 and "met" in text
