"""Per-key rpm/tpm windows and token budgets in Redis, counted across replicas.

Implements ``auth.limits.LimitStore`` structurally (``sessions`` does not
import ``auth``): one script per call rolls the key's windows, checks the
policy and counts requests atomically, so two replicas admitting at once
never both take the last request of a minute. A refusal is built by the
local store's pure ``refusal(policy, counters, now)`` from the counters the
script returns, so both stores refuse with the same words and headers.

The script reserves a *lease* of requests for this replica (see
``sessions.limit_leases``: its size, and the bounds on exactness it costs):
a busy key's requests are admitted from it without a round trip, the lease
is refreshed in the background, and what is left of an idle one goes back.
Token charges and lease returns are queued and sent together, in one
script call for all keys, ``batch`` seconds after the first of them.

While Redis is down, admission falls back to counting in this process (the
``local`` store): a key's rate limits then hold per replica, so across N
replicas a key may get up to N times its rpm/tpm until Redis is back.

Budgets are not lost with Redis: the local store is their floor. It starts at
the ledger's totals, takes every token this replica charges and the day's
and month's totals of every answer Redis gives, and a key over its budget by
it is refused whatever Redis says (after a ``FLUSHALL``, a restart, or while
Redis is down). Each replica keeps a marker key in Redis; when it is gone
(Redis lost its data) or after an outage, :meth:`RedisLimits.rebuild` writes
the floors of every budgeted key back (the ledger's totals, as the caller
passes them, or more), so a replica that never saw a key's usage refuses it too.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any, Callable, Mapping

import structlog

from .limit_leases import Lease
from .redis_link import RedisDown, RedisLink

__all__ = ["RedisLimits"]

log = structlog.get_logger("poolgate.redis")

_DAY = 86400
_KEEP_MS = 40 * _DAY * 1000  # a month's budget, and a little more

# KEYS: the keys' counters; ARGV: now, day, month, window, keep (ms), then for each key
# 8 values: mode (admit|charge|seed|release), rpm, tpm, budget_day, budget_month (-1 =
# none), n (admit: requests wanted; charge: tokens; seed: day tokens), m (admit, release:
# leased requests given back; seed: month tokens), the window they were leased in.
# -> for the first key: {refused ('' = admitted), window_start, requests, tokens, day,
#    day_tokens, month_tokens, requests granted}; 0 when it was a release
_SCRIPT = """
local now, day, month, win = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = 0
for i, k in ipairs(KEYS) do
  local o = 5 + (i - 1) * 8
  local mode, back, leased = ARGV[o + 1], tonumber(ARGV[o + 7]), ARGV[o + 8]
  local v = redis.call('HMGET', k, 'ws', 'req', 'tok', 'day', 'dtok', 'month', 'mtok')
  local ws, req, tok = tonumber(v[1]), tonumber(v[2] or '0'), tonumber(v[3] or '0')
  local d, dtok, m, mtok = tonumber(v[4] or ARGV[2]), tonumber(v[5] or '0'), tonumber(v[6] or ARGV[3]), tonumber(v[7] or '0')
  if mode == 'release' then
    if v[1] == leased then redis.call('HSET', k, 'req', math.max(0, req - back)) end
  else
    if mode == 'admit' and v[1] == leased then req = math.max(0, req - back) end
    if ws == nil or now - ws >= win then ws, req, tok = now, 0, 0 end
    if d ~= day then
      d, dtok = day, 0
      if m ~= month then m, mtok = month, 0 end
    end
    local refused, granted, n = '', 0, tonumber(ARGV[o + 6])
    if mode == 'admit' then
      local rpm, tpm, bday, bmonth = tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5])
      if rpm >= 0 and req >= rpm then refused = 'requests'
      elseif tpm >= 0 and tok >= tpm then refused = 'tokens'
      elseif bday >= 0 and dtok >= bday then refused = 'budget_day'
      elseif bmonth >= 0 and mtok >= bmonth then refused = 'budget_month'
      else
        granted = n
        if rpm >= 0 then granted = math.min(granted, rpm - req) end
        req = req + granted
      end
    elseif mode == 'charge' then
      tok, dtok, mtok = tok + n, dtok + n, mtok + n
    elseif mode == 'seed' then
      dtok, mtok = math.max(dtok, n), math.max(mtok, back)
    end
    redis.call('HSET', k, 'ws', tostring(ws), 'req', req, 'tok', tok, 'day', d, 'dtok', dtok,
               'month', m, 'mtok', mtok)
    redis.call('PEXPIRE', k, ARGV[5])
    if i == 1 then out = {refused, tostring(ws), req, tok, d, dtok, mtok, granted} end
  end
end
return out
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


_NONE = (-1, -1, -1, -1)


class RedisLimits:
    """``LimitStore`` in Redis; ``local`` (a ``MemoryLimits``) counts while
    Redis is down and builds the refusals; ``clock`` is wall-clock seconds;
    ``leases`` off asks Redis for every request (one round trip each)."""

    def __init__(self, link: RedisLink, local: Any, *, window: float = 60.0,
                 batch: float = 0.05, clock: Callable[[], float] = time.time,
                 leases: bool = True) -> None:
        self._link = link
        self._key = link.prefix + "lim:"
        self.local = local
        self._window = window
        self._clock = clock
        self._script = link.client.register_script(_SCRIPT)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._batch = batch
        self._charges: dict[str, int] = {}
        self._returns: dict[str, tuple[str, int]] = {}  # key -> (window, leased requests)
        self._flusher: asyncio.Task[Any] | None = None
        self._leases: dict[str, Lease] | None = {} if leases else None
        self.replica = secrets.token_hex(8)  # this process, among the replicas
        # gone when Redis lost its data
        self._marker = link.prefix + "lim-seeded:" + self.replica
        self.fallbacks = 0
        self.lease_hits = self.round_trips = 0

    def _args(self, now: float) -> list[Any]:
        """The script's arguments before the per-key ones."""
        return [repr(now), int(now // _DAY), _month(now), self._window, _KEEP_MS]

    async def admit(self, policy: Any) -> Any:
        over = self.local.over_budget(policy)  # None at once for a key without a budget
        if over is not None:
            return over
        now = self._clock()
        leases = self._leases
        if leases is None or not self._link.up:
            return await self._admit_each(policy, now)
        lease = leases.get(policy.name)
        if lease is None:
            lease = leases[policy.name] = Lease(policy, now)
        elif lease.take(policy, now, self._window):
            self.lease_hits += 1
            if lease.refreshing is None and lease.stale(now):
                self._refresh(policy, lease)
            return None
        for _ in range(2):  # wait for a lease (shared by the requests waiting with this one)
            task = lease.refreshing
            if task is None:
                back, window = lease.left, lease.window_raw  # unusable here: give it back
                lease.left = 0
                task = self._refresh(policy, lease, back, window)
            await asyncio.wait((task,))  # a cancelled request leaves the refresh running
            now = self._clock()
            if lease.take(policy, now, self._window):
                return None
            if leases.get(policy.name) is not lease or not self._link.up:
                break
            if lease.refused is not None:  # Redis's word, just now
                return self.local.refusal(policy, _Snapshot(lease.refused), now)
        return await self._admit_each(policy, now)

    async def _admit_each(self, policy: Any, now: float) -> Any:
        """One request, one round trip (no lease); this process's count while Redis is down."""
        try:
            reply = await self._run(now, [(policy.name, _op("admit", _limits(policy), 1))])
        except RedisDown:
            self._fell_back("admit")
            return await self.local.admit(policy)
        self._learn(policy, reply, now)
        if not reply[0]:
            return None
        return self.local.refusal(policy, _Snapshot(reply), now)

    async def _run(self, now: float, ops: list[tuple[str, list[Any]]]) -> Any:
        """The limit script on each ``(key, op)`` in turn: one round trip
        (:class:`RedisDown` when out of reach); the reply of the first."""
        keys = [self._key + key for key, _ in ops]
        args = self._args(now) + [value for _, op in ops for value in op]
        self.round_trips += 1
        return await self._link.call(lambda: self._script(keys=keys, args=args))

    def _refresh(self, policy: Any, lease: Lease, back: int = 0,
                 window: str = "") -> asyncio.Task[Any]:
        """Ask Redis for a lease (giving ``back`` requests of ``window`` back), in a task."""
        now = self._clock()
        op = _op("admit", _limits(policy), lease.want(policy, now), back, window)
        task = lease.refreshing = self._spawn(self._leased(policy, lease, now, op))
        return task

    async def _leased(self, policy: Any, lease: Lease, now: float, op: list[Any]) -> None:
        try:
            reply = await self._run(now, [(policy.name, op)])
        except RedisDown:
            self._fell_back("lease")
            lease.refused = None
            return
        finally:
            lease.refreshing = None
        self._learn(policy, reply, now)
        if self._leases is not None and self._leases.get(policy.name) is lease:
            lease.granted(policy, reply, now)
            self._expire_later(policy.name, lease)
        elif int(reply[7]):  # forgotten meanwhile
            self._give_back(policy.name, _text(reply[1]), int(reply[7]))

    def _learn(self, policy: Any, reply: list[Any], now: float) -> None:
        """Raise the budget floor of ``policy``'s key to the totals Redis counted."""
        if ((policy.budget_day is not None or policy.budget_month is not None)
                and int(reply[4]) == int(now // _DAY)):
            self.local.raise_to(policy.name, int(reply[5]), int(reply[6]))

    def _expire_later(self, key: str, lease: Lease) -> None:
        if lease.timer is None:
            delay = max(0.0, lease.expires - self._clock()) + 0.01
            lease.timer = asyncio.get_running_loop().call_later(delay, self._expire, key, lease)

    def _expire(self, key: str, lease: Lease) -> None:
        lease.timer = None
        if self._leases is None or self._leases.get(key) is not lease:
            return
        if self._clock() < lease.expires:
            self._expire_later(key, lease)
        elif lease.left > 0:  # idle: the other replicas may use what is left of it
            self._give_back(key, lease.window_raw, lease.left)
            lease.left = 0

    def _give_back(self, key: str, window: str, requests: int) -> None:
        held = self._returns.get(key)
        if held is not None and held[0] == window:
            requests += held[1]
        self._returns[key] = (window, requests)
        self._flush_later()

    def charge(self, key: str, tokens: int) -> None:
        """Queue ``tokens`` for ``key``; the queue goes to Redis in one script call
        ``batch`` seconds after the first charge in it (tpm windows lag that much)."""
        if tokens <= 0:
            return
        self.local.charge(key, tokens)  # the budget floor; the windows while Redis is down
        if not self._link.up:
            self._fell_back("charge")
            return
        lease = self._leases.get(key) if self._leases is not None else None
        if lease is not None:
            lease.charged(tokens)
        self._charges[key] = self._charges.get(key, 0) + tokens
        self._flush_later()

    def _flush_later(self) -> None:
        if self._flusher is None:
            self._flusher = self._spawn(self._flush_soon())

    def _spawn(self, work: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self._batch)
        charges, self._charges = self._charges, {}
        returns, self._returns = self._returns, {}
        self._flusher = None
        ops = [(key, _op("charge", _NONE, tokens)) for key, tokens in charges.items()]
        ops += [(key, _op("release", _NONE, 0, requests, window))
                for key, (window, requests) in returns.items()]
        try:
            await self._run(self._clock(), ops)
        except RedisDown:
            self._fell_back("charge")  # counted locally already (see ``charge``)

    def budget_used(self, key: str) -> tuple[int, int]:
        """Today's and this month's tokens of ``key`` as this replica knows them:
        the totals Redis last returned (every replica's) and its own charges since."""
        return self.local.budget_used(key)

    async def seed(self, key: str, day_tokens: int, month_tokens: int) -> None:
        await self.local.seed(key, day_tokens, month_tokens)
        self._drop_lease(key)
        try:
            await self._run(self._clock(), [(key, _op("seed", _NONE, day_tokens, month_tokens))])
        except RedisDown:
            self._fell_back("seed")

    async def rebuild(self, totals: Mapping[str, tuple[int, int]]) -> None:
        """Seed each key of ``totals`` here, then in Redis with the larger of
        those and this replica's floor (in one script call), and mark Redis as
        seeded by this replica."""
        await self.local.rebuild(totals)
        ops = [(key, _op("seed", _NONE, *self.local.budget_used(key))) for key in totals]
        client, marker = self._link.client, self._marker
        try:
            if ops:
                await self._run(self._clock(), ops)
            await self._link.call(lambda: client.set(marker, 1, px=_KEEP_MS))
        except RedisDown:
            self._fell_back("seed")

    async def lost(self) -> bool:
        """Whether Redis lost what this replica seeded (flushed, or restarted
        empty); :class:`RedisDown` when out of reach."""
        client, marker = self._link.client, self._marker
        return not await self._link.call(lambda: client.exists(marker))

    async def forget(self, key: str) -> None:
        await self.local.forget(key)
        self._drop_lease(key)
        self._returns.pop(key, None)
        client = self._link.client
        try:
            await self._link.call(lambda: client.delete(self._key + key))
        except RedisDown:
            self._fell_back("forget")

    def _drop_lease(self, key: str) -> None:
        lease = self._leases.pop(key, None) if self._leases is not None else None
        if lease is not None and lease.timer is not None:
            lease.timer.cancel()

    async def flush(self) -> None:
        """Wait for the queued charges and lease refreshes to reach Redis (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        """Shutting down: give every lease back and send what is queued (each
        bounded by the link's timeout), so other replicas may use the leased requests."""
        leases, self._leases = self._leases, None  # from now on, one round trip per request
        for key, lease in (leases or {}).items():
            if lease.timer is not None:
                lease.timer.cancel()
                lease.timer = None
            if lease.left > 0:
                self._give_back(key, lease.window_raw, lease.left)
                lease.left = 0
        await self.flush()

    def stats(self) -> dict[str, int]:
        return {"lease_hits": self.lease_hits, "round_trips": self.round_trips,
                "fallbacks": self.fallbacks}

    def _fell_back(self, op: str) -> None:
        if self.fallbacks == 0 or self.fallbacks % 1000 == 0:
            log.warning("limits.local_fallback", op=op, fallbacks=self.fallbacks + 1)
        self.fallbacks += 1


def _op(mode: str, limits: tuple[int, ...], n: int = 0, m: int = 0,
        window: str = "") -> list[Any]:
    """One key's arguments to the script (see ``_SCRIPT``)."""
    return [mode, *limits, n, m, window]


def _limits(policy: Any) -> tuple[int, ...]:
    return (_limit(policy.rpm), _limit(policy.tpm), _limit(policy.budget_day),
            _limit(policy.budget_month))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
