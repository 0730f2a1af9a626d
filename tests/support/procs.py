"""Process checks the tests share."""

from __future__ import annotations

__all__ = ["alive"]


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie waiting to be reaped. A process may vanish
    between any two looks at ``/proc``, so every failure to read means gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
