"""When the Claude driver asks a conversation's process for the account's
usage windows (the control request ``get_usage``, see
:meth:`pool.cli.claude.ClaudeConversation.usage`): after a turn, at most once
per :data:`USAGE_INTERVAL` per account, and at once after a changed
``rate_limit_event`` that did not carry every window's numbers; in a task of
its own, so no answer waits for it; only for a subscription login (Claude Code
ignores the quota headers with an API key).

A new process reports the first quota it sees as a change, so what counts is
a change from the account's last event, whichever of its processes sent it.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Callable, Mapping

from ..quota import QuotaWindow

__all__ = ["UsageAsker", "USAGE_INTERVAL"]

USAGE_INTERVAL = 60.0  # seconds between two get_usage requests of one account
#: the variables that make a Claude account an API-key one
AUTH_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")


class UsageAsker:
    """One account's get_usage schedule; ``on_quota`` gets what is answered."""

    def __init__(self, home: str, env: Mapping[str, str]) -> None:
        self.home = home
        self.env = env
        self.on_quota: Callable[[tuple[QuotaWindow, ...]], None] | None = None
        self._asked = -USAGE_INTERVAL  # monotonic time of the last request
        self._rate_info: tuple[str, ...] | None = None  # the account's last event's gist
        self._tasks: set[asyncio.Future[None]] = set()

    def subscription(self) -> bool:
        """A claude.ai login: OAuth credentials in the home, no API key or token."""
        return (os.path.exists(os.path.join(self.home, ".credentials.json"))
                and not any(self.env.get(k) for k in AUTH_ENV))

    def after_turn(self, conversation: Any, rate_info: tuple[str, ...] | None) -> None:
        """A turn of ``conversation`` ended; ``rate_info``: the gist of the
        ``rate_limit_event`` it printed without every window (None: none)."""
        changed = rate_info is not None and rate_info != self._rate_info
        if rate_info is not None:
            self._rate_info = rate_info
        now = time.monotonic()
        if self.on_quota is None or not self.subscription() or (
                not changed and now - self._asked < USAGE_INTERVAL):
            return
        self._asked = now
        task = asyncio.ensure_future(self._ask(conversation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ask(self, conversation: Any) -> None:
        windows = await conversation.usage()
        if windows and self.on_quota is not None:
            self.on_quota(windows)

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
