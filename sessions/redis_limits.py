"""Per-key rpm/tpm windows and token budgets in Redis, counted across replicas.

Implements ``auth.limits.LimitStore`` structurally (``sessions`` does not
import ``auth``): one script per call rolls the key's windows, checks the
policy and counts the request atomically, so two replicas admitting at once
never both take the last request of a minute. A refusal is built by the
local store's pure ``refusal(policy, counters, now)`` from the counters the
script returns, so both stores refuse with the same words and headers.

While Redis is down, admission falls back to counting in this process (the
``local`` store): a key's limits then hold per replica, so across N replicas
a key may get up to N times its rpm/tpm until Redis is back. Tokens charged
meanwhile stay local; the shared windows resume from what Redis holds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import structlog

from .redis_link import PREFIX, RedisDown, RedisLink

__all__ = ["RedisLimits"]

log = structlog.get_logger("poolgate.redis")

_KEY = PREFIX + "lim:"
_DAY = 86400
_KEEP_MS = 40 * _DAY * 1000  # a month's budget, and a little more

# KEYS[1] the key's counters; ARGV: mode (admit|charge|seed), now, day, month, window,
# rpm, tpm, budget_day, budget_month (-1 = none), tokens, month tokens (seed), keep (ms)
# -> {refused ('' = admitted), window_start, requests, tokens, day, day_tokens, month_tokens}
_SCRIPT = """
local k, mode = KEYS[1], ARGV[1]
local now, day, month, win = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local v = redis.call('HMGET', k, 'ws', 'req', 'tok', 'day', 'dtok', 'month', 'mtok')
local ws, req, tok = tonumber(v[1]), tonumber(v[2] or '0'), tonumber(v[3] or '0')
local d, dtok, m, mtok = tonumber(v[4] or ARGV[3]), tonumber(v[5] or '0'), tonumber(v[6] or ARGV[4]), tonumber(v[7] or '0')
if ws == nil or now - ws >= win then ws, req, tok = now, 0, 0 end
if d ~= day then
  d, dtok = day, 0
  if m ~= month then m, mtok = month, 0 end
end
local refused = ''
if mode == 'admit' then
  local rpm, tpm, bday, bmonth = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
  if rpm >= 0 and req >= rpm then refused = 'requests'
  elseif tpm >= 0 and tok >= tpm then refused = 'tokens'
  elseif bday >= 0 and dtok >= bday then refused = 'budget_day'
  elseif bmonth >= 0 and mtok >= bmonth then refused = 'budget_month'
  else req = req + 1 end
elseif mode == 'charge' then
  local n = tonumber(ARGV[10])
  tok, dtok, mtok = tok + n, dtok + n, mtok + n
else
  dtok = math.max(dtok, tonumber(ARGV[10]))
  mtok = math.max(mtok, tonumber(ARGV[11]))
end
redis.call('HSET', k, 'ws', tostring(ws), 'req', req, 'tok', tok, 'day', d, 'dtok', dtok,
           'month', m, 'mtok', mtok)
redis.call('PEXPIRE', k, ARGV[12])
return {refused, tostring(ws), req, tok, d, dtok, mtok}
"""


class _Snapshot:
    __slots__ = ("window_start", "requests", "tokens", "day", "day_tokens", "month_tokens")

    def __init__(self, reply: list[Any]) -> None:
        self.window_start = float(reply[1])
        self.requests, self.tokens, self.day, self.day_tokens, self.month_tokens = (
            int(x) for x in reply[2:7])


def _month(now: float) -> int:
    t = time.gmtime(now)
    return t.tm_year * 12 + t.tm_mon - 1


def _limit(value: int | None) -> int:
    return -1 if value is None else value


class RedisLimits:
    """``LimitStore`` in Redis; ``local`` (a ``MemoryLimits``) counts while
    Redis is down and builds the refusals; ``clock`` is wall-clock seconds."""

    def __init__(self, link: RedisLink, local: Any, *, window: float = 60.0,
                 batch: float = 0.02, clock: Callable[[], float] = time.time) -> None:
        self._link = link
        self.local = local
        self._window = window
        self._clock = clock
        self._script = link.client.register_script(_SCRIPT)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._batch = batch
        self._pending: dict[str, int] = {}
        self._flusher: asyncio.Task[Any] | None = None
        self.fallbacks = 0

    def _args(self, mode: str, now: float, *rest: Any) -> list[Any]:
        return [mode, repr(now), int(now // _DAY), _month(now), self._window, *rest, _KEEP_MS]

    async def admit(self, policy: Any) -> Any:
        now = self._clock()
        args = self._args("admit", now, _limit(policy.rpm), _limit(policy.tpm),
                          _limit(policy.budget_day), _limit(policy.budget_month), 0, 0)
        try:
            reply = await self._link.call(
                lambda: self._script(keys=[_KEY + policy.name], args=args))
        except RedisDown:
            self._fell_back("admit")
            return await self.local.admit(policy)
        if not reply[0]:
            return None
        return self.local.refusal(policy, _Snapshot(reply), now)

    def charge(self, key: str, tokens: int) -> None:
        """Queue ``tokens`` for ``key``; the queue goes to Redis in one pipeline
        ``batch`` seconds after the first charge in it (tpm windows lag that much)."""
        if tokens <= 0:
            return
        if not self._link.up:
            self._fell_back("charge")
            self.local.charge(key, tokens)
            return
        self._pending[key] = self._pending.get(key, 0) + tokens
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())
            self._tasks.add(self._flusher)
            self._flusher.add_done_callback(self._tasks.discard)

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self._batch)
        pending, self._pending, self._flusher = self._pending, {}, None
        now = self._clock()

        async def send() -> None:
            pipe = self._link.client.pipeline(transaction=False)
            for key, tokens in pending.items():
                await self._script(keys=[_KEY + key],
                                   args=self._args("charge", now, -1, -1, -1, -1, tokens, 0),
                                   client=pipe)
            await pipe.execute()
        try:
            await self._link.call(send)
        except RedisDown:
            self._fell_back("charge")
            for key, tokens in pending.items():
                self.local.charge(key, tokens)

    async def seed(self, key: str, day_tokens: int, month_tokens: int) -> None:
        await self.local.seed(key, day_tokens, month_tokens)
        args = self._args("seed", self._clock(), -1, -1, -1, -1, day_tokens, month_tokens)
        try:
            await self._link.call(lambda: self._script(keys=[_KEY + key], args=args))
        except RedisDown:
            self._fell_back("seed")

    async def forget(self, key: str) -> None:
        await self.local.forget(key)
        client = self._link.client
        try:
            await self._link.call(lambda: client.delete(_KEY + key))
        except RedisDown:
            self._fell_back("forget")

    async def flush(self) -> None:
        """Wait for the queued charges to reach Redis (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _fell_back(self, op: str) -> None:
        if self.fallbacks == 0 or self.fallbacks % 1000 == 0:
            log.warning("limits.local_fallback", op=op, fallbacks=self.fallbacks + 1)
        self.fallbacks += 1
