"""A clone of the project alone (no steering repo's ``shared/`` beside it) runs
the tests that read recorded client requests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import FIXTURES, REPO

pytestmark = pytest.mark.slow


def test_the_suite_reads_nothing_from_beside_the_checkout() -> None:
    tracked = subprocess.run(["git", "ls-files", "tests", "bench", "Makefile", ".ci"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.split()
    marker = "../" + "shared"  # spelled apart so this file does not find itself
    readers = [p for p in tracked if p.endswith((".py", "Makefile", "run"))
               and marker in (REPO / p).read_text(errors="replace")]
    assert readers == [], readers
    assert len(list(FIXTURES.glob("*.json"))) >= 30


def test_fixture_tests_pass_in_a_lone_copy(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git checkout to list the project's files")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    lone = tmp_path / "alone" / "poolgate"  # nothing beside it: no shared/
    for name in filter(None, files):
        if (REPO / name).is_file():
            (lone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, lone / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "POOLGATE_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:logging",
         "tests/unit/test_anthropic_dialect.py", "tests/integration/test_fixture_replay.py",
         "tests/unit/test_openai_responses_dialect.py"],
        cwd=lone, env=env, capture_output=True, text=True, timeout=600)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], tail
