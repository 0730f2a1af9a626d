"""An aiohttp response with less memory for as long as it streams.

With thousands of slow streams open, what each upstream response costs counts.
aiohttp keeps three ``collections.deque`` per streaming response that hold
next to nothing while it streams: the connection protocol's queue of parsed
responses (one item, taken at once), the body reader's buffer of unread
chunks (the chunks of one read, when the reader is behind) and its list of
HTTP chunk ends. An empty deque costs ≈ 0.75 KiB (a 64-slot block and a block
freelist); :class:`LeanQueue`, a list with the deque methods aiohttp calls
(``append``, ``appendleft``, ``popleft``, indexing), 56 bytes.
:func:`lean_response` swaps them once the response headers are in: the same
behaviour, ≈ 2 KiB less per open stream. ``popleft`` on a list moves the
items left, which costs nothing at the few items these queues hold.

It also lets go of the headers, once read: the upstream's response headers
(``CIMultiDict``, raw pairs: ≈ 2 KiB with a handful of headers, more from a
real provider's dozens) and the request's own, which aiohttp keeps in the
response's ``request_info`` (the credentials among them). The worker reads
the content type before, and nothing reads them after: a lean response's
``headers`` are empty.

Each swap checks what it replaces, so an aiohttp that stores these
differently keeps its own (and :func:`lean_state` tells the tests).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from aiohttp.client_reqrep import RequestInfo
from multidict import CIMultiDict, CIMultiDictProxy

__all__ = ["LeanQueue", "lean_response", "lean_state"]


_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class LeanQueue(list):  # type: ignore[type-arg]
    """The deque methods aiohttp's queues use, on a list."""

    __slots__ = ()

    def appendleft(self, item: Any) -> None:
        self.insert(0, item)

    def popleft(self) -> Any:
        return self.pop(0)


def _swap(owner: Any, name: str) -> None:
    queue = getattr(owner, name, None)
    if type(queue) is deque:
        setattr(owner, name, LeanQueue(queue))


def lean_response(resp: Any) -> None:
    """Swap the deques of ``resp`` (an ``aiohttp.ClientResponse`` whose headers
    came and were read) and of its connection's protocol for :class:`LeanQueue`,
    and drop its response and request headers."""
    reader = resp.content
    _swap(reader, "_buffer")
    if getattr(reader, "_http_chunk_splits", 0) is None and not reader.total_bytes:
        # made on the first chunk otherwise (chunked bodies): made lean now
        reader._http_chunk_splits = LeanQueue()
    else:
        _swap(reader, "_http_chunk_splits")
    connection = resp.connection
    if connection is not None:
        _swap(connection.protocol, "_buffer")
    cache = getattr(resp, "_cache", None)  # what its properties read, once read
    if type(cache) is not dict:
        return
    if type(getattr(resp, "_headers", None)) is CIMultiDictProxy:
        resp._headers = _NO_HEADERS
        resp._raw_headers = ()
        cache.pop("headers", None)
        cache.pop("raw_headers", None)
    info = getattr(resp, "_request_info", None)
    if type(info) is RequestInfo:
        resp._request_info = info._replace(headers=_NO_HEADERS)
        cache.pop("request_info", None)


def lean_state(resp: Any) -> dict[str, bool]:
    """Which of the three queues of ``resp`` are lean, and whether its headers were let go."""
    reader = resp.content
    protocol = resp.connection.protocol if resp.connection is not None else None
    return {"body": type(reader._buffer) is LeanQueue,
            "chunks": type(reader._http_chunk_splits) is LeanQueue,
            "responses": protocol is not None and type(protocol._buffer) is LeanQueue,
            "headers": resp._headers is _NO_HEADERS and resp._raw_headers == ()
            and resp.request_info.headers is _NO_HEADERS}
