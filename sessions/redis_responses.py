"""Stored responses in Redis, shared by every replica.

Layout (all under the link's prefix, ``poolgate:`` by default): an entry is the hash ``r:<id>`` with the
serialised entry ``d``, the id it continued ``p`` and its owner ``o``, with a
time to live of ``max_age`` (the age bound, kept by Redis itself). The
bookkeeping for the count and byte bounds lives in ``rs:*``: each owner's
entries by storage time (a sorted set), each entry's owner and size, each
owner's count and bytes, and the totals; and the item index: each owner's
item ids (``rs:idx:<owner>``, item id -> the response that first stored it)
with each entry's item ids (``rs:items``), so an entry leaves the index when
it is dropped, however it goes. One script stores an entry and
evicts, by the same rule as :class:`~sessions.responses.MemoryResponseStore`
(the oldest entry of the owner holding the most: bytes when the byte bound is
hit, entries when the count bound is) whichever replica writes; another
follows a ``previous_response_id`` chain server-side; a third resolves
``item_reference`` ids through the index. Each request costs one round
trip. Times are Redis's (``TIME``), so replicas' clocks do not matter.

Entries that expired by time to live stay in the bookkeeping until their
owner next stores (they are reaped then) or until eviction reaches them;
until then they count towards the bounds, which only makes eviction earlier.

The scripts name keys they compute (one Redis, not a cluster). While Redis
is down every method raises :class:`~sessions.redis_link.StoreUnavailable`
(a 503): a stored response cannot be served from one replica's memory
without the others disagreeing about it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .redis_link import RedisDown, RedisLink, StoreUnavailable
from .responses import MAX_CHAIN, StoredResponse, dumps, item_ids, loads, pick_items

__all__ = ["RedisResponseStore"]

# KEYS[1], KEYS[2]: the prefixes of the entries and of the bookkeeping (``<prefix>r:``, ``rs:``)
_COMMON = """
local E, B = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function drop(rid)
  local o = redis.call('HGET', B .. 'owner', rid)
  if not o then return 0 end
  local sz = tonumber(redis.call('HGET', B .. 'size', rid) or '0')
  redis.call('HDEL', B .. 'owner', rid)
  redis.call('HDEL', B .. 'size', rid)
  local items = redis.call('HGET', B .. 'items', rid)
  if items then
    for _, iid in ipairs(cjson.decode(items)) do
      if redis.call('HGET', B .. 'idx:' .. o, iid) == rid then
        redis.call('HDEL', B .. 'idx:' .. o, iid)
      end
    end
    redis.call('HDEL', B .. 'items', rid)
  end
  redis.call('ZREM', B .. 'own:' .. o, rid)
  local live = redis.call('DEL', E .. rid)
  if redis.call('HINCRBY', B .. 'count', o, -1) <= 0 then
    redis.call('HDEL', B .. 'count', o)
    redis.call('HDEL', B .. 'bytes', o)
  else
    redis.call('HINCRBY', B .. 'bytes', o, -sz)
  end
  redis.call('HINCRBY', B .. 'total', 'count', -1)
  redis.call('HINCRBY', B .. 'total', 'bytes', -sz)
  return live
end
"""

# ARGV: id, owner, size, data, previous id ('' = none), max_items, max_bytes, max_age (ms),
# then the entry's item ids -> {stored (1/0), evicted, expired}
_PUT = _COMMON + """
local id, owner, size = ARGV[1], ARGV[2], tonumber(ARGV[3])
local max_items, max_bytes, max_age = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
drop(id)
if size > max_bytes then return {0, 0, 0} end
local expired, evicted = 0, 0
local old = redis.call('ZRANGEBYSCORE', B .. 'own:' .. owner, '-inf', now - max_age, 'LIMIT', 0, 64)
for _, rid in ipairs(old) do drop(rid); expired = expired + 1 end
while true do
  local count = tonumber(redis.call('HGET', B .. 'total', 'count') or '0')
  local bytes = tonumber(redis.call('HGET', B .. 'total', 'bytes') or '0')
  local by_bytes = bytes + size > max_bytes
  if count <= 0 or (count < max_items and not by_bytes) then break end
  local flat = redis.call('HGETALL', B .. (by_bytes and 'bytes' or 'count'))
  local best, most = nil, -1
  for i = 1, #flat, 2 do
    local v = tonumber(flat[i + 1])
    if best == nil or v > most or (v == most and flat[i] < best) then best, most = flat[i], v end
  end
  if best == nil then break end
  local oldest = redis.call('ZRANGE', B .. 'own:' .. best, 0, 0)
  if #oldest == 0 then
    redis.call('HDEL', B .. 'count', best)
    redis.call('HDEL', B .. 'bytes', best)
  elseif drop(oldest[1]) == 1 then
    evicted = evicted + 1
  else
    expired = expired + 1
  end
end
redis.call('HSET', E .. id, 'd', ARGV[4], 'p', ARGV[5], 'o', owner)
redis.call('PEXPIRE', E .. id, max_age)
redis.call('HSET', B .. 'owner', id, owner)
redis.call('HSET', B .. 'size', id, size)
redis.call('ZADD', B .. 'own:' .. owner, now, id)
redis.call('HINCRBY', B .. 'count', owner, 1)
redis.call('HINCRBY', B .. 'bytes', owner, size)
redis.call('HINCRBY', B .. 'total', 'count', 1)
redis.call('HINCRBY', B .. 'total', 'bytes', size)
if #ARGV > 8 then
  local items = {}
  for i = 9, #ARGV do
    items[#items + 1] = ARGV[i]
    redis.call('HSETNX', B .. 'idx:' .. owner, ARGV[i], id)
  end
  redis.call('HSET', B .. 'items', id, cjson.encode(items))
end
return {1, evicted, expired}
"""

# ARGV: id -> 1 when a live entry was deleted
_DELETE = _COMMON + """
if redis.call('EXISTS', E .. ARGV[1]) == 0 then drop(ARGV[1]); return 0 end
return drop(ARGV[1])
"""

# KEYS: as _COMMON; ARGV: owner -> the entries deleted (a deleted key's, in one call)
_DELETE_OWNER = _COMMON + """
local n = 0
for _, rid in ipairs(redis.call('ZRANGE', B .. 'own:' .. ARGV[1], 0, -1)) do
  drop(rid)
  n = n + 1
end
redis.call('DEL', B .. 'own:' .. ARGV[1], B .. 'idx:' .. ARGV[1])
return n
"""

# KEYS[1]: the entries' prefix; ARGV: id, limit -> {entries newest first, the first missing
# link or ''}
_CHAIN = """
local out, seen, id = {}, {}, ARGV[1]
local limit = tonumber(ARGV[2])
while true do
  if seen[id] or #out >= limit then return {out, id} end
  local v = redis.call('HMGET', KEYS[1] .. id, 'd', 'p')
  if not v[1] then return {out, id} end
  seen[id] = true
  out[#out + 1] = v[1]
  if not v[2] or v[2] == '' then return {out, ''} end
  id = v[2]
end
"""

# KEYS as for _COMMON; ARGV: owner, item ids -> {the response id holding each item ('' =
# none), the entries of those responses (each once, as stored): id, data, id, data, ...}
_ITEMS = """
local index, out, entries, seen = KEYS[2] .. 'idx:' .. ARGV[1], {}, {}, {}
for i = 2, #ARGV do
  local rid = redis.call('HGET', index, ARGV[i])
  out[#out + 1] = rid or ''
  if rid and not seen[rid] then
    seen[rid] = true
    local data = redis.call('HGET', KEYS[1] .. rid, 'd')
    if data then
      entries[#entries + 1] = rid
      entries[#entries + 1] = data
    end
  end
end
return {out, entries}
"""


class RedisResponseStore:
    """:class:`~sessions.responses.ResponseStore` in Redis (see the module doc)."""

    def __init__(self, link: RedisLink, *, max_items: int = 10_000,
                 max_bytes: int = 256 * 2**20, max_age: float = 30 * 24 * 3600) -> None:
        if max_items < 1 or max_bytes < 1 or max_age <= 0:
            raise ValueError("max_items, max_bytes and max_age must be positive")
        self._link = link
        self._limits = (max_items, max_bytes, int(max_age * 1000))
        self._entry = link.prefix + "r:"
        self._keys = [self._entry, link.prefix + "rs:"]  # the prefixes the scripts build on
        client = link.client
        self._put = client.register_script(_PUT)
        self._delete = client.register_script(_DELETE)
        self._chain = client.register_script(_CHAIN)
        self._delete_owner = client.register_script(_DELETE_OWNER)
        self._items = client.register_script(_ITEMS)
        self._counts = {"stored": 0, "evicted": 0, "expired": 0, "rejected": 0, "unavailable": 0}

    @property
    def available(self) -> bool:
        """Whether Redis answers now (a request that needs the store checks first)."""
        return self._link.up

    async def _call(self, make: Any) -> Any:
        try:
            return await self._link.call(make)
        except RedisDown:
            self._counts["unavailable"] += 1
            raise StoreUnavailable(
                "Stored responses are unavailable: the gateway's shared store (Redis) is not "
                "reachable. Retry shortly, or send the full input with store=false.") from None

    async def put(self, item: StoredResponse) -> None:
        data = dumps(item)
        max_items, max_bytes, max_age = self._limits
        stored, evicted, expired = await self._call(lambda: self._put(keys=self._keys, args=[
            item.id, item.owner, len(data), data, item.previous_id or "",
            max_items, max_bytes, max_age, *item_ids(item)]))
        counts = self._counts
        counts["stored" if stored else "rejected"] += 1
        counts["evicted"] += evicted
        counts["expired"] += expired

    async def get(self, response_id: str) -> StoredResponse | None:
        client = self._link.client
        data = await self._call(lambda: client.hget(self._entry + response_id, "d"))
        return None if data is None else loads(data)

    async def delete(self, response_id: str) -> bool:
        return bool(await self._call(lambda: self._delete(keys=self._keys, args=[response_id])))

    async def delete_owner(self, owner: str) -> int:
        return int(await self._call(lambda: self._delete_owner(keys=self._keys, args=[owner])))

    async def get_chain(self, response_id: str) -> tuple[list[StoredResponse], str | None]:
        found, missing = await self._call(lambda: self._chain(keys=self._keys[:1], args=[response_id, MAX_CHAIN]))
        if isinstance(missing, bytes):
            missing = missing.decode()
        return [loads(data) for data in found], (missing or None)

    async def get_items(self, owner: str,
                        wanted: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        if not wanted:
            return {}
        where, flat = await self._call(lambda: self._items(keys=self._keys,
                                                           args=[owner, *wanted]))
        entries = {_text(flat[i]): loads(flat[i + 1]) for i in range(0, len(flat), 2)}
        return pick_items(entries, {item_id: _text(rid) for item_id, rid in zip(wanted, where)
                                    if rid}, owner)

    def stats(self) -> dict[str, Any]:
        max_items, max_bytes, _ = self._limits
        return {**self._counts, "max_items": max_items, "max_bytes": max_bytes,
                "available": int(self._link.up)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
