#!/usr/bin/env python3
"""CLI workers: what does poolgate add to a turn, what does a cold start cost,
and how much memory does a warm conversation hold?

**Warm turn.** Two conversations of ``--turns`` user turns against the same
fake OpenAI upstream (``tests/fakes/upstreams.py``, in this process), turn by
turn alternating so both see the same load: *direct*, the CLI spawned here
with the very argv, environment and settings the driver uses, one JSON line in
and its output read to the end of the turn; and *poolgate*, the same turns as
streamed OpenAI chat requests (history plus the new turn, so session reuse
sends only the new turn) through ``poolgate serve`` with a ``kind = "cli"``
worker, read to ``data: [DONE]``. The fake upstream waits ``--upstream-ms``
(50) before each answer, as a model would. Turn 1 is left out; the rest give
the medians, the ratio poolgate ÷ direct (target ≤ 1.1) and the milliseconds
added (target ≤ 15).

**Cold start.** CLI spawn → first text delta, direct, ``--cold`` times per CLI;
and poolgate's first turn of a new conversation (a miss: the spawn included).

**RSS.** The resident memory of each CLI process poolgate keeps warm after
the turns (``/proc/<pid>/status``), and of the worker child that drives it.

CLIs: ``qwen`` and ``claude``, the real Qwen Code and Claude Code from
``.cache/npm`` (installed on first use by ``tests/integration/clis.py``;
Claude logged in by a planted ``.credentials.json`` whose token the fake
upstream takes; ``--fake-qwen`` swaps in the stdlib fake qwen), and
``jsonrpc``, the stdlib fake ACP agent (``tests/fakes/``). Servers
bind 127.0.0.1 on free ports; every process started here is stopped by PID.

    .venv/bin/python bench/cli.py                      # qwen, claude (real), jsonrpc: 15 turns
    .venv/bin/python bench/cli.py --cli qwen --turns 30 --cold 5
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run import ROOT, Proc, free_port, log, wait_ready  # noqa: E402

from pool.cli.driver import DriverConfig  # noqa: E402
from pool.cli.events import ConversationSetup  # noqa: E402
from pool.cli.claude import ClaudeDriver  # noqa: E402
from pool.cli.qwen import QwenConversation, QwenDriver  # noqa: E402
from tests.integration.clis import CLAUDE_CODE, QWEN_CODE, ensure_cli  # noqa: E402
from tests.support.cli_accounts import claude_home  # noqa: E402
from tests.fakes.upstreams import FakeUpstream  # noqa: E402

API_KEY = "sk-bench"
ACCOUNT_KEY_VAR = "BENCH_CLI_ACCOUNT_KEY"
ACCOUNT_KEY = "sk-bench-account"
MODEL = "bench-model"
SYSTEM = "You are a helpful assistant."
FAKE_QWEN = ROOT / "tests" / "fakes" / "fake_qwen.py"
FAKE_AGENT = ROOT / "tests" / "fakes" / "fake_jsonrpc_agent.py"


def npm_cli(which: str) -> list[str]:
    """The real CLI from ``.cache/npm`` (installed on first use)."""
    binary = ensure_cli(*{"qwen": QWEN_CODE, "claude": CLAUDE_CODE}[which])
    if binary is None:
        raise SystemExit(f"npm is not installed: cannot bench the real {which}")
    return [binary]


# ------------------------------------------------------------------ direct
class Direct:
    """A CLI driven by hand over its stdin/stdout, one JSON object a line."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.handshake()

    def send(self, obj: dict) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.argv[0]} exited with {self.proc.wait()}")
            if line.startswith("{"):
                return json.loads(line)

    def turn(self, text: str) -> tuple[float, float]:
        """(ms to the first text, ms to the end of the turn)."""
        start = time.perf_counter()
        self.prompt(text)
        first = None
        while True:
            obj = self.read()
            if first is None and self.is_text(obj):
                first = (time.perf_counter() - start) * 1000
            if self.is_end(obj):
                return first or 0.0, (time.perf_counter() - start) * 1000

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def handshake(self) -> None: ...
    def prompt(self, text: str) -> None: ...
    def is_text(self, obj: dict) -> bool: ...
    def is_end(self, obj: dict) -> bool: ...


class DirectStreamJson(Direct):
    """Claude Code or Qwen Code in stream-json mode: initialize, then user lines."""

    def handshake(self) -> None:
        self.send({"type": "control_request", "request_id": "b1",
                   "request": {"subtype": "initialize", "hooks": None}})

    def prompt(self, text: str) -> None:
        self.send({"type": "user", "message": {"role": "user",
                                               "content": [{"type": "text", "text": text}]}})

    def is_text(self, obj: dict) -> bool:
        return obj.get("type") == "stream_event" and \
            obj["event"].get("delta", {}).get("type") == "text_delta"

    def is_end(self, obj: dict) -> bool:
        return obj.get("type") == "result"


class DirectQwen(DirectStreamJson):
    """Qwen with the driver's own argv, environment and settings.json."""

    def __init__(self, command: list[str], home: Path, base_url: str) -> None:
        config = DriverConfig(name="direct", cli="qwen", home=str(home), cwd=str(home / "workspace"),
                              command=tuple(command), env=_cli_env(base_url))
        driver = QwenDriver(config)
        driver.command = command
        home.mkdir(parents=True, exist_ok=True)
        driver.account.write()
        argv = QwenConversation(driver, ConversationSetup(model=MODEL, system=SYSTEM)).argv()
        env = driver.env()  # the system prompt as the driver gives it: a file, never argv
        (home / "system.md").write_text(SYSTEM)
        env["QWEN_SYSTEM_MD"] = str(home / "system.md")
        super().__init__(argv, env, Path(config.cwd))


class DirectClaude(DirectStreamJson):
    """Claude Code with the argv and environment the claude driver uses in chat
    mode, logged in by a planted ``.credentials.json`` (the fake upstream takes
    its token)."""

    def __init__(self, command: list[str], home: Path, base_url: str) -> None:
        claude_home(home, ACCOUNT_KEY)
        cwd = home / "workspace"
        argv = [*command, "-p", "--input-format", "stream-json", "--output-format", "stream-json",
                "--verbose", "--include-partial-messages", "--model", MODEL, "--tools", "",
                "--system-prompt", SYSTEM, "--session-id", str(uuid.uuid4())]
        env = ClaudeDriver(DriverConfig(name="direct", cli="claude", home=str(home), cwd=str(cwd),
                                        env=_claude_env(base_url))).env
        super().__init__(argv, env, cwd)


class DirectAgent(Direct):
    """The fake ACP agent: initialize, session/new, then session/prompt per turn."""

    def __init__(self, home: Path, base_url: str) -> None:
        super().__init__([sys.executable, str(FAKE_AGENT)],
                         {**_cli_env(base_url), "HOME": str(home)}, home)
        self.session, self.ids = "", 10

    def handshake(self) -> None:
        self.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": 1}})
        self.send({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                   "params": {"cwd": str(self.cwd), "mcpServers": []}})
        while (obj := self.read()).get("id") != 2:
            pass
        self.session = obj["result"]["sessionId"]

    def prompt(self, text: str) -> None:
        self.ids += 1
        self.send({"jsonrpc": "2.0", "id": self.ids, "method": "session/prompt", "params": {
            "sessionId": self.session, "prompt": [{"type": "text", "text": text}]}})

    def is_text(self, obj: dict) -> bool:
        return obj.get("method") == "session/update"

    def is_end(self, obj: dict) -> bool:
        return obj.get("id") == self.ids


UPSTREAM_DELAY = 0.05  # what the fake upstream waits before answering (--upstream-ms)


def turn_text(i: int) -> str:
    """The i-th user turn; the fake upstream waits UPSTREAM_DELAY before answering it."""
    return f"[[sleep:{UPSTREAM_DELAY:g}]] turn {i} of the bench conversation"


def _claude_env(anthropic_url: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ANTHROPIC_BASE_URL": anthropic_url}


def _cli_env(base_url: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": ACCOUNT_KEY}


def cold_start(make: Callable[[], Direct]) -> float:
    """Spawn → first text of the first turn, ms."""
    cli = make()
    start = time.perf_counter()
    try:
        cli.start()
        first, end = cli.turn(turn_text(0))
        return (time.perf_counter() - start) * 1000 - end + first
    finally:
        cli.close()


# ------------------------------------------------------------------ through poolgate
def gateway_toml(port: int, cli: str, command: list[str], home: Path, base_url: str) -> str:
    path = json.dumps(os.environ.get("PATH", ""))
    if cli == "claude":
        claude_home(home, ACCOUNT_KEY)
        env = f"ANTHROPIC_BASE_URL = {json.dumps(base_url)}, PATH = {path}"
    else:
        env = (f"OPENAI_BASE_URL = {json.dumps(base_url)}, "
               f'OPENAI_API_KEY_env = "{ACCOUNT_KEY_VAR}", PATH = {path}')
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
env = {{ {env} }}
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


class Gateway:
    """``poolgate serve`` with one cli worker, and one conversation through it."""

    def __init__(self, cli: str, command: list[str], home: Path, base_url: str, out: Path) -> None:
        self.cli, self.port = cli, free_port()
        config = out / f"poolgate-{cli}.toml"
        config.write_text(gateway_toml(self.port, cli, command, home, base_url))
        os.environ[ACCOUNT_KEY_VAR] = ACCOUNT_KEY  # the gateway reads it: no secret in the TOML
        self.argv = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
                     "serve", "--config", str(config)]
        self.log = out / f"poolgate-{cli}.log"
        self.proc: Proc | None = None
        self.messages: list[dict] = [{"role": "system", "content": SYSTEM}]

    def start(self) -> None:
        self.proc = Proc(f"poolgate-{self.cli}", self.argv, self.log, None)
        wait_ready(self.proc, lambda: _ready(self.port), 180)

    def turn(self, text: str) -> float:
        """The conversation so far plus ``text``, streamed to ``[DONE]``: ms."""
        self.messages.append({"role": "user", "content": text})
        elapsed, answer = stream_turn(self.port, self.messages)
        self.messages.append({"role": "assistant", "content": answer})
        return elapsed

    def status(self) -> dict:
        sessions = _get(self.port, "/internal/stats").get("cli_sessions", {}).get("workers", {})
        worker_pid = _get(self.port, "/internal/workers")["workers"][0]["pid"]
        return {"sessions": sessions.get(f"bench-{self.cli}"), "worker_rss_mb": rss_mb(worker_pid),
                "cli_rss_mb": [rss_mb(p) for p in children(worker_pid)]}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


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
    url = upstream.anthropic_url if cli == "claude" else upstream.url
    if cli == "jsonrpc":
        command, which = [sys.executable, str(FAKE_AGENT)], "fake ACP agent"
    elif cli == "qwen" and args.fake_qwen:
        command, which = [sys.executable, str(FAKE_QWEN)], "fake qwen"
    else:
        command = npm_cli(cli)
        which = {"qwen": "real Qwen Code 0.15.10", "claude": "real Claude Code 2.1.197"}[cli]

    def make(name: str) -> Direct:
        home = out / f"{cli}-{name}"
        if cli == "jsonrpc":
            return DirectAgent(home, url)
        return (DirectQwen if cli == "qwen" else DirectClaude)(command, home, url)

    colds = [cold_start(lambda: make(f"cold{i}")) for i in range(args.cold)]
    direct, gateway = make("direct"), Gateway(cli, command, out / f"{cli}-poolgate", url, out)
    direct_ms, poolgate_ms = [], []
    try:
        direct.start()
        gateway.start()
        # turn by turn, alternating, so both see the same load on a shared machine
        for i in range(args.turns):
            direct_ms.append(direct.turn(turn_text(i))[1])
            poolgate_ms.append(gateway.turn(turn_text(i)))
        status = gateway.status()
        direct_rss = rss_mb(direct.proc.pid if direct.proc else None)
    finally:
        direct.close()
        gateway.stop()
    dw, pw = warm(direct_ms), warm(poolgate_ms)
    log(f"{cli}: warm median direct {dw:.1f} ms, poolgate {pw:.1f} ms, sessions {status['sessions']}")
    return {"cli": cli, "binary": which, "direct_warm_ms": round(dw, 1),
            "poolgate_warm_ms": round(pw, 1), "ratio": round(pw / dw, 3),
            "added_ms": round(pw - dw, 1),
            "added_ms_paired": round(statistics.median(
                p - d for p, d in zip(poolgate_ms[1:], direct_ms[1:])), 1),
            "cold_direct_ms": [round(c, 0) for c in colds],
            "cold_poolgate_first_turn_ms": round(poolgate_ms[0], 0),
            "direct_rss_mb": direct_rss, "cli_rss_mb": status["cli_rss_mb"],
            "worker_child_rss_mb": status["worker_rss_mb"], "sessions": status["sessions"],
            "turns": args.turns, "load_avg_1m": round(os.getloadavg()[0], 2)}


def report(rows: list[dict]) -> str:
    lines = ["Warm turns are medians of turns 2..N, direct and poolgate alternating; +ms is the "
             "difference of the medians, (paired) the median of the per-turn differences.", "",
             "| CLI | binary | direct warm ms | poolgate warm ms | ×direct | +ms (paired) | "
             "cold direct ms (spawn → first text) | poolgate first turn ms | RSS per warm "
             "conversation MB (CLI; + worker child) | sessions |",
             "|---|---|---:|---:|---:|---:|---|---:|---|---|"]
    for r in rows:
        cold = ", ".join(f"{c:.0f}" for c in r["cold_direct_ms"])
        lines.append(f"| {r['cli']} | {r['binary']} | {r['direct_warm_ms']} | "
                     f"{r['poolgate_warm_ms']} | **{r['ratio']}** | {r['added_ms']} "
                     f"({r['added_ms_paired']}) | {cold} | "
                     f"{r['cold_poolgate_first_turn_ms']:.0f} | {r['cli_rss_mb']} "
                     f"(+ {r['worker_child_rss_mb']}) | {r['sessions']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", default="qwen,claude,jsonrpc",
                        help="comma-separated: qwen, claude, jsonrpc")
    parser.add_argument("--turns", type=int, default=15)
    parser.add_argument("--cold", type=int, default=3)
    parser.add_argument("--fake-qwen", action="store_true", help="the stdlib fake qwen, not the real CLI")
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
    log(f"results in {out}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
