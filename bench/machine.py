"""What the machine does besides our bench: memory of a process and foreign CPU load.

Foreign load is how many cores were busy with processes that are not ours while
a bench row ran: the busy time of all CPUs from ``/proc/stat`` (user, nice,
system, irq, softirq, steal: everything but idle and iowait) minus the CPU time
of the processes we started (read from ``/proc/<pid>/stat``, descendants
included) and of this process, divided by the wall time. On a quiet machine it
is near 0; 1.0 means another job kept a whole core busy during the row.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterable
from pathlib import Path

CLK = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def busy_cpu_s() -> float:
    """CPU seconds all cores spent busy since boot (idle and iowait excluded)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK


def self_cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (loadgen runs)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        u = resource.getrusage(who)
        total += u.ru_utime + u.ru_stime
    return total


class ForeignLoad:
    """``start()`` … ``stop()`` → cores kept busy by processes that are not ours.

    ``ours`` returns the CPU seconds of the processes we started (live ones; the
    load generator is counted through RUSAGE_CHILDREN once it has been waited for).
    """

    def __init__(self, ours: Callable[[], Iterable[float]]) -> None:
        self._ours = ours
        self._t0 = self._busy0 = self._ours0 = 0.0

    def _our_cpu(self) -> float:
        return sum(self._ours()) + self_cpu_s()

    def start(self) -> None:
        self._t0, self._busy0, self._ours0 = time.monotonic(), busy_cpu_s(), self._our_cpu()

    def stop(self) -> float:
        wall = time.monotonic() - self._t0
        if wall <= 0:
            return 0.0
        foreign = (busy_cpu_s() - self._busy0) - (self._our_cpu() - self._ours0)
        return round(max(foreign, 0.0) / wall, 2)
