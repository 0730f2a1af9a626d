"""Stored Responses: what ``previous_response_id``, ``GET``/``DELETE
/v1/responses/{id}`` and ``/v1/responses/{id}/input_items`` read back.

One :class:`ResponseStore` interface; :class:`MemoryResponseStore` keeps
entries in this process (a Redis store joins behind the same interface, which
is why every method is async and an entry round-trips through
:func:`dumps`/:func:`loads`).

An entry holds the whole chain before it (``history``), so answering a
follow-up needs one read, never a walk of the chain (which an evicted link
would break). The price is memory that grows with the chain's length; the
byte bound caps it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import orjson

__all__ = ["StoredResponse", "ResponseStore", "MemoryResponseStore", "conversation", "dumps",
           "loads"]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored answer. ``response`` is the Response object as returned to
    the client; ``input_items`` this request's input items (with ids);
    ``history`` everything earlier in the chain; ``worker`` the worker that
    served it (for affinity); ``created_at`` wall-clock seconds; ``owner`` the
    name of the API key that created it (``anonymous`` with auth off): only
    that key may read, delete or continue it."""

    id: str
    response: Mapping[str, Any]
    input_items: tuple[Mapping[str, Any], ...]
    history: tuple[Mapping[str, Any], ...]
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

    def stats(self) -> dict[str, int]: ...


def conversation(item: StoredResponse) -> list[dict[str, Any]]:
    """The items a follow-up with ``previous_response_id=item.id`` must see,
    in order: the history, this request's input, then the response's output.

    Shallow copies: the caller may add or change keys, not nested values.
    """
    output = item.response.get("output") or ()
    return ([dict(i) for i in item.history] + [dict(i) for i in item.input_items]
            + [dict(i) for i in output])


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def dumps(item: StoredResponse) -> bytes:
    """The entry as JSON bytes (what a shared store keeps)."""
    return orjson.dumps({"id": item.id, "response": item.response,
                         "input_items": item.input_items, "history": item.history,
                         "worker": item.worker, "created_at": item.created_at,
                         "owner": item.owner},
                        default=_json_default)


def loads(raw: bytes | str) -> StoredResponse:
    """The inverse of :func:`dumps`."""
    obj = orjson.loads(raw)
    return StoredResponse(id=obj["id"], response=obj["response"],
                          input_items=tuple(obj["input_items"]), history=tuple(obj["history"]),
                          worker=obj["worker"], created_at=obj["created_at"],
                          owner=obj.get("owner", "anonymous"))


class MemoryResponseStore:
    """A :class:`ResponseStore` in this process, bounded three ways.

    ``max_items`` entries and ``max_bytes`` (each entry's size is estimated
    once, as the length of :func:`dumps`) are kept by evicting the oldest
    entries; an entry older than ``max_age`` seconds (by ``clock``, from when
    it was stored) is gone: dropped when read and when it reaches the front
    of the queue. An entry larger than ``max_bytes`` on its own is not stored.

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
        entries = self._entries
        while entries and (len(entries) >= self._max_items
                           or self._bytes + size > self._max_bytes):
            _, (_, old_size, _) = entries.popitem(last=False)
            self._bytes -= old_size
            self._evicted += 1
        entries[item.id] = (item, size, now)
        self._bytes += size

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

    def stats(self) -> dict[str, int]:
        return {"items": len(self._entries), "bytes": self._bytes, "evicted": self._evicted,
                "expired": self._expired, "rejected": self._rejected,
                "max_items": self._max_items, "max_bytes": self._max_bytes}

    def _drop(self, response_id: str) -> None:
        found = self._entries.pop(response_id, None)
        if found is not None:
            self._bytes -= found[1]

    def _expire(self, now: float) -> None:
        entries = self._entries
        deadline = now - self._max_age
        while entries:
            response_id, (_, size, stored_at) = next(iter(entries.items()))
            if stored_at > deadline:
                return
            del entries[response_id]
            self._bytes -= size
            self._expired += 1
