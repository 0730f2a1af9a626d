"""Make this process non-dumpable (Linux ``prctl(PR_SET_DUMPABLE, 0)``).

A dumpable process's ``/proc/<pid>/environ``, ``mem`` and ``fd/`` are open
to every other process of the same user. The gateway's environment holds the
admin token and upstream keys, and a cli worker child's holds its account's
configuration, so both turn this off at start: then only root (with
``CAP_SYS_PTRACE``) reads them, no core dump is written, and no process of
the same user can attach a debugger. ``execve`` sets the flag again, so every
process that must keep its secrets calls :func:`undumpable` itself.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["undumpable", "is_dumpable"]

_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4


def _prctl(option: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.prctl(option, arg, 0, 0, 0)
    if result < 0:
        raise OSError(ctypes.get_errno(), "prctl failed")
    return int(result)


def undumpable() -> bool:
    """Turn dumping off; false where the platform has no such switch (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    _prctl(_PR_SET_DUMPABLE, 0)
    return True


def is_dumpable() -> bool | None:
    if not sys.platform.startswith("linux"):
        return None
    return _prctl(_PR_GET_DUMPABLE) != 0
