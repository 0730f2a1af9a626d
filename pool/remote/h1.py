"""A lean HTTP/1.1 client for a ``remote`` worker's upstream.

aiohttp's client costs ≈ 49 µs of CPU per request on this machine (its
session, request and response objects, multidicts, URL handling, tracing and
timer hooks), about 40 % of what a forwarded non-stream request costs the
gateway; a client that only keeps connections to one origin, writes a request
head and reads the answer with httptools' parser (llhttp, the parser uvicorn
uses) costs ≈ 8 µs. This is that client: :class:`Origin` holds the
keep-alive connections to one upstream (plain TCP or TLS), bounded by
``max_connections``; :meth:`Origin.request` writes the request and returns the
:class:`Response` once its status line and headers are in.

A :class:`Response` reads like the ``aiohttp.ClientResponse`` the remote
workers read (``status``, ``headers``, ``content.read_nowait()``,
``readany()``, ``is_eof()``, ``set_exception()``, ``release()``, ``close()``),
so one worker reads either; a worker with an egress proxy keeps aiohttp
(HTTP CONNECT and SOCKS proxies are aiohttp's and aiohttp-socks' work).

What it does not do, on purpose: redirects (the workers never follow them),
cookies, decompression (it asks for ``identity``), retries of a POST (as
aiohttp: a request whose connection broke fails; the pool decides), HTTP/2.
A header value with a line break or NUL is refused before anything is sent
(:class:`InvalidHeader`): nothing a client sends can add a header or a request.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from typing import Any, Mapping

import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

__all__ = ["Origin", "Response", "ConnectTimeout", "ConnectFailed", "Disconnected",
           "InvalidHeader", "origin_of"]

_HIGH_WATER = 128 * 1024  # unread body bytes at which the connection stops reading
_IDLE_LIMIT = 15.0        # an idle connection older than this is closed, not reused (as aiohttp)
_BAD = ("\r", "\n", "\0")
_ssl_context: ssl.SSLContext | None = None


class ConnectTimeout(TimeoutError):
    """No connection to the upstream within ``connect_timeout``."""


class ConnectFailed(OSError):
    """The upstream could not be connected to (refused, unreachable, no such name, TLS)."""


class Disconnected(ConnectionError):
    """The connection ended (or sent what is not HTTP) before the answer was complete."""


class InvalidHeader(ValueError):
    """A request header's name or value that would break the request head."""


def _tls() -> ssl.SSLContext:
    global _ssl_context
    if _ssl_context is None:  # made once: a default context costs milliseconds and memory
        _ssl_context = ssl.create_default_context()
    return _ssl_context


def origin_of(url: URL) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of an absolute http(s) URL."""
    if url.scheme not in ("http", "https") or not url.raw_host or url.port is None:
        raise ValueError(f"not an http(s) URL: {url.scheme}://…")
    return url.scheme, url.raw_host, url.port


def _header_block(headers: Mapping[str, str]) -> bytes:
    parts = []
    for name, value in headers.items():
        if any(c in name or c in value for c in _BAD) or ":" in name or not name:
            raise InvalidHeader(f"the header {name[:40]!r} has a line break, NUL or colon "
                                "where none may be")
        parts.append(f"{name}: {value}\r\n")
    return "".join(parts).encode("utf-8")


class Response:
    """One upstream answer: status and headers, and its body as it arrives
    (``content`` is the response itself: the reader methods are here)."""

    __slots__ = ("status", "content_type", "_raw", "_headers", "_conn", "_chunks", "_size",
                 "_eof", "_exc", "_waiter", "_done")

    def __init__(self, conn: _Connection) -> None:
        self.status = 0
        self.content_type = ""
        self._raw: list[tuple[bytes, bytes]] | None = []
        self._headers: CIMultiDictProxy[str] | None = None
        self._conn: _Connection | None = conn
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
        self._size += len(data)
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

    def close(self) -> None:
        """Done with it, and the connection closed (the upstream sees the client go)."""
        if self._done:
            return
        self._done = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.finished(self, reusable=False)

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()


class _Connection(asyncio.Protocol):
    """One keep-alive connection: the protocol httptools' parser calls back."""

    __slots__ = ("origin", "transport", "parser", "response", "headers_came", "closed",
                 "idle_since", "paused", "keep_alive", "_length_known", "_informational")

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.headers_came: asyncio.Future[Response] | None = None
        self.closed = False
        self.idle_since = 0.0
        self.paused = False
        self.keep_alive = False  # the last answer came whole, and the upstream keeps the connection
        self._length_known = False  # content-length or chunked: its end is in the stream
        self._informational = False

    # --- asyncio ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # bytes nobody asked for: this connection is done
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._broken(Disconnected("the upstream's answer is not valid HTTP/1.1"))
        except httptools.HttpParserUpgrade:
            self._broken(Disconnected("the upstream switched protocols"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is not None and not response._eof:
            if self.headers_came is None and not self._length_known:
                response._finish()  # a body without a length ends with its connection
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
        response = self.response
        if response is None or self._informational:
            return
        lower = name.lower()
        if lower == b"content-type":
            response.content_type = value.decode("latin-1")
        elif lower == b"content-length" or lower == b"transfer-encoding":
            self._length_known = True
        raw = response._raw
        if raw is not None:
            raw.append((name, value))

    def on_headers_complete(self) -> None:
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
        response = self.response
        if response is not None and not self._informational and response._feed(body) \
                and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            if self.response is not None:
                self.response._raw = [] if self.response._raw is not None else None
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
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def finished(self, response: Response, *, reusable: bool) -> None:
        """``response`` is let go: keep the connection for the next request, or close it."""
        if self.response is response:
            self.response = None
        if reusable and not self.closed and self.keep_alive:
            self.resume()
            self.origin.put_back(self)
        else:
            self.close()


class Origin:
    """The keep-alive connections to one upstream origin, at most ``limit``
    open (0: no bound; a request waits for one to free up)."""

    __slots__ = ("scheme", "host", "port", "host_header", "tls", "limit", "connect_timeout",
                 "_idle", "_open", "_waiters", "_closed", "_default", "_block", "_host",
                 "_targets")

    def __init__(self, url: URL, *, limit: int = 0, connect_timeout: float = 10.0,
                 headers: Mapping[str, str] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.scheme, self.host, self.port = origin_of(url)
        self.tls = tls  # None: the system's CAs, verified
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = 443 if self.scheme == "https" else 80
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"
        self.limit = limit
        self.connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._open = 0  # connections open or being opened
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self._closed = False
        headers = {name.lower(): value for name, value in (headers or {}).items()}
        headers.pop("host", None)
        self._default = headers
        self._block = _header_block(headers)
        self._host = self.host_header.encode("ascii")
        self._targets: dict[Any, bytes] = {}

    def same_origin(self, url: URL) -> bool:
        return url.scheme == self.scheme and url.raw_host == self.host and url.port == self.port

    # --- one request -------------------------------------------------------------

    async def request(self, method: str, url: URL | str, headers: Mapping[str, str],
                      body: bytes | None = None) -> Response:
        """Send the request; the response once its status line and headers came."""
        head = self._head(method, url, headers, body)
        conn = await self._acquire()
        response = conn.response = Response(conn)
        waiter = conn.headers_came = asyncio.get_running_loop().create_future()
        try:
            if conn.closed:  # gone while it was handed over
                raise Disconnected("the upstream closed the connection")
            conn.transport.write(head + body if body else head)  # type: ignore[union-attr]
            return await waiter
        except BaseException:
            conn.headers_came = None
            response.close()
            raise

    def _head(self, method: str, url: URL | str, headers: Mapping[str, str],
              body: bytes | None) -> bytes:
        target = self._targets.get(url)
        if target is None:
            parsed = url if isinstance(url, URL) else URL(url)
            if not parsed.is_absolute() or not self.same_origin(parsed):
                raise ValueError("the URL is not on this worker's upstream")
            if len(self._targets) >= 64:  # the workers ask few distinct URLs
                self._targets.clear()
            target = self._targets[url] = (parsed.raw_path_qs or "/").encode("ascii")
        block = self._block
        if headers:
            lowered = {name.lower(): value for name, value in headers.items()}
            if self._default.keys() & lowered.keys():  # a request's own value wins
                block = _header_block({**self._default, **lowered})
            else:
                block += _header_block(lowered)
        length = b"" if body is None else b"content-length: %d\r\n" % len(body)
        return b"%s %s HTTP/1.1\r\nhost: %s\r\n%s%s\r\n" % (
            method.encode("ascii"), target, self._host, block, length)

    # --- the connections ---------------------------------------------------------

    async def _acquire(self) -> _Connection:
        idle = self._idle
        while True:
            if self._closed:
                raise Disconnected("the client is closed")
            now = time.monotonic()
            while idle:
                conn = idle.pop()
                if not conn.closed and now - conn.idle_since < _IDLE_LIMIT:
                    return conn
                conn.close()
            if not self.limit or self._open < self.limit:
                break
            waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    passed = waiter.result()  # handed over as we were cancelled: pass it on
                    if passed is not None:
                        self.put_back(passed)
                    else:
                        self._wake()
                elif not waiter.done():
                    self._waiters.remove(waiter)
                raise
            if handed is not None and not handed.closed:
                return handed
            # a place came free (or the connection handed over closed): look again
        self._open += 1
        try:
            return await self._connect()
        except BaseException:
            self._open -= 1
            self._wake()
            raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = (self.tls or _tls()) if self.scheme == "https" else None
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=tls,
                    server_hostname=self.host if tls is not None else None)
        except TimeoutError:
            raise ConnectTimeout(f"no connection within {self.connect_timeout:g}s") from None
        except OSError as exc:  # refused, unreachable, no such name, a failed handshake
            raise ConnectFailed(type(exc).__name__) from None
        return conn

    def put_back(self, conn: _Connection) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if self._closed:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def lost(self, conn: _Connection) -> None:
        """``conn`` closed (either side): its place is free."""
        self._open -= 1
        try:
            self._idle.remove(conn)
        except ValueError:
            pass
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        """Close the idle connections now, and each busy one as it is let go."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        self._wake_all()

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(Disconnected("the client is closed"))
