"""Which account signed which reasoning (:class:`pool.signatures.SignatureBook`).

:class:`MemorySignatureBook` keeps digests in this process, bounded by count
(oldest first) and by age (a note lives ``ttl`` seconds from when it was
written; a conversation that continues writes its new turns' notes, and an
old turn's expired note only makes that value "unknown", see
:mod:`pool.signatures`). :class:`RedisSignatureBook` shares them between
replicas: a note is ``SET sig:<digest> <account> EX ttl``, written in the
background (never on the answer's path); a lookup asks the local mirror
first and Redis, in one ``MGET``, only for what it does not know. While
Redis is down the local mirror answers alone.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import structlog

from pool.signatures import SignatureBook

from .redis_link import RedisDown, RedisLink

__all__ = ["MemorySignatureBook", "RedisSignatureBook"]

log = structlog.get_logger("sessions.signatures")
#: notes written to Redis in one pipeline at most (a long answer has a few)
_BATCH = 256


class MemorySignatureBook:
    def __init__(self, *, max_entries: int = 100_000, ttl: float = 7 * 86400,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1 or ttl <= 0:
            raise ValueError("max_entries must be at least 1 and ttl positive")
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock
        self._items: OrderedDict[str, tuple[str, float]] = OrderedDict()  # digest -> (account, expiry)
        self._counts = {"notes": 0, "known": 0, "unknown": 0, "expired": 0, "evicted": 0}

    async def signers(self, digests: Sequence[str]) -> Mapping[str, str]:
        return self.known(digests)

    def known(self, digests: Sequence[str]) -> dict[str, str]:
        now = self._clock()
        found: dict[str, str] = {}
        for d in digests:
            item = self._items.get(d)
            if item is not None and item[1] <= now:
                del self._items[d]
                self._counts["expired"] += 1
                item = None
            if item is None:
                self._counts["unknown"] += 1
            else:
                self._counts["known"] += 1
                found[d] = item[0]
        return found

    def note(self, account: str, digests: Sequence[str]) -> None:
        expiry = self._clock() + self.ttl
        items = self._items
        for d in digests:
            items[d] = (account, expiry)
            items.move_to_end(d)
            self._counts["notes"] += 1
        while len(items) > self.max_entries:
            items.popitem(last=False)
            self._counts["evicted"] += 1

    async def aclose(self) -> None:
        pass  # nothing in flight

    def stats(self) -> dict[str, Any]:
        return {"entries": len(self._items), **self._counts}


class RedisSignatureBook:
    """The book in Redis (``<prefix>sig:<digest>``), with a local mirror."""

    def __init__(self, link: RedisLink, *, max_entries: int = 100_000,
                 ttl: float = 7 * 86400) -> None:
        self._link = link
        self._key = link.prefix + "sig:"
        self._ttl = max(1, int(ttl))
        self.local = MemorySignatureBook(max_entries=max_entries, ttl=ttl)
        self._pending: list[tuple[str, str]] = []  # (digest, account) not yet written
        self._writer: asyncio.Task[None] | None = None
        self._fallbacks = 0
        self._lookups = 0

    async def signers(self, digests: Sequence[str]) -> Mapping[str, str]:
        found = self.local.known(digests)
        missing = [d for d in digests if d not in found]
        if not missing:
            return found
        client = self._link.client
        self._lookups += 1
        try:
            values = await self._link.call(
                lambda: client.mget([self._key + d for d in missing]))
        except RedisDown:
            self._fallbacks += 1
            return found
        for d, value in zip(missing, values):
            if value is not None:
                account = value.decode() if isinstance(value, bytes) else value
                found[d] = account
                self.local.note(account, (d,))
        return found

    def note(self, account: str, digests: Sequence[str]) -> None:
        self.local.note(account, digests)
        self._pending.extend((d, account) for d in digests)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        client = self._link.client
        while self._pending:
            batch, self._pending = self._pending[:_BATCH], self._pending[_BATCH:]

            async def flush(batch: list[tuple[str, str]] = batch) -> None:
                pipe = client.pipeline(transaction=False)
                for d, account in batch:
                    pipe.set(self._key + d, account, ex=self._ttl)
                await pipe.execute()

            try:
                await self._link.call(flush)
            except RedisDown:
                self._fallbacks += 1  # the local mirror still knows them
            except Exception:  # noqa: BLE001 - a note lost is a signature "unknown" later
                log.warning("signatures.write_failed", exc_info=True)

    async def aclose(self) -> None:
        if self._writer is not None and not self._writer.done():
            await asyncio.wait({self._writer}, timeout=1.0)

    def stats(self) -> dict[str, Any]:
        return {**self.local.stats(), "redis_lookups": self._lookups,
                "redis_fallbacks": self._fallbacks}


_check: type[SignatureBook] = MemorySignatureBook  # structural conformance, checked by mypy
_check_redis: type[SignatureBook] = RedisSignatureBook
