"""bench/quota_routing.py runs end to end (a short run): both routings answer
every request and print the table bench/README.md shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_quota_routing_bench_prints_both_rows() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(REPO / "bench" / "quota_routing.py"),
                          "--requests", "16", "--clients", "2", "--turns", "2"],
                         capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in out.stdout.splitlines() if line.startswith("| ") and "used %" not in line}
    assert set(rows) == {"least-loaded", "headroom"}
    for cells in rows.values():
        assert cells[-1] == "16" and cells[-2] == "0"  # every request answered, none failed
