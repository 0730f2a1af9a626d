#!/usr/bin/env python3
"""What agent mode's sandbox costs a turn: Claude Code driven by poolgate's
own driver (``pool.cli.claude.ClaudeDriver``, agent mode), once with
``sandbox = "none"`` (*direct*) and once under bubblewrap (*sandboxed*, what
``auto`` picks here), against the fake Anthropic upstream
(``tests/fakes/upstreams.py``, in this process, 127.0.0.1).

Each round, for each of the two in alternation (same load for both): open a
new conversation and run its first turn (*first turn*: the CLI process is
spawned inside the sandbox, so this is where bubblewrap's set-up shows), then
a second turn in the same process (*warm turn*: the sandbox is already
there), then close it; and, apart, ``/usr/bin/true`` spawned plain and inside
the same sandbox (the set-up alone). ``--rounds`` (20) rounds; the medians of each and the
difference are printed, and JSON with every sample when ``--json`` is given.

CLI: the real Claude Code from ``.cache/npm`` (installed on first use by
``tests/integration/clis.py``; logged in by a planted ``.credentials.json``
whose token the fake upstream takes), or ``--fake`` for the stdlib fake.

    .venv/bin/python bench/sandbox.py                # real claude, 20 rounds
    .venv/bin/python bench/sandbox.py --fake --rounds 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pool.cli.claude import ClaudeDriver  # noqa: E402
from pool.cli.driver import DriverConfig  # noqa: E402
from pool.cli.events import TERMINAL, ConversationSetup, TurnFinished, Turn  # noqa: E402
from pool.cli.sandbox import resolve_sandbox  # noqa: E402
from pool.model import Message, TextPart  # noqa: E402
from tests.fakes.upstreams import FakeUpstream  # noqa: E402
from tests.integration.clis import CLAUDE_CODE, NPM_PREFIX, ensure_cli  # noqa: E402
from tests.support.cli_accounts import FAKE_CLAUDE, claude_home  # noqa: E402

MODEL = "claude-sonnet-4-6"
TOKEN = "sk-ant-oat01-bench"


def _command(fake: bool) -> tuple[str, ...]:
    if fake:
        return (sys.executable, str(FAKE_CLAUDE))
    if ensure_cli(*CLAUDE_CODE) is None:
        sys.exit("cannot install Claude Code (npm missing?); use --fake")
    native = NPM_PREFIX / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    return (str(native),)


async def _turn(conv, text: str) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    last = None
    async for event in conv.send(Turn((Message("user", (TextPart(text),)),))):
        last = event
    if not isinstance(last, TurnFinished):
        raise RuntimeError(f"the turn ended with {last!r}")
    assert isinstance(last, TERMINAL)
    return time.perf_counter() - start


async def _round(driver: ClaudeDriver, workspace: str) -> tuple[float, float]:
    start = time.perf_counter()
    conv = await driver.open(ConversationSetup(model=MODEL, system="Answer briefly.",
                                               workspace=workspace))
    try:
        await _turn(conv, "first turn")
        first = time.perf_counter() - start  # spawn, initialize and the turn
        warm = await _turn(conv, "second turn")
    finally:
        await conv.close()
    return first, warm


async def main(args: argparse.Namespace) -> dict:
    command = _command(args.fake)
    with tempfile.TemporaryDirectory(prefix="poolgate-sandbox-bench-") as tmp, \
            FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        root = Path(tmp)
        home = claude_home(root / "account", TOKEN)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "ANTHROPIC_BASE_URL": upstream.anthropic_url, "FAKE_CLAUDE_LOG": os.devnull,
               "ANTHROPIC_SMALL_FAST_MODEL": MODEL, "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL}
        base = DriverConfig(name="bench", cli="claude", home=str(home), cwd=str(root / "ws"),
                            command=command, env=env, mode="agent",
                            workspace_root=str(root / "workspaces"))
        sandbox = resolve_sandbox("auto", name="bench", mode="agent", cli="claude",
                                  home=str(home), env=env, command=command)
        drivers = {"direct": ClaudeDriver(base),
                   f"sandboxed ({sandbox.kind})": ClaudeDriver(replace(base, sandbox=sandbox))}
        os.makedirs(base.cwd, exist_ok=True)
        for driver in drivers.values():
            await driver.start()
        workspace = base.workspace("team-a")  # what the host creates before a conversation
        os.makedirs(workspace, exist_ok=True)
        samples: dict[str, dict[str, list[float]]] = {n: {"first": [], "warm": []} for n in drivers}
        for driver in drivers.values():  # one warm-up round each, not counted
            await _round(driver, workspace)
        for _ in range(args.rounds):
            for name, driver in drivers.items():
                first, warm = await _round(driver, workspace)
                samples[name]["first"].append(first)
                samples[name]["warm"].append(warm)
        # the set-up alone: /usr/bin/true spawned plain vs inside the same sandbox
        spawn = {"direct": [], "sandboxed": []}
        for _ in range(args.rounds):
            for name, argv in (("direct", ["/usr/bin/true"]),
                               ("sandboxed", sandbox.command(["/usr/bin/true"], cwd=workspace,
                                                             writable=[workspace], env=env))):
                start = time.perf_counter()
                proc = await asyncio.create_subprocess_exec(*argv, env=env)
                await proc.wait()
                spawn[name].append(time.perf_counter() - start)
    report = {"cli": "fake claude" if args.fake else "claude (real)", "rounds": args.rounds,
              "spawn_true_median_ms": {k: round(statistics.median(v) * 1000, 2)
                                       for k, v in spawn.items()},
              "median_ms": {n: {k: round(statistics.median(v) * 1000, 1) for k, v in s.items()}
                            for n, s in samples.items()}}
    (direct, boxed) = report["median_ms"].values()
    report["added_ms"] = {k: round(boxed[k] - direct[k], 1) for k in direct}
    if args.json:
        report["samples_ms"] = {n: {k: [round(x * 1000, 1) for x in v] for k, v in s.items()}
                                for n, s in samples.items()}
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--fake", action="store_true", help="the stdlib fake Claude Code")
    parser.add_argument("--json", action="store_true", help="also every sample")
    result = asyncio.run(main(parser.parse_args()))
    print(json.dumps(result, indent=1))
