#!/usr/bin/env python3
"""CLI workers: what does poolgate add to a turn, what does a cold start cost,
and how much memory does a warm conversation hold?

**Warm turn.** One conversation of ``--turns`` user turns, driven twice
against the same fake OpenAI upstream (``tests/fakes/upstreams.py``, in this
process): *direct*, the CLI spawned here with the very argv and environment
the driver uses, one JSON line in and the stream read to the end of the turn;
and *poolgate*, the same turns as streamed OpenAI chat requests (history plus
the new turn, so session reuse sends only the new turn) through ``poolgate
serve`` with a ``kind = "cli"`` worker, to ``data: [DONE]``. Turn 1 is the cold
one and left out; the fake upstream waits ``--upstream-ms`` (50) before each
answer, as a model would; the rest give the median, the ratio poolgate ÷ direct
(target ≤ 1.1) and the milliseconds added (target ≤ 15).

**Cold start.** CLI spawn → first text delta, direct, ``--cold`` times per CLI;
and poolgate's first turn of a new conversation (a miss: the spawn included).

**RSS.** The resident memory of each CLI process poolgate keeps warm after
the turns (``/proc/<pid>/status``), and of the worker child that drives it.

CLIs: ``qwen`` (the real Qwen Code from ``.cache/npm``, installed on first
use by ``tests/integration/clis.py``; ``--fake-qwen`` uses the stdlib fake
instead), ``jsonrpc`` (the stdlib fake ACP agent, ``tests/fakes/``). Servers
bind 127.0.0.1 on free ports; every process started here is stopped by PID.

    .venv/bin/python bench/cli.py                      # qwen (real) and jsonrpc, 15 turns
    .venv/bin/python bench/cli.py --cli qwen --turns 30 --cold 5
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run import ROOT, Proc, free_port, log, wait_ready  # noqa: E402

from pool.cli.driver import DriverConfig  # noqa: E402
from pool.cli.events import ConversationSetup  # noqa: E402
from pool.cli.proc import JsonLineProcess  # noqa: E402
from pool.cli.qwen import QwenConversation, QwenDriver  # noqa: E402
from tests.fakes.upstreams import FakeUpstream  # noqa: E402

API_KEY = "sk-bench"
ACCOUNT_KEY_VAR = "BENCH_CLI_ACCOUNT_KEY"
ACCOUNT_KEY = "sk-bench-account"
MODEL = "bench-model"
SYSTEM = "You are a helpful assistant."
FAKE_QWEN = ROOT / "tests" / "fakes" / "fake_qwen.py"
FAKE_AGENT = ROOT / "tests" / "fakes" / "fake_jsonrpc_agent.py"


def qwen_command(fake: bool) -> list[str]:
    if fake:
        return [sys.executable, str(FAKE_QWEN)]
    from tests.integration.clis import QWEN_CODE, ensure_cli
    binary = ensure_cli(*QWEN_CODE)
    if binary is None:
        raise SystemExit("npm is not installed: use --fake-qwen")
    return [binary]


# ------------------------------------------------------------------ direct
class DirectQwen:
    """Qwen driven by hand, with the driver's own argv, env and settings."""

    def __init__(self, command: list[str], home: Path, base_url: str) -> None:
        config = DriverConfig(name="direct", cli="qwen", home=str(home), cwd=str(home / "workspace"),
                              command=tuple(command), env=_cli_env(base_url, secret=True))
        self.driver = QwenDriver(config)
        self.driver.command = command
        Path(config.cwd).mkdir(parents=True, exist_ok=True)
        self.driver.write_settings()
        self.argv = QwenConversation(self.driver, ConversationSetup(model=MODEL, system=SYSTEM)).argv()

    async def start(self) -> JsonLineProcess:
        proc = await JsonLineProcess.spawn(self.argv, env=self.driver.env(),
                                           cwd=self.driver.config.cwd, label="qwen")
        proc.send({"type": "control_request", "request_id": "b1",
                   "request": {"subtype": "initialize", "hooks": None}})
        return proc

    @staticmethod
    def prompt(proc: JsonLineProcess, text: str) -> None:
        proc.send({"type": "user", "message": {"role": "user",
                                               "content": [{"type": "text", "text": text}]}})

    @staticmethod
    def is_text(obj: dict) -> bool:
        return obj.get("type") == "stream_event" and \
            obj["event"].get("delta", {}).get("type") == "text_delta"

    @staticmethod
    def is_end(obj: dict) -> bool:
        return obj.get("type") == "result"


class DirectAgent:
    """The fake ACP agent driven by hand: initialize, session/new, session/prompt."""

    def __init__(self, home: Path, base_url: str) -> None:
        self.home = home
        self.env = {**_cli_env(base_url, secret=True), "HOME": str(home)}
        self.session = ""
        home.mkdir(parents=True, exist_ok=True)

    async def start(self) -> JsonLineProcess:
        proc = await JsonLineProcess.spawn([sys.executable, str(FAKE_AGENT)], env=self.env,
                                           cwd=str(self.home), label="agent")
        proc.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": 1}})
        proc.send({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                   "params": {"cwd": str(self.home), "mcpServers": []}})
        async for obj in proc.lines():
            if obj.get("id") == 2:
                self.session = obj["result"]["sessionId"]
                break
        return proc

    def prompt(self, proc: JsonLineProcess, text: str) -> None:
        proc.send({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {
            "sessionId": self.session, "prompt": [{"type": "text", "text": text}]}})

    @staticmethod
    def is_text(obj: dict) -> bool:
        return obj.get("method") == "session/update"

    @staticmethod
    def is_end(obj: dict) -> bool:
        return obj.get("id") == 3


UPSTREAM_DELAY = 0.05  # what the fake upstream waits before answering (--upstream-ms)


def turn_text(i: int) -> str:
    """The i-th user turn; the fake upstream waits UPSTREAM_DELAY before answering it."""
    return f"[[sleep:{UPSTREAM_DELAY:g}]] turn {i} of the bench conversation"


def _cli_env(base_url: str, *, secret: bool) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OPENAI_BASE_URL": base_url}
    if secret:
        env["OPENAI_API_KEY"] = ACCOUNT_KEY
    return env


async def direct(cli, turns: int) -> dict:
    """Cold start (spawn → first text) and warm turns (send → end of turn), ms."""
    t0 = time.perf_counter()
    proc = await cli.start()
    lines = proc.lines()
    times, cold, rss = [], None, None
    try:
        for i in range(turns):
            start = time.perf_counter()
            cli.prompt(proc, turn_text(i))
            async for obj in lines:
                if cold is None and cli.is_text(obj):
                    cold = (time.perf_counter() - t0) * 1000
                if cli.is_end(obj):
                    break
            times.append((time.perf_counter() - start) * 1000)
        rss = rss_mb(proc.pid)
    finally:
        await proc.close()
    return {"cold_ms": cold, "turns_ms": times, "rss_mb": rss}


# ------------------------------------------------------------------ through poolgate
def gateway_toml(port: int, cli: str, command: list[str], home: Path, base_url: str) -> str:
    return f"""[server]
host = "127.0.0.1"
port = {port}
api_keys = {{ bench = "{API_KEY}" }}
admin_token = "bench-admin"
log_level = "warning"

[[workers]]
name = "bench-{cli}"
kind = "cli"
cli = "{cli}"
models = ["{MODEL}"]
home = {json.dumps(str(home))}
command = {json.dumps(command)}
max_conversations = 2
ready_timeout = 120
env = {{ OPENAI_BASE_URL = {json.dumps(base_url)}, OPENAI_API_KEY_env = "{ACCOUNT_KEY_VAR}", PATH = {json.dumps(os.environ.get("PATH", ""))} }}
"""


def stream_turn(port: int, messages: list[dict]) -> tuple[float, str]:
    """One streamed chat request to ``[DONE]``: (ms, text)."""
    body = json.dumps({"model": MODEL, "stream": True, "messages": messages}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body, headers={
        "authorization": f"Bearer {API_KEY}", "content-type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"poolgate answered {response.status}: {response.read()[:300]!r}")
    text = []
    for raw in response:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            break
        if line.startswith("data: "):
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"error frame: {chunk['error']}")
            for choice in chunk.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
    elapsed = (time.perf_counter() - start) * 1000
    conn.close()
    return elapsed, "".join(text)


def through_poolgate(cli: str, command: list[str], home: Path, base_url: str, turns: int,
                     out: Path) -> dict:
    port = free_port()
    config = out / f"poolgate-{cli}.toml"
    config.write_text(gateway_toml(port, cli, command, home, base_url))
    os.environ[ACCOUNT_KEY_VAR] = ACCOUNT_KEY  # the gateway reads it: secrets stay out of the TOML
    argv = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
            "serve", "--config", str(config)]
    gateway = Proc(f"poolgate-{cli}", argv, out / f"poolgate-{cli}.log", None)
    try:
        wait_ready(gateway, lambda: _ready(port), 180)
        messages = [{"role": "system", "content": SYSTEM}]
        times = []
        for i in range(turns):
            messages.append({"role": "user", "content": turn_text(i)})
            elapsed, text = stream_turn(port, messages)
            messages.append({"role": "assistant", "content": text})
            times.append(elapsed)
        stats = _get(port, "/internal/stats").get("cli_sessions", {}).get("workers", {})
        worker_pid = _get(port, "/internal/workers")["workers"][0]["pid"]
        clis = children(worker_pid)
        return {"turns_ms": times, "sessions": stats.get(f"bench-{cli}"),
                "worker_rss_mb": rss_mb(worker_pid),
                "cli_rss_mb": [rss_mb(p) for p in clis]}
    finally:
        gateway.stop()


def _get(port: int, path: str) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers={"authorization": "Bearer bench-admin"})
    data = json.loads(conn.getresponse().read())
    conn.close()
    return data


def _ready(port: int) -> bool:
    workers = _get(port, "/internal/workers").get("workers") or []
    return bool(workers) and all(w["state"] == "ready" for w in workers)


# ------------------------------------------------------------------ /proc
def rss_mb(pid: int | None) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (FileNotFoundError, TypeError):
        return None
    return None


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


# ------------------------------------------------------------------ main
def warm(times: list[float]) -> float:
    return statistics.median(times[1:])


def bench_one(cli: str, args: argparse.Namespace, upstream: FakeUpstream, out: Path) -> dict:
    command = qwen_command(args.fake_qwen) if cli == "qwen" else [sys.executable, str(FAKE_AGENT)]
    which = ("fake" if args.fake_qwen else "real Qwen Code 0.15.10") if cli == "qwen" \
        else "fake ACP agent"
    colds = []
    for i in range(args.cold):
        runner = DirectQwen(command, out / f"{cli}-cold{i}", upstream.url) if cli == "qwen" \
            else DirectAgent(out / f"{cli}-cold{i}", upstream.url)
        colds.append(asyncio.run(direct(runner, 1))["cold_ms"])
    runner = DirectQwen(command, out / f"{cli}-direct", upstream.url) if cli == "qwen" \
        else DirectAgent(out / f"{cli}-direct", upstream.url)
    d = asyncio.run(direct(runner, args.turns))
    log(f"{cli}: direct warm median {warm(d['turns_ms']):.1f} ms")
    p = through_poolgate(cli, command, out / f"{cli}-poolgate", upstream.url, args.turns, out)
    log(f"{cli}: poolgate warm median {warm(p['turns_ms']):.1f} ms, sessions {p['sessions']}")
    dw, pw = warm(d["turns_ms"]), warm(p["turns_ms"])
    return {"cli": cli, "binary": which, "direct_warm_ms": round(dw, 1),
            "poolgate_warm_ms": round(pw, 1), "ratio": round(pw / dw, 3),
            "added_ms": round(pw - dw, 1), "cold_direct_ms": [round(c, 0) for c in colds],
            "cold_poolgate_first_turn_ms": round(p["turns_ms"][0], 0),
            "direct_rss_mb": d["rss_mb"], "cli_rss_mb": p["cli_rss_mb"],
            "worker_child_rss_mb": p["worker_rss_mb"], "sessions": p["sessions"],
            "turns": args.turns}


def report(rows: list[dict]) -> str:
    lines = ["| CLI | binary | direct warm ms | poolgate warm ms | ×direct | +ms | cold direct ms "
             "(spawn → first text) | poolgate first turn ms | RSS per warm conversation MB "
             "(CLI; + worker child) | sessions |",
             "|---|---|---:|---:|---:|---:|---|---:|---|---|"]
    for r in rows:
        cold = ", ".join(f"{c:.0f}" for c in r["cold_direct_ms"])
        lines.append(f"| {r['cli']} | {r['binary']} | {r['direct_warm_ms']} | "
                     f"{r['poolgate_warm_ms']} | **{r['ratio']}** | {r['added_ms']} | {cold} | "
                     f"{r['cold_poolgate_first_turn_ms']:.0f} | {r['cli_rss_mb']} "
                     f"(+ {r['worker_child_rss_mb']}) | {r['sessions']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", default="qwen,jsonrpc", help="comma-separated: qwen, jsonrpc")
    parser.add_argument("--turns", type=int, default=15)
    parser.add_argument("--cold", type=int, default=3)
    parser.add_argument("--fake-qwen", action="store_true", help="the stdlib fake, not the real CLI")
    parser.add_argument("--upstream-ms", type=float, default=50.0,
                        help="the fake upstream's delay before each answer (a real model's latency)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    global UPSTREAM_DELAY
    UPSTREAM_DELAY = args.upstream_ms / 1000
    out = Path(args.out or tempfile.mkdtemp(prefix="poolgate-bench-cli-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with FakeUpstream(api_key=ACCOUNT_KEY, models=(MODEL,)) as upstream:
        for cli in args.cli.split(","):
            rows.append(bench_one(cli.strip(), args, upstream, out))
    table = report(rows)
    print(table)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    (out / "report.md").write_text(table)
    log(f"results in {out}; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
