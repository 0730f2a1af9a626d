"""How long admitted requests hold their slots, and what that makes a refusal's ``Retry-After``.

A refused client should come back when a slot is likely free, not after a
fixed second that only adds load when requests last a minute. The admission
guard records, on every release, how long the slot was held; this module keeps
an exponentially weighted moving average (EWMA) of those hold times, globally
and per worker, and turns it into an estimate:

    slots free up at a rate of  capacity / mean hold   (per second)
    a newcomer behind ``ahead`` waiters gets one after  (ahead + 1) / rate

For a shortage of workers the rate is the sum over the eligible workers of
``capacity / hold``, each worker with its own average (a model on a slow
engine and one on a fast API do not share a number). The answer is rounded up
to whole seconds (``Retry-After`` takes integers) and clamped to
``[MIN_RETRY, MAX_RETRY]``; with nothing measured yet it is the configured
fallback.
"""

from __future__ import annotations

import math
from typing import Iterable

__all__ = ["HoldTimes", "MIN_RETRY", "MAX_RETRY", "ALPHA"]

MIN_RETRY = 1
MAX_RETRY = 60
ALPHA = 0.2  # weight of the newest hold: the last ~10 releases dominate the average


class HoldTimes:
    """EWMA of slot hold times (seconds), overall and per worker name."""

    __slots__ = ("_overall", "_by_worker", "_fallback", "observed")

    def __init__(self, fallback: float = 1.0) -> None:
        self._overall: float | None = None
        self._by_worker: dict[str, float] = {}
        self._fallback = fallback
        self.observed = 0

    def observe(self, worker: str, seconds: float) -> None:
        """A slot on ``worker`` was held for ``seconds`` and is free again."""
        seconds = max(0.0, seconds)
        self.observed += 1
        self._overall = _ewma(self._overall, seconds)
        self._by_worker[worker] = _ewma(self._by_worker.get(worker), seconds)

    def mean(self, worker: str | None = None) -> float | None:
        """The average hold of ``worker`` (else of all workers); ``None`` before any release."""
        if worker is None:
            return self._overall
        return self._by_worker.get(worker, self._overall)

    def snapshot(self) -> dict[str, float]:
        """Per-worker averages, to export."""
        return dict(self._by_worker)

    def forget(self, worker: str) -> None:
        self._by_worker.pop(worker, None)

    def retry_after(self, slots: Iterable[tuple[str | None, int]], ahead: int) -> int:
        """Whole seconds until a request behind ``ahead`` waiters likely gets one
        of ``slots`` (``(worker name or None for overall, capacity)`` pairs)."""
        rate = 0.0
        for worker, capacity in slots:
            hold = self.mean(worker)
            if hold is None or capacity <= 0:
                continue
            rate += capacity / max(hold, 1e-3)
        if rate <= 0.0:
            return _clamp(self._fallback)
        return _clamp((max(0, ahead) + 1) / rate)


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + ALPHA * (new - old)


def _clamp(seconds: float) -> int:
    return min(MAX_RETRY, max(MIN_RETRY, math.ceil(seconds)))
