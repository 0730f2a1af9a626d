"""One Redis connection for the shared stores, and what they do when it is lost.

Every call goes through :meth:`RedisLink.call`: bounded by ``timeout`` (the
socket timeouts and an ``asyncio`` deadline both), never retried by redis-py
(its default retries turn a dead server into seconds per command), and
refused at once with :class:`RedisDown` while the link is marked down. The
first failure marks it down; :meth:`RedisLink.watch` pings every
``probe_interval`` seconds and marks it up again when Redis answers, so a
replica returns to the shared state by itself, without a restart.

The stores catch :class:`RedisDown` and fall back to what is safe from this
process's memory (see each store), or refuse with :class:`StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, TypeVar

import structlog
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from pool.errors import GatewayError

__all__ = ["RedisLink", "RedisDown", "StoreUnavailable", "DEFAULT_PREFIX"]

log = structlog.get_logger("poolgate.redis")

#: every key a deployment writes starts with its prefix and ``:`` (``server.redis_prefix``)
DEFAULT_PREFIX = "poolgate"

T = TypeVar("T")


class RedisDown(Exception):
    """Redis did not answer in time (or the link is marked down)."""


class StoreUnavailable(GatewayError):
    """A shared store is out of reach: the request needs it and cannot be served."""

    status = 503
    kind = "upstream"  # OpenAI: api_error, Anthropic: api_error; both with status 503

    def __init__(self, message: str) -> None:
        super().__init__(message, code="store_unavailable", retry_after=1.0)


class RedisLink:
    """A ``redis.asyncio`` client with explicit retry and timeouts, and an up/down flag."""

    def __init__(self, url: str, *, timeout: float = 0.1, probe_interval: float = 0.5,
                 prefix: str = DEFAULT_PREFIX) -> None:
        self.url = url
        # the stores build every key name from this: two deployments on one Redis never meet
        self.prefix = prefix + ":"
        self.timeout = timeout
        self.probe_interval = probe_interval
        self.client: Redis = Redis.from_url(
            url, retry=Retry(NoBackoff(), 0), socket_timeout=timeout,
            socket_connect_timeout=timeout, health_check_interval=0)
        self.up = False  # until the first ping answers
        self.failures = 0
        self.outages = 0
        self._since = time.monotonic()

    async def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """``await make()`` within ``timeout``; :class:`RedisDown` when Redis is out of reach."""
        if not self.up:
            raise RedisDown("redis is down")
        try:
            async with asyncio.timeout(self.timeout):
                return await make()
        except ResponseError:
            raise  # Redis answered: a bug of ours, not an outage
        except (RedisError, OSError, TimeoutError) as exc:
            self.mark_down(exc)
            raise RedisDown(type(exc).__name__) from exc

    def mark_down(self, exc: BaseException | None = None) -> None:
        self.failures += 1
        if self.up:
            self.up = False
            self.outages += 1
            self._since = time.monotonic()
            log.warning("redis.down", error=type(exc).__name__ if exc else None)

    async def ping(self) -> bool:
        """One bounded PING; flips the flag either way."""
        try:
            async with asyncio.timeout(self.timeout):
                await self.client.ping()
        except (RedisError, OSError, TimeoutError) as exc:
            self.mark_down(exc)
            return False
        if not self.up:
            self.up = True
            log.info("redis.up", after_seconds=round(time.monotonic() - self._since, 3))
            self._since = time.monotonic()
        return True

    async def watch(self, on_tick: Callable[[], Awaitable[Any]] | None = None,
                    on_down: Callable[[], Awaitable[Any]] | None = None,
                    down_every: float | None = None) -> None:
        """Forever: ping, then ``on_tick()`` while up (shared state to poll);
        ``on_down()`` at the first ping that finds it down and, with
        ``down_every``, again every that many seconds while it stays down."""
        seen, last = -1, 0.0  # the outage on_down was called for, and when
        while True:
            call = None
            if await self.ping():
                call = on_tick
            elif on_down is not None and (seen != self.outages or (
                    down_every is not None and time.monotonic() - last >= down_every)):
                seen, last, call = self.outages, time.monotonic(), on_down
            if call is not None:
                try:
                    await call()
                except RedisDown:
                    pass
                except Exception:  # the probe must go on: it is what brings Redis back
                    log.exception("redis.watch_failed")
            await asyncio.sleep(self.probe_interval)

    def stats(self) -> dict[str, Any]:
        return {"up": self.up, "failures": self.failures, "outages": self.outages,
                "state_seconds": round(time.monotonic() - self._since, 3)}

    async def aclose(self) -> None:
        await self.client.aclose()
