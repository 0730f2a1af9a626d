"""A key's requests in flight counted across replicas, in Redis, for its
``max_in_flight``.

Each replica counts the slots it *reserved* in one field of the key's hash
(``inf:<key id>``: replica id -> slots), so what a replica holds is its own to
correct. A replica that dies must not hold its slots forever: every call
also stamps the replica's deadline in the ``inf-alive`` hash (Redis's clock,
``ttl`` ahead), the health probe renews it, and a take ignores and deletes
the fields of replicas past their deadline. A dead replica's slots are
therefore void after at most ``ttl`` seconds.

Reservations keep a busy key off Redis: a take that finds no spare slot
reserved here asks Redis for as many as this replica already holds (doubling
while it grows), at most 1/``SHARE`` of what is left under the limit (so
near the limit, and for any limit under ``SHARE``, one slot: no spare); the
next takes use the spares without a round trip. The limit is never
exceeded (slots are reserved atomically); a refusal may come early by the
spares other replicas hold: at most 1/``SHARE`` of the limit each, at most
twice their recent peak use, given back at most 2 × ``LIFETIME`` seconds after their
key's last take here.
A request that ends hands its slot to the first request of the same key
waiting on this replica (no round trip, in arrival order); requests waiting
for other replicas' slots look again at growing intervals. Give-backs are
queued and sent together ``batch`` seconds later, one script call for all keys.

Redis lost or out of reach: a take while Redis is down uses a spare, or is
granted here uncounted (the replica's own per-key limit still holds, so
across N replicas a key may get up to N times its limit until Redis is back).
After an outage or a flush, :meth:`RedisSlots.beat` with ``republish`` writes
this replica's reservations back whole, so give-backs lost meanwhile leave
no phantom slots and a flushed Redis knows again what is in flight.
"""

from __future__ import annotations

import asyncio
from collections import deque
from functools import partial
from typing import Any

import structlog

from .redis_link import RedisDown, RedisLink

__all__ = ["RedisSlots", "TTL", "SHARE", "LIFETIME"]

log = structlog.get_logger("poolgate.redis")

#: seconds a replica's slots count without it renewing its deadline
TTL = 10.0
#: a reservation is at most 1/SHARE of the slots left under the limit
SHARE = 16
#: seconds spare slots stay reserved here without a take
LIFETIME = 1.0
_FORGET_MS = 3600 * 1000  # a replica silent this long leaves the alive hash

_CLOCK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: the key's hash, the alive hash; ARGV: replica, limit, ttl (ms), slots wanted,
# share -> slots reserved (0: the key has its limit in flight)
_TAKE = _CLOCK + """
local me, limit = ARGV[1], tonumber(ARGV[2])
redis.call('HSET', KEYS[2], me, now + tonumber(ARGV[3]))
local held = redis.call('HGETALL', KEYS[1])
local total = 0
for i = 1, #held, 2 do
  if held[i] ~= me and tonumber(redis.call('HGET', KEYS[2], held[i]) or '0') < now then
    redis.call('HDEL', KEYS[1], held[i])
  else
    total = total + tonumber(held[i + 1])
  end
end
if total >= limit then return 0 end
local n = math.min(tonumber(ARGV[4]), math.max(1, math.floor((limit - total) / tonumber(ARGV[5]))))
redis.call('HINCRBY', KEYS[1], me, n)
return n
"""

# KEYS: the keys' hashes; ARGV: replica, then the slots given back of each key
_GIVE = """
for i, k in ipairs(KEYS) do
  if redis.call('HINCRBY', k, ARGV[1], -tonumber(ARGV[i + 1])) <= 0 then
    redis.call('HDEL', k, ARGV[1])
  end
end
return 0
"""

# KEYS: the alive hash, then the keys' hashes to write; ARGV: replica, ttl (ms),
# forget (ms), then the slots held of each key
_BEAT = _CLOCK + """
local me = ARGV[1]
redis.call('HSET', KEYS[1], me, now + tonumber(ARGV[2]))
local alive = redis.call('HGETALL', KEYS[1])
for i = 1, #alive, 2 do
  if tonumber(alive[i + 1]) < now - tonumber(ARGV[3]) then redis.call('HDEL', KEYS[1], alive[i]) end
end
for i = 2, #KEYS do
  local n = tonumber(ARGV[i + 2])
  if n > 0 then redis.call('HSET', KEYS[i], me, n) else redis.call('HDEL', KEYS[i], me) end
end
return 0
"""


class RedisSlots:
    """Shared in-flight slots per key; ``replica`` names this process's field."""

    def __init__(self, link: RedisLink, replica: str, *, ttl: float = TTL,
                 batch: float = 0.05) -> None:
        self._link = link
        self.replica = replica
        self._key, self._alive = link.prefix + "inf:", link.prefix + "inf-alive"
        self._ttl_ms = int(ttl * 1000)
        self._batch = batch
        client = link.client
        self._take = client.register_script(_TAKE)
        self._give = client.register_script(_GIVE)
        self._beat = client.register_script(_BEAT)
        self._held: dict[str, int] = {}      # slots in use here, per key
        self._reserved: dict[str, int] = {}  # slots Redis counts for this replica, per key
        self._limits: dict[str, int] = {}    # each key's limit, as last taken
        self._peak: dict[str, int] = {}      # most slots in use lately (halved each sweep)
        self._seen: set[str] = set()         # keys this replica ever reserved slots of
        self._taken: set[str] = set()        # keys taken since the last sweep of spares
        self._returns: dict[str, int] = {}   # give-backs not sent yet
        self._flusher: asyncio.Task[Any] | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._writing = asyncio.Lock()  # give-backs and republishing, one at a time
        self._waiting: dict[str, deque[asyncio.Future[bool]]] = {}  # requests waiting here
        self.takes = self.spares = self.round_trips = self.refusals = self.fallbacks = 0
        self.handoffs = 0

    async def take(self, key: str, limit: int) -> bool:
        """One slot of ``key`` if fewer than ``limit`` are held across the
        replicas (True), else False; True while Redis is down (counted here)."""
        self.takes += 1
        self._taken.add(key)
        self._limits[key] = limit
        held = self._held.get(key, 0)
        if self._reserved.get(key, 0) > held:  # a spare: no round trip
            self.spares += 1
            self._held[key] = held + 1
            if held >= self._peak.get(key, 0):
                self._peak[key] = held + 1
            return True
        if self._link.up:
            self.round_trips += 1
            keys = [self._key + key, self._alive]
            args = [self.replica, limit, self._ttl_ms, max(1, held), SHARE]
            task = asyncio.ensure_future(self._link.call(lambda: self._take(keys=keys, args=args)))
            try:
                reserved = await asyncio.shield(task)  # a cancelled caller leaves it to settle
            except RedisDown:
                pass
            except asyncio.CancelledError:
                task.add_done_callback(partial(self._abandoned, key))
                raise
            else:
                if not reserved:
                    self.refusals += 1
                    return False
                self._reserve(key, int(reserved))
                held = self._held[key] = self._held.get(key, 0) + 1
                if held > self._peak.get(key, 0):
                    self._peak[key] = held
                self._trim(key)
                return True
        self.fallbacks += 1
        self._held[key] = held + 1
        return True

    def _reserve(self, key: str, slots: int) -> None:
        self._reserved[key] = self._reserved.get(key, 0) + slots
        self._seen.add(key)

    def _abandoned(self, key: str, task: asyncio.Future[Any]) -> None:
        """A take whose caller was cancelled: what it reserved is spare."""
        if not task.cancelled() and task.exception() is None and task.result():
            self._reserve(key, int(task.result()))
            self._trim(key)

    async def wait(self, key: str, timeout: float) -> bool:
        """Wait up to ``timeout`` for a slot of ``key`` handed over by a request
        of this replica that ends (True: it is the caller's now), in arrival order."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        queue = self._waiting.setdefault(key, deque())
        queue.append(future)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError:  # handed over just as the time ran out: it is still ours
            return future.done() and not future.cancelled()
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # handed over as the caller left
                self.give_back(key)
            raise
        finally:
            future.cancel()  # no-op once it has a result
            if future in queue:
                queue.remove(future)
            if not queue and self._waiting.get(key) is queue:
                del self._waiting[key]

    def give_back(self, key: str) -> None:
        """A request of ``key`` ended (no-op for a key holding no slot here):
        its slot goes to the first request of this replica waiting for one, or back."""
        held = self._held.get(key)
        if not held:
            return
        queue = self._waiting.get(key)
        if queue:
            for future in queue:
                if not future.done():
                    future.set_result(True)  # the slot stays held: the waiter's now
                    self.handoffs += 1
                    return
        if held == 1:
            del self._held[key]
        else:
            self._held[key] = held - 1
        self._trim(key)

    def _trim(self, key: str) -> None:
        """Give back the spares of ``key`` beyond what it may keep; sweep the rest later."""
        reserved = self._reserved.get(key, 0)
        held = self._held.get(key, 0)
        keep = min(self._limits.get(key, 0) // SHARE, 2 * max(self._peak.get(key, 0), 1))
        extra = reserved - held - keep
        if extra > 0:
            self._unreserve(key, min(extra, reserved))
        if self._reserved.get(key, 0) > held and self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(LIFETIME, self._sweep)

    def _unreserve(self, key: str, slots: int) -> None:
        left = self._reserved.get(key, 0) - slots
        if left > 0:
            self._reserved[key] = left
        else:
            self._reserved.pop(key, None)
        self._returns[key] = self._returns.get(key, 0) + slots
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())

    def _sweep(self) -> None:
        """Spares of keys not taken for ``LIFETIME`` go back to the other replicas;
    the others keep up to twice their recent peak (which halves each sweep)."""
        self._sweeper = None
        taken, self._taken = self._taken, set()
        spare = False
        for key, peak in list(self._peak.items()):
            held = self._held.get(key, 0)
            if max(held, peak // 2):
                self._peak[key] = max(held, peak // 2)
            else:
                del self._peak[key]
        for key, reserved in list(self._reserved.items()):
            held = self._held.get(key, 0)
            if reserved > held:
                if key in taken:
                    spare = True
                else:
                    self._unreserve(key, reserved - held)
        if spare:
            self._sweeper = asyncio.get_running_loop().call_later(LIFETIME, self._sweep)

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self._batch)
        async with self._writing:
            returns, self._returns = self._returns, {}
            self._flusher = None
            if not returns:
                return
            keys = [self._key + key for key in returns]
            args = [self.replica, *returns.values()]
            try:
                await self._link.call(lambda: self._give(keys=keys, args=args))
            except RedisDown:
                pass  # the counts are written whole again when Redis is back (beat)

    async def beat(self, republish: bool = False) -> None:
        """Renew this replica's deadline (with the health probe); ``republish``
        (after an outage or a flush): write its reservations whole, in place
        of what Redis has or lost. :class:`RedisDown` when out of reach."""
        async with self._writing:
            keys = [self._alive]
            args: list[Any] = [self.replica, self._ttl_ms, _FORGET_MS]
            if republish:
                self._returns.clear()  # the counts below already have them
                for key in self._seen:
                    keys.append(self._key + key)
                    args.append(self._reserved.get(key, 0))
            await self._link.call(lambda: self._beat(keys=keys, args=args))
            if republish:
                self._seen = set(self._reserved)
                log.info("slots.republished", keys=len(keys) - 1)

    async def aclose(self) -> None:
        """Shutting down: send the give-backs queued, and leave the alive hash
        (what this replica still holds is void at once)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        client, alive, me = self._link.client, self._alive, self.replica
        try:
            await self._link.call(lambda: client.hdel(alive, me))
        except RedisDown:
            pass

    def stats(self) -> dict[str, int]:
        return {"takes": self.takes, "spares": self.spares, "round_trips": self.round_trips,
                "refusals": self.refusals, "fallbacks": self.fallbacks, "handoffs": self.handoffs,
                "held": sum(self._held.values()), "reserved": sum(self._reserved.values())}
