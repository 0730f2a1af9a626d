"""Stored Responses: what ``previous_response_id``, ``GET``/``DELETE
/v1/responses/{id}`` and ``/v1/responses/{id}/input_items`` read back.

One :class:`ResponseStore` interface; :class:`MemoryResponseStore` keeps
entries in this process (a Redis store joins behind the same interface, which
is why every method is async and an entry round-trips through
:func:`dumps`/:func:`loads`).

Chains are stored by reference: an entry holds its own input items and
response plus the id of the response it followed (``previous_id``), so a turn
costs what it adds, not the whole conversation again. A follow-up reads the
chain back link by link (:func:`load_chain`). When a link is gone (evicted,
expired or deleted), the chain is *broken*: :class:`BrokenChain` names the
missing link and the follow-up is refused; it never continues from a shorter,
wrong history.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import orjson

__all__ = ["StoredResponse", "ResponseStore", "MemoryResponseStore", "BrokenChain", "load_chain",
           "conversation", "chain_input_items", "dumps", "loads", "follow_links", "MAX_CHAIN",
           "item_ids", "pick_items"]

#: links followed at most (a guard against a corrupt store, far beyond real conversations)
MAX_CHAIN = 100_000


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored answer. ``response`` is the Response object as returned to
    the client; ``input_items`` this request's input items (with ids);
    ``previous_id`` the response it continued (``previous_response_id``), or
    None; ``worker`` the worker that served it (for affinity); ``created_at``
    wall-clock seconds; ``owner`` the id of the API key that created it (a
    config key's id is its name; ``anonymous`` with auth off): only that key
    may read, delete or continue it, and deleting the key deletes it."""

    id: str
    response: Mapping[str, Any]
    input_items: tuple[Mapping[str, Any], ...]
    previous_id: str | None
    worker: str | None
    created_at: float
    owner: str = "anonymous"


class ResponseStore(Protocol):
    async def put(self, item: StoredResponse) -> None:
        """Store ``item``, replacing an entry with the same id."""
        ...

    async def get(self, response_id: str) -> StoredResponse | None:
        """The entry, or ``None`` when unknown or expired."""
        ...

    async def delete(self, response_id: str) -> bool:
        """``True`` if there was an entry to delete."""
        ...

    async def delete_owner(self, owner: str) -> int:
        """Delete every entry of ``owner`` (a deleted key's id); how many there were."""
        ...

    async def get_chain(self, response_id: str) -> tuple[list[StoredResponse], str | None]:
        """The entries from ``response_id`` back along ``previous_id``, newest
        first, and the first link that is missing (or repeats, or lies beyond
        :data:`MAX_CHAIN`), ``None`` when the chain is whole. One round trip
        for a shared store."""
        ...

    async def get_items(self, owner: str,
                        wanted: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        """The input and output items with the ids ``wanted`` of ``owner``'s
        stored responses (what ``item_reference`` input items name), by id;
        an id unknown, expired, or another owner's is absent. One round
        trip for a shared store."""
        ...

    def stats(self) -> dict[str, int]: ...


class BrokenChain(LookupError):
    """A link of a ``previous_response_id`` chain is no longer stored."""

    def __init__(self, missing: str) -> None:
        super().__init__(missing)
        self.missing = missing


async def load_chain(store: ResponseStore, response_id: str,
                     owner: str) -> list[StoredResponse] | None:
    """The chain ending at ``response_id``, oldest first; ``None`` when that
    response is unknown or not ``owner``'s; :class:`BrokenChain` when an
    earlier link is gone (or, which cannot happen through the API, not ``owner``'s)."""
    chain, missing = await store.get_chain(response_id)
    if not chain or chain[0].owner != owner:
        return None
    for item in chain:
        if item.owner != owner:
            raise BrokenChain(item.id)
    if missing is not None:
        raise BrokenChain(missing)
    chain.reverse()
    return chain


async def follow_links(get: Callable[[str], Any],
                       response_id: str) -> tuple[list[StoredResponse], str | None]:
    """:meth:`ResponseStore.get_chain` by one ``get`` per link."""
    chain: list[StoredResponse] = []
    seen: set[str] = set()
    link: str | None = response_id
    while link is not None:
        if link in seen or len(chain) >= MAX_CHAIN:
            return chain, link
        item = await get(link)
        if item is None:
            return chain, link
        seen.add(link)
        chain.append(item)
        link = item.previous_id
    return chain, None


def conversation(chain: Sequence[StoredResponse]) -> list[dict[str, Any]]:
    """The items a follow-up to the last response of ``chain`` must see, in
    order: each turn's input, then its response's output.

    Shallow copies: the caller may add or change keys, not nested values.
    """
    out: list[dict[str, Any]] = []
    for item in chain:
        out += [dict(i) for i in item.input_items]
        out += [dict(i) for i in item.response.get("output") or ()]
    return out


def chain_input_items(chain: Sequence[StoredResponse]) -> list[Mapping[str, Any]]:
    """What the last response of ``chain`` was generated from: the earlier
    turns (inputs and outputs), then its own input items."""
    return [*conversation(chain[:-1]), *chain[-1].input_items]


def item_ids(item: StoredResponse) -> list[str]:
    """The ids of ``item``'s output and input items (what a reference may name), once each."""
    ids: dict[str, None] = {}
    for one in (*(item.response.get("output") or ()), *item.input_items):
        found = one.get("id") if isinstance(one, Mapping) else None
        if type(found) is str:
            ids[found] = None
    return list(ids)


def pick_items(entries: Mapping[str, StoredResponse | None], where: Mapping[str, str],
               owner: str) -> dict[str, Mapping[str, Any]]:
    """The items ``where`` places (item id -> response id) found in ``entries``
    (response id -> entry, ``None`` when gone), ``owner``'s only: an index
    entry pointing at a response that no longer holds the item finds nothing."""
    found: dict[str, Mapping[str, Any]] = {}
    for item_id, response_id in where.items():
        entry = entries.get(response_id)
        if entry is None or entry.owner != owner:
            continue
        for one in (*(entry.response.get("output") or ()), *entry.input_items):
            if isinstance(one, Mapping) and one.get("id") == item_id:
                found[item_id] = one
                break
    return found


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def dumps(item: StoredResponse) -> bytes:
    """The entry as JSON bytes (what a shared store keeps)."""
    return orjson.dumps({"id": item.id, "response": item.response,
                         "input_items": item.input_items, "previous_id": item.previous_id,
                         "worker": item.worker, "created_at": item.created_at,
                         "owner": item.owner},
                        default=_json_default)


def loads(raw: bytes | str) -> StoredResponse:
    """The inverse of :func:`dumps`."""
    obj = orjson.loads(raw)
    return StoredResponse(id=obj["id"], response=obj["response"],
                          input_items=tuple(obj["input_items"]),
                          previous_id=obj.get("previous_id"), worker=obj["worker"],
                          created_at=obj["created_at"], owner=obj.get("owner", "anonymous"))


class MemoryResponseStore:
    """A :class:`ResponseStore` in this process, bounded three ways.

    ``max_items`` entries and ``max_bytes`` (each entry's size is estimated
    once, as the length of :func:`dumps`: its own items, not its chain's) are
    kept by evicting the oldest entry *of the owner that holds the most*
    (bytes when the byte bound is hit, entries when the count bound is), so
    one key's long chain pushes out its own oldest turns, not other keys'
    responses. An entry older than ``max_age`` seconds (by ``clock``, from
    when it was stored) is gone: dropped when read and when it reaches the
    front of the queue. An entry larger than ``max_bytes`` on its own is not
    stored.

    Each owner's item ids (input and output) lead to the response that first
    stored them, for ``item_reference`` inputs; an entry leaves that index
    when it goes.

    No method awaits, so each runs whole between two steps of the event loop
    and concurrent requests cannot interleave inside one.
    """

    def __init__(self, *, max_items: int = 10_000, max_bytes: int = 256 * 2**20,
                 max_age: float = 30 * 24 * 3600,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_items < 1 or max_bytes < 1 or max_age <= 0:
            raise ValueError("max_items, max_bytes and max_age must be positive")
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._max_age = max_age
        self._clock = clock
        # id -> (entry, size, stored at); insertion order is storage order
        self._entries: OrderedDict[str, tuple[StoredResponse, int, float]] = OrderedDict()
        self._owners: dict[str, _Owner] = {}
        # (owner, item id) -> the response that first stored an item with that id
        self._item_index: dict[tuple[str, str], str] = {}
        self._bytes = 0
        self._evicted = 0
        self._expired = 0
        self._rejected = 0

    async def put(self, item: StoredResponse) -> None:
        size = len(dumps(item))
        now = self._clock()
        self._drop(item.id)
        if size > self._max_bytes:
            self._rejected += 1
            return
        self._expire(now)
        while self._entries and (len(self._entries) >= self._max_items
                                 or self._bytes + size > self._max_bytes):
            self._evict(by_bytes=self._bytes + size > self._max_bytes)
        self._entries[item.id] = (item, size, now)
        owner = self._owners.get(item.owner)
        if owner is None:
            owner = self._owners[item.owner] = _Owner()
        owner.ids[item.id] = None
        owner.bytes += size
        self._bytes += size
        for item_id in item_ids(item):
            self._item_index.setdefault((item.owner, item_id), item.id)

    async def get(self, response_id: str) -> StoredResponse | None:
        found = self._entries.get(response_id)
        if found is None:
            return None
        item, _, stored_at = found
        if self._clock() - stored_at >= self._max_age:
            self._drop(response_id)
            self._expired += 1
            return None
        return item

    async def delete(self, response_id: str) -> bool:
        found = self._entries.get(response_id)
        if found is None:
            return False
        self._drop(response_id)
        # an expired entry was already gone as far as the client can tell
        return self._clock() - found[2] < self._max_age

    async def delete_owner(self, owner: str) -> int:
        found = self._owners.get(owner)
        ids = list(found.ids) if found is not None else []
        for response_id in ids:
            self._drop(response_id)
        return len(ids)

    async def get_chain(self, response_id: str) -> tuple[list[StoredResponse], str | None]:
        return await follow_links(self.get, response_id)

    async def get_items(self, owner: str,
                        wanted: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        where = {item_id: self._item_index[owner, item_id] for item_id in wanted
                 if (owner, item_id) in self._item_index}
        entries = {rid: await self.get(rid) for rid in set(where.values())}
        return pick_items(entries, where, owner)

    def stats(self) -> dict[str, int]:
        return {"items": len(self._entries), "bytes": self._bytes, "evicted": self._evicted,
                "expired": self._expired, "rejected": self._rejected,
                "owners": len(self._owners), "indexed_items": len(self._item_index),
                "max_items": self._max_items, "max_bytes": self._max_bytes}

    def _evict(self, *, by_bytes: bool) -> None:
        """Drop the oldest entry of the owner holding the most (O(owners))."""
        owners = self._owners
        name = max(owners, key=(lambda o: owners[o].bytes) if by_bytes
                   else (lambda o: len(owners[o].ids)))
        self._drop(next(iter(owners[name].ids)))
        self._evicted += 1

    def _drop(self, response_id: str) -> None:
        found = self._entries.pop(response_id, None)
        if found is not None:
            item, size, _ = found
            self._bytes -= size
            for item_id in item_ids(item):
                if self._item_index.get((item.owner, item_id)) == response_id:
                    del self._item_index[item.owner, item_id]
            owner = self._owners[item.owner]
            del owner.ids[response_id]
            owner.bytes -= size
            if not owner.ids:
                del self._owners[item.owner]

    def _expire(self, now: float) -> None:
        entries = self._entries
        deadline = now - self._max_age
        while entries:
            response_id, (_, _, stored_at) = next(iter(entries.items()))
            if stored_at > deadline:
                return
            self._drop(response_id)
            self._expired += 1


class _Owner:
    """One key's share of the store: its entries in storage order, their bytes."""

    __slots__ = ("ids", "bytes")

    def __init__(self) -> None:
        self.ids: OrderedDict[str, None] = OrderedDict()
        self.bytes = 0
