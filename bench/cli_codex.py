"""Codex cli worker: what does poolgate add to a warm Codex turn?

Same fake Responses upstream (``tests/fakes/responses_upstream.py``, its own
process), same Codex binary and switches (``pool.cli.codex_config``):

* **direct**: this script drives ``codex app-server`` over JSON-RPC itself:
  one warm thread, ``turn/start`` → ``turn/completed``;
* **poolgate**: ``poolgate serve`` with one codex cli worker, a growing
  conversation sent by an HTTP client (each request = history + one new
  turn, so every turn after the first is a session hit: only the new turn
  reaches Codex);
* **cold start**: spawn → ``initialize`` → ``thread/start`` → first text delta;
* **RSS**: the app-server after 1 and after ``--threads`` warm threads.

    .venv/bin/python bench/cli_codex.py            # 15 warm turns each, 3 cold starts
    .venv/bin/python bench/cli_codex.py --turns 30 --threads 8

Needs npm (Codex 0.169.0 is installed into .cache/npm like the cli tests do).
Prints a markdown table; target: poolgate ≤ 1.1× direct and ≤ 15 ms added.
Turn times against this upstream are bimodal on loopback (about 15 ms, or
about 55 ms when a ~40 ms delayed ACK hits Codex's upstream request), in
both columns alike; compare the medians *and* the lower quartiles.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run import Proc, free_port, log, wait_ready  # noqa: E402

from pool.cli.codex_config import CodexOptions, app_server_argv, native_binary  # noqa: E402
from tests.integration.clis import CODEX, ensure_cli  # noqa: E402
from tests.support.codex_accounts import codex_home, provider_options  # noqa: E402

KEY = "sk-bench-codex"
MODEL = "gpt-5-codex"
UPSTREAM = """
import sys, time
from tests.fakes.responses_upstream import ResponsesUpstream
fake = ResponsesUpstream(api_key=sys.argv[1], models=(sys.argv[2],)).start()
print(fake.url, flush=True)
while True:
    time.sleep(3600)
"""


class AppServer:
    """A bare JSON-RPC client of one app-server (what "direct" means)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=cwd,
                                     start_new_session=True)
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.ids = iter(range(1, 1 << 30))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.inbox.put(json.loads(line))

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def call(self, method: str, params: dict[str, Any]) -> Any:
        rid = next(self.ids)
        self.send({"id": rid, "method": method, "params": params})
        return self.until(lambda m: m.get("id") == rid)["result"]

    def until(self, match: Any, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            message = self.inbox.get(timeout=max(0.01, deadline - time.monotonic()))
            if match(message):
                return message

    def start_thread(self, cwd: Path) -> str:
        return self.call("thread/start", {
            "cwd": str(cwd), "model": MODEL, "approvalPolicy": "never", "sandbox": "read-only",
            "ephemeral": True, "environments": [], "dynamicTools": [],
            "baseInstructions": "You are a helpful assistant."})["thread"]["id"]

    def turn(self, thread: str, text: str, first_delta: bool = False) -> float:
        start = time.perf_counter()
        self.call("turn/start", {"threadId": thread, "input": [{"type": "text", "text": text}]})
        method = "item/agentMessage/delta" if first_delta else "turn/completed"
        self.until(lambda m: m.get("method") == method and m["params"]["threadId"] == thread)
        return time.perf_counter() - start

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def app_server(binary: list[str], upstream: str, home: Path) -> AppServer:
    options = CodexOptions(provider_options(upstream))
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home.parent),
           "CODEX_HOME": str(home), "NO_PROXY": "127.0.0.1"}
    argv = app_server_argv(native_binary(binary, env), chat=True, options=options)
    server = AppServer(argv, env, home.parent)
    server.call("initialize", {"clientInfo": {"name": "bench", "version": "0"},
                               "capabilities": {"experimentalApi": True}})
    server.send({"method": "initialized"})
    return server


def direct(binary: list[str], upstream: str, root: Path, turns: int) -> list[float]:
    server = app_server(binary, upstream, codex_home(root / "direct", KEY))
    try:
        thread = server.start_thread(root)
        server.turn(thread, "warm up")
        return [server.turn(thread, f"turn number {n}") for n in range(turns)]
    finally:
        server.close()


def cold(binary: list[str], upstream: str, root: Path, runs: int) -> list[float]:
    times = []
    for n in range(runs):
        start = time.perf_counter()
        server = app_server(binary, upstream, codex_home(root / f"cold{n}", KEY))
        try:
            server.turn(server.start_thread(root), "hello", first_delta=True)
            times.append(time.perf_counter() - start)
        finally:
            server.close()
    return times


def rss(binary: list[str], upstream: str, root: Path, threads: int) -> tuple[float, float]:
    server = app_server(binary, upstream, codex_home(root / "rss", KEY))
    try:
        server.turn(server.start_thread(root), "one")
        one = server.rss_mb()
        for _ in range(threads - 1):
            server.turn(server.start_thread(root), "more")
        return one, server.rss_mb()
    finally:
        server.close()


def through_poolgate(binary: list[str], upstream: str, root: Path, turns: int) -> list[float]:
    port = free_port()
    home = codex_home(root / "pooled", KEY)
    options = provider_options(upstream)
    config = root / "poolgate.toml"
    config.write_text("\n".join([
        "[server]", 'host = "127.0.0.1"', f"port = {port}", 'api_keys = { bench = "sk-bench" }', 'admin_token = "bench-admin"',
        'log_level = "warning"', "", "[[workers]]", 'name = "codex-a"', 'kind = "cli"',
        'cli = "codex"', f'models = ["{MODEL}"]', f"home = {json.dumps(str(home))}",
        f"command = {json.dumps(binary)}", "", "[workers.cli_options.config]",
        *[f"{json.dumps(k)} = {json.dumps(v)}" for k, v in options["config"].items()]]))
    proc = Proc("poolgate", [sys.executable, "-m", "app.cli", "serve", "--config", str(config)],
                root / "poolgate.log", None)
    url = f"http://127.0.0.1:{port}"
    headers = {"authorization": "Bearer sk-bench"}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            def ready() -> bool:
                try:
                    return http.get("/readyz").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_ready(proc, ready, 60)
            messages: list[dict[str, str]] = []
            times = []
            for n in range(turns + 1):
                messages.append({"role": "user", "content": f"turn number {n}"})
                start = time.perf_counter()
                answer = http.post("/v1/chat/completions", json={
                    "model": MODEL, "messages": messages}).json()
                elapsed = time.perf_counter() - start
                messages.append(answer["choices"][0]["message"])
                if n:  # the first one opens the thread (a miss)
                    times.append(elapsed)
            stats = http.get("/internal/stats", headers={"authorization": "Bearer bench-admin"})
            counts = stats.json()["cli_sessions"]["workers"]["codex-a"]
            log("session reuse through poolgate:", counts)
            if counts["hits"] != turns:
                raise RuntimeError(f"expected {turns} session hits, got {counts}")
            return times
    finally:
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=15)
    parser.add_argument("--cold", type=int, default=3)
    parser.add_argument("--threads", type=int, default=5)
    args = parser.parse_args()
    binary = ensure_cli(*CODEX)
    if binary is None:
        sys.exit("npm is needed to install Codex")
    root = Path(tempfile.mkdtemp(prefix="poolgate-bench-codex-"))
    up = subprocess.Popen([sys.executable, "-c", UPSTREAM, KEY, MODEL], stdout=subprocess.PIPE,
                          cwd=HERE.parent, start_new_session=True, text=True)
    try:
        assert up.stdout is not None
        upstream = up.stdout.readline().strip()
        log("upstream", upstream, "work dir", root)
        d = direct([binary], upstream, root, args.turns)
        p = through_poolgate([binary], upstream, root, args.turns)
        c = cold([binary], upstream, root, args.cold)
        one, many = rss([binary], upstream, root, args.threads)
    finally:
        up.kill()
        up.wait()
    dm, pm = statistics.median(d) * 1000, statistics.median(p) * 1000
    print("| measure | value |\n|---|---|")
    print(f"| warm turn, direct (median of {len(d)}) | {dm:.1f} ms |")
    print(f"| warm turn, through poolgate (median of {len(p)}) | {pm:.1f} ms |")
    print(f"| ratio poolgate / direct | {pm / dm:.2f}× |")
    print(f"| added by poolgate | {pm - dm:.1f} ms |")
    dq, pq = (statistics.quantiles(x, n=4)[0] * 1000 for x in (d, p))
    print(f"| lower quartile, direct / poolgate | {dq:.1f} / {pq:.1f} ms ({pq / dq:.2f}×) |")
    print(f"| cold start → first delta (median of {len(c)}) | "
          f"{statistics.median(c) * 1000:.0f} ms (range {min(c) * 1000:.0f}–{max(c) * 1000:.0f}) |")
    print(f"| app-server RSS, 1 warm thread | {one:.0f} MB |")
    print(f"| per further warm thread ({args.threads} threads: {many:.0f} MB) | "
          f"{(many - one) / max(1, args.threads - 1):.1f} MB |")


if __name__ == "__main__":
    main()
