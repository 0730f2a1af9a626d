"""Files and directories poolgate writes for an account: 0600 files in 0700
directories, whatever the process's umask.

``open``/``mkdir`` modes are masked by the umask (so a umask can only make
them *stricter*, never looser), yet the defaults (0666, 0777) are not, and
``os.makedirs`` creates intermediate directories with the default mode: so
every directory is created one level at a time and every mode is set again
with ``chmod`` (a umask of 0o277 would otherwise leave a 0500 directory the
worker cannot write in).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["FILE_MODE", "DIR_MODE", "private_dir", "write_private", "remove_quietly"]

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(root: str | os.PathLike[str], *parts: str) -> Path:
    """``root`` joined with ``parts``, every level from ``root`` down created
    (or made) 0700; directories above ``root`` are left as they are."""
    path = Path(root)
    levels = [path]
    for part in parts:
        path = path / part
        levels.append(path)
    for level in levels:
        if not level.is_dir():
            level.parent.mkdir(parents=True, exist_ok=True)  # above root: not ours to chmod
            with contextlib.suppress(FileExistsError):
                level.mkdir(mode=DIR_MODE)
        if level.is_symlink():
            raise OSError(f"{level} is a symbolic link")
        os.chmod(level, DIR_MODE)
    return path


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, as a 0600 file (its
    directory must exist; make it with :func:`private_dir`)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_quietly(*paths: str | os.PathLike[str]) -> None:
    """Delete files that may already be gone."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(path)
