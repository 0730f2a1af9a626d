"""Which program a Qwen conversation runs (pool.cli.qwen_launch)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pool.cli.qwen_launch import direct_command


def _package(root: Path, entry: str) -> Path:
    pkg = root / "node_modules" / "@qwen-code" / "qwen-code"
    pkg.mkdir(parents=True)
    for name in ("cli.js", "cli-entry.js"):
        (pkg / name).write_text("#!/usr/bin/env node\n")
        (pkg / name).chmod(0o755)
    bin_dir = root / "node_modules" / ".bin"
    bin_dir.mkdir()
    os.symlink(pkg / entry, bin_dir / "qwen")
    return bin_dir / "qwen"


def test_the_024_launcher_is_replaced_by_the_cli_it_would_spawn(tmp_path: Path):
    qwen = _package(tmp_path, "cli-entry.js")
    env = {"PATH": os.environ["PATH"]}
    node = shutil.which("node", path=env["PATH"])
    assert node is not None
    cli = str(qwen.resolve().with_name("cli.js"))
    assert direct_command([str(qwen), "--x"], env) == [node, "--expose-gc", cli, "--x"]
    # found on PATH too
    env["PATH"] = f"{qwen.parent}{os.pathsep}{env['PATH']}"
    assert direct_command(["qwen"], env) == [node, "--expose-gc", cli]


def test_a_015_binary_or_any_other_command_runs_as_given(tmp_path: Path):
    qwen = _package(tmp_path, "cli.js")
    env = {"PATH": os.environ["PATH"]}
    assert direct_command([str(qwen)], env) == [str(qwen)]
    assert direct_command(["/usr/bin/python3", "fake_qwen.py"], env) == [
        "/usr/bin/python3", "fake_qwen.py"]
