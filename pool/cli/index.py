"""The gateway's index of upstream sessions: which cli worker holds the
conversation a request continues (by :func:`pool.cli.history.conversation_hash`).

The interface lives here so the pool needs nothing from ``sessions/``;
``sessions.upstream`` implements it (memory now; Redis with scale-out).
Entries are written only after a clean end of a step and dropped on any
error, and every entry of a worker is dropped when its process is replaced.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["SessionIndex"]


class SessionIndex(Protocol):
    async def get(self, key: str) -> str | None:
        """The worker holding conversation ``key``, or None."""
        ...

    async def put(self, key: str, worker: str) -> None: ...

    async def drop(self, key: str) -> None: ...

    async def drop_worker(self, worker: str) -> None: ...

    def stats(self) -> dict[str, Any]: ...
