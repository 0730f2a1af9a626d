"""CLI processes end when poolgate says so: a close cut short by its caller's
deadline still SIGKILLs and reaps the process (a CLI stuck in a permission
wait ignores SIGTERM and stdin EOF, as Qwen does), and a ``--version`` probe
that hangs is killed when its time is up."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from pool.cli.claude import ClaudeDriver
from pool.cli.driver import DriverConfig, DriverError
from pool.cli.proc import JsonLineProcess
from pool.cli.qwen import QwenDriver

# ignores SIGTERM and stdin EOF; says it is ready, then sleeps
STUBBORN = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('{\"ready\": true}', flush=True)\n"
            "time.sleep(600)\n")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False  # still there, reaped or not: a zombie would be ours to reap


def test_a_close_cut_short_by_a_deadline_kills_and_reaps(tmp_path: Path) -> None:
    async def main() -> tuple[int, int | None, float]:
        proc = await JsonLineProcess.spawn([sys.executable, "-c", STUBBORN], env=dict(os.environ),
                                           cwd=str(tmp_path), label="stubborn")
        async for _ in proc.lines():
            break  # it runs and has set its SIGTERM handler
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(2.5):  # inside the SIGTERM wait of the sequence
                await proc.close()
        return proc.pid, proc.proc.returncode, time.monotonic() - started

    pid, code, took = asyncio.run(main())
    assert code is not None and code < 0  # killed by a signal, and reaped
    assert _gone(pid)
    assert took < 5.0


def _hanging_cli(tmp_path: Path) -> tuple[Path, Path]:
    pidfile = tmp_path / "probe.pid"
    script = tmp_path / "cli.py"
    script.write_text(f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
                      "time.sleep(600)\n")
    return script, pidfile


@pytest.mark.parametrize("driver", [ClaudeDriver, QwenDriver], ids=["claude", "qwen"])
def test_a_version_probe_that_hangs_is_killed_on_timeout(tmp_path: Path, driver) -> None:
    script, pidfile = _hanging_cli(tmp_path)
    config = DriverConfig(name="w", cli=driver.cli, home=str(tmp_path / "home"),
                          cwd=str(tmp_path / "home" / "workspace"),
                          command=(sys.executable, str(script)),
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                               "OPENAI_API_KEY": "k"}, idle_timeout=1.0)

    async def main() -> None:
        async with asyncio.timeout(10):
            with pytest.raises(DriverError):
                await driver(config).start()

    asyncio.run(main())
    assert _gone(int(pidfile.read_text()))
