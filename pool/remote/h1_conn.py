"""One keep-alive connection of :mod:`pool.remote.h1` and the answer it reads.

:class:`Connection` is the asyncio protocol httptools' parser calls back;
:class:`Response` is one answer on it, its body kept as it arrives (reading
stops while more than 128 KiB wait unread, each piece counted 64 bytes more
than its length, and goes on as the reader catches up). What httptools keeps
whole is bounded: header lines (and trailers, which are not kept) to 64 KiB,
and so is any stretch of the answer that brings no body byte. The owner of
the connections (:class:`Owner`, the client's pool) is told when one can be
used again and when one closed.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

__all__ = ["Connection", "Response", "Disconnected", "Unanswered", "Owner"]

_HIGH_WATER = 128 * 1024  # unread body bytes at which the connection stops reading
MAX_HEAD = 64 * 1024  # bytes of an answer's headers (1xx heads included), or of any
# stretch of the answer that brings no body byte (a head, trailers, chunk framing)
_CHUNK_COST = 64  # what one held piece of body costs besides its bytes (the pause mark counts it)


class Disconnected(ConnectionError):
    """The connection ended (or sent what is not HTTP) before the answer was complete."""


class Unanswered(Disconnected):
    """The connection closed before a byte of the answer came."""


class Owner(Protocol):
    def put_back(self, conn: Connection) -> None: ...

    def lost(self, conn: Connection) -> None: ...


class Response:
    """One upstream answer: status and headers, and its body as it arrives
    (``content`` is the response itself: the reader methods are here)."""

    __slots__ = ("status", "content_type", "_raw", "_headers", "_conn", "_chunks", "_size",
                 "_eof", "_exc", "_waiter", "_done")

    def __init__(self, conn: Connection) -> None:
        self.status = 0
        self.content_type = ""
        self._raw: list[tuple[bytes, bytes]] | None = []
        self._headers: CIMultiDictProxy[str] | None = None
        self._conn: Connection | None = conn
        self._chunks: list[bytes] = []
        self._size = 0
        self._eof = False  # the whole body came
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._done = False  # released or closed

    @property
    def content(self) -> Response:
        return self

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        headers = self._headers
        if headers is None:
            raw = self._raw or ()
            headers = self._headers = CIMultiDictProxy(CIMultiDict(
                (name.decode("latin-1"), value.decode("latin-1")) for name, value in raw))
        return headers

    def lean(self) -> None:
        """Let go of the headers (read before): nothing reads them while the body streams."""
        self._raw = None
        self._headers = None

    # --- the body, as aiohttp's StreamReader ------------------------------------

    def read_nowait(self) -> bytes:
        """What arrived and was not read yet (``b""`` when nothing did)."""
        if self._exc is not None:
            raise self._exc
        chunks = self._chunks
        if not chunks:
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        if self._size > _HIGH_WATER and self._conn is not None:
            self._conn.resume()
        self._size = 0
        return data

    async def readany(self) -> bytes:
        """The next bytes of the body, waiting for them; ``b""`` at its end."""
        while not self._chunks and not self._eof and self._exc is None:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return self.read_nowait()

    def is_eof(self) -> bool:
        """The whole body came (some of it may be unread)."""
        return self._eof

    def at_eof(self) -> bool:
        return self._eof and not self._chunks

    def set_exception(self, exc: BaseException) -> None:
        """Fail the reads from now on (the pending one at once) with ``exc``."""
        self._exc = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- fed by the connection ------------------------------------------------

    def _feed(self, data: bytes) -> bool:
        """Take body bytes; ``True`` when the reader is behind enough to pause reading."""
        self._chunks.append(data)
        self._size += len(data) + _CHUNK_COST
        self._wake()
        return self._size > _HIGH_WATER

    def _finish(self) -> None:
        self._eof = True
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if not self._eof and self._exc is None:
            self.set_exception(exc)

    # --- the end ---------------------------------------------------------------

    def release(self) -> None:
        """Done with it: the connection goes back to the pool when the whole body
        came and the upstream keeps it alive, else it is closed."""
        if self._done:
            return
        self._done = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.finished(self, reusable=self._eof and self._exc is None)
        self._fail(Disconnected("the answer was let go before its end"))

    def close(self) -> None:
        """Done with it, and the connection closed (the upstream sees the client go)."""
        if self._done:
            return
        self._done = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.finished(self, reusable=False)
        self._fail(Disconnected("the answer was let go before its end"))

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()


class Connection(asyncio.Protocol):
    """One keep-alive connection: the protocol httptools' parser calls back."""

    __slots__ = ("origin", "transport", "parser", "response", "headers_came", "closed",
                 "idle_since", "paused", "keep_alive", "uses", "answered", "counted",
                 "head_bytes", "quiet_bytes", "body_pieces", "_length_known", "_informational")

    def __init__(self, origin: Owner) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.headers_came: asyncio.Future[Response] | None = None
        self.closed = False
        self.idle_since = 0.0
        self.paused = False
        self.keep_alive = False  # the last answer came whole, and the upstream keeps the connection
        self.uses = 0  # requests sent on it
        self.answered = False  # a byte of the current request's answer came
        self.counted = False  # its place in the origin's limit is taken (h1.Origin._acquire)
        self.head_bytes = 0  # bytes of the current answer's header lines
        self.quiet_bytes = 0  # bytes read since the last that brought body bytes
        self.body_pieces = 0  # on_body calls (read to tell a stretch with no body)
        self._length_known = False  # content-length or chunked: its end is in the stream
        self._informational = False

    # --- asyncio ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # bytes nobody asked for: this connection is done
            self.close()
            return
        self.answered = True
        pieces = self.body_pieces
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._broken(Disconnected("the upstream's answer is not valid HTTP/1.1"))
            return
        except httptools.HttpParserUpgrade:
            self._broken(Disconnected("the upstream switched protocols"))
            return
        # httptools keeps a header line (or a trailer) whole until it ends: bounded
        # by the header lines seen, and by the bytes of any stretch with no body
        if self.body_pieces != pieces:
            self.quiet_bytes = 0
        else:
            self.quiet_bytes += len(data)
        if self.head_bytes > MAX_HEAD or self.quiet_bytes > MAX_HEAD:
            self._broken(Disconnected(f"the upstream's headers exceed {MAX_HEAD // 1024} KiB"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is not None and not response._eof:
            if self.headers_came is None and not self._length_known:
                response._finish()  # a body without a length ends with its connection
            elif not self.answered:
                self._broken(Unanswered("the upstream closed the connection before answering"))
            else:
                self._broken(Disconnected("the upstream closed the connection early"))
        self.origin.lost(self)

    def pause_writing(self) -> None:  # the request goes out in one write; nothing to pause
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools -------------------------------------------------------------

    def on_message_begin(self) -> None:
        response = self.response
        if response is not None and response._eof:  # a second answer nobody asked for
            self.response = None
            self.close()
        self._length_known = False
        self._informational = False
        self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        response = self.response
        # trailers (after the body) are not headers of the answer: let go
        if response is None or self._informational or self.headers_came is None \
                or self.head_bytes > MAX_HEAD:
            return
        lower = name.lower()
        if lower == b"content-type":
            response.content_type = value.decode("latin-1")
        elif lower == b"content-length":
            self._length_known = True
        elif lower == b"transfer-encoding":  # chunked last: its end is in the stream
            self._length_known = value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
        raw = response._raw
        if raw is not None:
            raw.append((name, value))

    def on_headers_complete(self) -> None:
        if self.head_bytes > MAX_HEAD:  # the answer is never handed over
            self._broken(Disconnected(f"the upstream's headers exceed {MAX_HEAD // 1024} KiB"))
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue and the like: the answer follows
            self._informational = True
            return
        response = self.response
        waiter = self.headers_came
        self.headers_came = None
        if response is None or waiter is None:
            return
        response.status = status
        if not waiter.done():
            waiter.set_result(response)

    def on_body(self, body: bytes) -> None:
        self.body_pieces += 1
        response = self.response
        if response is not None and not self._informational and response._feed(body) \
                and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            response = self.response
            if response is not None:  # what its headers said is not the answer's
                response.content_type = ""
                if response._raw is not None:
                    response._raw = []
            return
        self.keep_alive = self.parser.should_keep_alive()  # (llhttp forgets it after this)
        response = self.response
        if response is not None:
            response._finish()
            if response._done:  # released before the end: nothing else reads it
                self.response = None

    # --- ours --------------------------------------------------------------------

    def resume(self) -> None:
        if self.paused and not self.closed and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def _broken(self, exc: BaseException) -> None:
        waiter = self.headers_came
        self.headers_came = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self.response is not None:
            self.response._fail(exc)
        self.close()

    def close(self) -> None:
        """Now: nothing it still had to write matters, and a TLS connection does
        not wait for the upstream's goodbye (up to 30 s, its place held meanwhile)."""
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()

    def finished(self, response: Response, *, reusable: bool) -> None:
        """``response`` is let go: keep the connection for the next request, or close it."""
        if self.response is response:
            self.response = None
        if reusable and not self.closed and self.keep_alive:
            self.resume()
            self.origin.put_back(self)
        else:
            self.close()
