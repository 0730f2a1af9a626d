"""Client text for a CLI that only takes it as a file: never on a command line.

A command line is the wrong place for anything a client wrote: any local
user reads it with ``ps``, an argument parser may take it for an option
(``--openai-base-url=…`` as a system prompt) or drop it (``- …``), and one
argument over 128 KiB cannot start a process at all. A :class:`PromptFile`
is a 0600 file in its own 0700 directory under the account's home (the CLI
can always read its home, also in a sandbox), removed by :meth:`remove`;
whatever a crash left behind is removed by :func:`remove_stale` when the
driver starts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["PromptFile", "remove_stale", "safe_value"]

_PREFIX = ".poolgate-prompt-"


class PromptFile:
    """One private file holding ``text``; ``path`` is what the CLI is given."""

    def __init__(self, home: str | os.PathLike[str], text: str, name: str = "prompt.md") -> None:
        os.makedirs(home, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix=_PREFIX, dir=home)   # 0700
        self.path = os.path.join(self.dir, name)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def remove_stale(home: str | os.PathLike[str]) -> None:
    """Prompt files a killed worker left in ``home`` (one worker per home)."""
    try:
        entries = list(Path(home).iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(_PREFIX) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def safe_value(value: str, limit: int = 256) -> bool:
    """Whether a client-chosen option value (a model name, an effort level) may
    be passed as ``--option=value``: short, one printable line."""
    return 0 < len(value) <= limit and value.isprintable()
