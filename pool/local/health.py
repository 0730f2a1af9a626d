"""Is a local worker's engine serving? What the worker child answers the
gateway's ping with (see :func:`pool.worker_main.serve`'s ``health``).

Two signs, both cheap and bounded in time:

* the engine's own health check (``Engine.healthy()`` where the engine has
  one: its server's ``/health``, its scheduler thread alive), at most once per
  ``cache_for`` seconds however often the gateway pings, and given
  ``check_timeout`` seconds: a server that does not answer (hung, SIGSTOPped)
  is unhealthy;
* progress: while a sequence waits for its next token, the engine as a whole
  must produce some token every ``read_timeout`` seconds. A sequence queued
  behind busy ones is not stalled (the engine is making progress); an engine
  that produces nothing for that long while asked is wedged: the waiting
  sequences end with a 504 and the worker reports itself unhealthy from then
  on, so its supervisor replaces it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

import structlog

from .engine import Engine, EngineError

__all__ = ["EngineWatch"]

log = structlog.get_logger("pool.local.health")


class EngineWatch:
    """The engine's health and progress (see the module's documentation)."""

    def __init__(self, engine: Engine, *, read_timeout: float, check_timeout: float,
                 cache_for: float = 1.0) -> None:
        self.engine = engine
        self.read_timeout = read_timeout
        self.check_timeout = check_timeout
        self.cache_for = cache_for
        self.wedged: str | None = None
        self._waits: set[asyncio.Timeout] = set()
        self._progress = time.monotonic()   # the last token, or when waiting began
        self._watchdog: asyncio.Task[None] | None = None
        self._checked_at = -float("inf")
        self._verdict: str | None = None
        self._checking: asyncio.Task[str | None] | None = None

    # --- progress --------------------------------------------------------------------

    async def next_step(self, steps: AsyncIterator[Any]) -> Any:
        """The next step of ``steps`` (None at its end); raises a 504
        :class:`EngineError` when the engine stalls (see the module's documentation)."""
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._watch(),
                                                                     name="engine-watchdog")
        if not self._waits:
            self._progress = time.monotonic()  # idle time is not a stall
        deadline = asyncio.timeout(None)  # expired by the watchdog, never by a clock of its own
        try:
            async with deadline:
                self._waits.add(deadline)
                try:
                    step = await anext(steps, None)
                finally:
                    self._waits.discard(deadline)
        except TimeoutError:
            if not deadline.expired():
                raise  # the engine's own timeout: its business
            raise EngineError(f"the {self.engine.name} engine produced no token for "
                              f"{self.read_timeout:g} s", status=504) from None
        self._progress = time.monotonic()
        return step

    async def _watch(self) -> None:
        tick = min(1.0, self.read_timeout / 4)
        while True:
            await asyncio.sleep(tick)
            stalled = time.monotonic() - self._progress
            if self._waits and stalled > self.read_timeout:
                self.wedged = f"the {self.engine.name} engine produced no token for {stalled:.0f} s"
                log.error("engine.stalled", engine=self.engine.name, waiting=len(self._waits),
                          seconds=round(stalled, 1))
                now = asyncio.get_running_loop().time()
                for deadline in list(self._waits):
                    deadline.reschedule(now)

    # --- health ------------------------------------------------------------------------

    async def unhealthy(self) -> str | None:
        """Why the engine cannot serve, or None when it can."""
        if self.wedged is not None:
            return self.wedged
        if time.monotonic() - self._checked_at < self.cache_for:
            return self._verdict
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(self._check())
        return await asyncio.shield(self._checking)

    async def _check(self) -> str | None:
        healthy = getattr(self.engine, "healthy", None)
        verdict: str | None = None
        if healthy is not None:
            try:
                async with asyncio.timeout(self.check_timeout):
                    if not await healthy():
                        verdict = f"the {self.engine.name} engine failed its health check"
            except TimeoutError:
                verdict = (f"the {self.engine.name} engine did not answer its health check "
                           f"within {self.check_timeout:g} s")
            except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check
                verdict = (f"the {self.engine.name} engine's health check failed "
                           f"({type(exc).__name__})")
        if verdict is not None:
            log.warning("engine.unhealthy", engine=self.engine.name, why=verdict)
        self._checked_at, self._verdict = time.monotonic(), verdict
        return verdict

    async def aclose(self) -> None:
        for task in (self._watchdog, self._checking):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
