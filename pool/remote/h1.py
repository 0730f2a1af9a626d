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
cookies, decompression (the workers ask for ``identity``), HTTP/2, and retries,
but one: a request sent on a kept connection that the upstream closed before a
byte of its answer, within a second of the request going out (the upstream's
idle timeout met the request on the way; it never read it), goes once more on
a new connection. A close later than that may be an upstream (or a proxy in
front of it) that read the request and gave up while the model worked: sent
again, the model would work twice, so it fails the request like any other
failure (the pool decides what next).
A header value with a line break or NUL is refused before anything is sent
(:class:`InvalidHeader`): nothing a client sends can add a header or a request.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
import ssl
import time
from collections import deque
from typing import Any, Mapping

from yarl import URL

from .h1_conn import Connection, Disconnected, Response, Unanswered

__all__ = ["Origin", "Response", "ConnectTimeout", "ConnectFailed", "Disconnected",
           "InvalidHeader", "origin_of"]

_IDLE_LIMIT = 15.0        # an idle connection older than this is closed, not reused (as aiohttp)
_DNS_TTL = 10.0           # an upstream's addresses are looked up again after this (as aiohttp)
_RETRY_WINDOW = 1.0       # closed unanswered this soon after the request went out: sent again
_BAD = ("\r", "\n", "\0")
_ssl_context: ssl.SSLContext | None = None


class ConnectTimeout(TimeoutError):
    """No connection to the upstream within ``connect_timeout``."""


class ConnectFailed(OSError):
    """The upstream could not be connected to (refused, unreachable, no such name, TLS)."""


class InvalidHeader(ValueError):
    """A request header's name or value that would break the request head."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


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
                                "where none may be", name[:40])
        parts.append(f"{name}: {value}\r\n")
    return "".join(parts).encode("utf-8")


class Origin:
    """The keep-alive connections to one upstream origin, at most ``limit``
    open (0: no bound; a request waits for one to free up)."""

    __slots__ = ("scheme", "host", "port", "host_header", "tls", "limit", "connect_timeout",
                 "_idle", "_open", "_waiters", "_closed", "_default", "_block", "_host",
                 "_targets", "_literal", "_addresses", "_addresses_until", "_lookup")

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
        self._idle: list[Connection] = []
        self._open = 0  # connections open or being opened
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()
        self._closed = False
        headers = {name.lower(): value for name, value in (headers or {}).items()}
        headers.pop("host", None)
        if url.user is not None and "authorization" not in headers:  # as aiohttp: Basic
            pair = f"{url.user}:{url.password or ''}".encode("latin-1")
            headers["authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        self._default = headers
        self._block = _header_block(headers)
        self._host = self.host_header.encode("ascii")
        self._targets: dict[Any, bytes] = {}
        try:
            ipaddress.ip_address(self.host)
            self._literal = True
        except ValueError:
            self._literal = False
        self._addresses: list[str] = []
        self._addresses_until = 0.0
        self._lookup: asyncio.Task[list[str]] | None = None

    def same_origin(self, url: URL) -> bool:
        return url.scheme == self.scheme and url.raw_host == self.host and url.port == self.port

    # --- one request -------------------------------------------------------------

    async def request(self, method: str, url: URL | str, headers: Mapping[str, str],
                      body: bytes | None = None) -> Response:
        """Send the request; the response once its status line and headers came."""
        head = self._head(method, url, headers, body)
        message = head + body if body else head
        retried = False
        while True:
            conn = await self._acquire()
            reused = conn.uses > 0
            conn.uses += 1
            conn.answered = False
            conn.head_bytes = conn.quiet_bytes = 0
            response = conn.response = Response(conn)
            waiter = conn.headers_came = asyncio.get_running_loop().create_future()
            sent = time.monotonic()
            try:
                if conn.closed:  # gone while it was handed over
                    raise Unanswered("the upstream closed the connection")
                conn.transport.write(message)  # type: ignore[union-attr]
                return await waiter
            except Unanswered:
                conn.headers_came = None
                response.close()
                # a kept connection the upstream closed as the request went out (its
                # idle timeout): it never read it; once more on a new connection
                if not reused or retried or time.monotonic() - sent > _RETRY_WINDOW:
                    raise
                retried = True
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

    async def _acquire(self) -> Connection:
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
            waiter: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
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
            conn = await self._connect()
        except BaseException:  # (a connection made as it was cancelled is closed uncounted)
            self._open -= 1
            self._wake()
            raise
        if conn.closed:  # gone before we resumed: lost() let it go uncounted
            self._open -= 1
            self._wake()
            raise Unanswered("the upstream closed the connection as it was opened")
        conn.counted = True  # from now on its place is freed by lost()
        return conn

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        tls = (self.tls or _tls()) if self.scheme == "https" else None
        try:
            async with asyncio.timeout(self.connect_timeout):
                failure: OSError = OSError("the upstream's name has no address")
                for address in await self._addressed(loop):  # each in turn, as asyncio does
                    try:
                        _, conn = await loop.create_connection(
                            lambda: Connection(self), address, self.port, ssl=tls,
                            server_hostname=self.host if tls is not None else None)
                        return conn
                    except OSError as exc:
                        failure = exc
                raise failure
        except TimeoutError:
            raise ConnectTimeout(f"no connection within {self.connect_timeout:g}s") from None
        except OSError as exc:  # refused, unreachable, no such name, a failed handshake
            raise ConnectFailed(type(exc).__name__) from None

    async def _addressed(self, loop: asyncio.AbstractEventLoop) -> list[str]:
        """The upstream's addresses: looked up once per ``_DNS_TTL``, one lookup
        for all the connections opened meanwhile (a burst opens many at once)."""
        if self._literal:
            return [self.host]
        if self._addresses and time.monotonic() < self._addresses_until:
            return self._addresses
        lookup = self._lookup
        if lookup is None:
            lookup = self._lookup = loop.create_task(self._resolve(loop))
            lookup.add_done_callback(_retrieved)
        return await asyncio.shield(lookup)  # a cancelled connect leaves it to the others

    async def _resolve(self, loop: asyncio.AbstractEventLoop) -> list[str]:
        try:
            infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        finally:
            self._lookup = None
        self._addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        self._addresses_until = time.monotonic() + _DNS_TTL
        return self._addresses

    def put_back(self, conn: Connection) -> None:
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

    def lost(self, conn: Connection) -> None:
        """``conn`` closed (either side): its place is free (once :meth:`_acquire`
        counted it; until then a failed connect frees it there)."""
        if not conn.counted:
            return
        conn.counted = False
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


def _retrieved(task: asyncio.Task[list[str]]) -> None:
    if not task.cancelled():
        task.exception()  # a failed lookup all its waiters left is no unhandled error
