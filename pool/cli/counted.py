"""Counted quota: for a CLI that reports nothing about the account's quota
(Qwen Code, Gemini CLI, a JSON-RPC agent), the gateway counts the tokens the
account's turns used against windows the operator configured
(``quota_windows`` of a cli worker, docs/cli-workers.md "Quota") and shows
them as :class:`~pool.quota.QuotaWindow` values with ``source = "counted"``.

A window starts with the first tokens counted in it and resets ``seconds``
later (as the vendors' rolling 5-hour windows do); the next tokens after the
reset start a new one. Counted on the gateway side, so a restart of the
worker's child keeps the count; a restart of the gateway starts afresh.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..quota import COUNTED, AccountQuota, QuotaWindow

__all__ = ["CountedWindow", "CountedQuota"]


@dataclass(frozen=True, slots=True)
class CountedWindow:
    """One configured window: its name, length (seconds) and token allowance."""

    name: str
    seconds: float
    tokens: int


class CountedQuota:
    """The tokens of one account per configured window."""

    def __init__(self, windows: tuple[CountedWindow, ...]) -> None:
        self.windows = windows
        self._used = [0] * len(windows)
        self._started: list[float | None] = [None] * len(windows)
        self._seen = [0.0] * len(windows)
        self._quota = AccountQuota()
        self._refresh(time.time())

    def add(self, tokens: int, now: float | None = None) -> None:
        """Count ``tokens`` (a turn's input and output) in every window."""
        if not self.windows or tokens <= 0:
            return
        now = time.time() if now is None else now
        for i, window in enumerate(self.windows):
            started = self._started[i]
            if started is None or now >= started + window.seconds:
                self._started[i], self._used[i] = now, 0
            self._used[i] += tokens
            self._seen[i] = now
        self._refresh(now)

    def quota(self, now: float | None = None) -> AccountQuota:
        """The windows now (one that has reset shows 0 % until tokens start the next)."""
        now = time.time() if now is None else now
        expired = False
        for i, window in enumerate(self.windows):
            started = self._started[i]
            if started is not None and now >= started + window.seconds:
                self._started[i], self._used[i], self._seen[i] = None, 0, now
                expired = True
        if expired:
            self._refresh(now)
        return self._quota

    def _refresh(self, now: float) -> None:
        old = {w.name: w for w in self._quota.windows}
        windows = []
        for i, w in enumerate(self.windows):
            started = self._started[i]
            used = min(100.0, 100.0 * self._used[i] / w.tokens)
            new = QuotaWindow(name=w.name, used_percent=used,
                              resets_at=None if started is None else started + w.seconds,
                              window_seconds=w.seconds, source=COUNTED,
                              seen_at=self._seen[i] or now)
            before = old.get(w.name)
            # the previous sample of the same window (same start) gives the recent rate
            if before is not None and new.resets_at is not None \
                    and before.resets_at == new.resets_at:
                new = before.after(new)
            windows.append(new)
        self._quota = AccountQuota(tuple(windows))
