"""A small forward HTTP proxy on 127.0.0.1 that logs what passes: someone
else's server (an operator's egress proxy), for tests.

It speaks the forms a client uses: ``CONNECT host:port`` (a tunnel, what
HTTPS and most proxy agents use; the bytes inside are piped as they are; an
upstream it cannot reach is a 502, as real proxies answer),
absolute-form requests (``GET http://host:port/path HTTP/1.1``, what plain
HTTP through a proxy is) and SOCKS5 CONNECT on the same port
(``socks_url``). It runs on its own event loop in a thread::

    with EgressProxy(credentials="user:pass") as proxy:
        proxy.url        # http://user:pass@127.0.0.1:PORT
        proxy.passed     # [("CONNECT", "127.0.0.1:4321"), ("POST", "http://…/v1/messages"), …]
        proxy.refused    # requests without the right Proxy-Authorization

``hosts`` maps names the proxy resolves itself (``{"images.test": "127.0.0.1"}``).

``stop()`` closes the listening socket (and every tunnel): the proxy is down,
its port refuses connections.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

__all__ = ["EgressProxy"]

_MAX_HEAD = 64 * 1024


class EgressProxy:
    def __init__(self, credentials: str | None = None,
                 hosts: dict[str, str] | None = None) -> None:
        self.credentials = credentials
        # names the proxy resolves itself (its own DNS: a name the client cannot resolve)
        self.hosts = dict(hosts or {})
        self.passed: list[tuple[str, str]] = []
        self.refused: list[str] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: socket.socket | None = None  # the listening socket, ours to close
        self._accepted: list[socket.socket] = []  # every connection's, closed at the end
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        auth = f"{self.credentials}@" if self.credentials else ""
        return f"http://{auth}127.0.0.1:{self.port}"

    def targets(self) -> list[str]:
        """The host:port of each request that passed (tunnels and plain requests)."""
        out = []
        for method, target in self.passed:
            out.append(urlsplit(target).netloc if "://" in target else target)
        return out

    def __enter__(self) -> EgressProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        asyncio.run_coroutine_threadsafe(self._finish(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        # our own accept loop: every accepted socket is held from the start, so
        # none is left open however the proxy is stopped
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        server.setblocking(False)
        self._server = server
        self.port = server.getsockname()[1]
        asyncio.get_running_loop().add_reader(server.fileno(), self._accept, server)

    def _accept(self, server: socket.socket) -> None:
        """Takes each waiting connection at once (no task between the accept and
        the list of sockets to close: a stop at any moment leaves none open)."""
        while True:
            try:
                conn, _addr = server.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            self._accepted.append(conn)
            asyncio.ensure_future(self._connected(conn))

    async def _connected(self, conn: socket.socket) -> None:
        reader, writer = await asyncio.open_connection(sock=conn)
        await self._serve(reader, writer)

    def stop(self) -> None:
        """Down: no listening socket, every open tunnel closed."""
        if self._server is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)

    def start(self) -> None:
        """Up again on the same port."""
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _finish(self) -> None:
        """Every connection handler ended and every accepted socket closed."""
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.sleep(0)
        for conn in self._accepted:
            conn.close()  # no-op on one its transport closed

    async def _close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            asyncio.get_running_loop().remove_reader(server.fileno())
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()  # down: no flush, every connection cut

    def _resolve(self, host: str) -> str:
        return self.hosts.get(host, host)

    def _authorised(self, headers: dict[str, str]) -> bool:
        if self.credentials is None:
            return True
        expected = "Basic " + base64.b64encode(self.credentials.encode()).decode()
        return headers.get("proxy-authorization") == expected

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            first = await reader.readexactly(1)
            if first == b"\x05":
                await self._socks5(reader, writer)
                return
            head = first + await reader.readuntil(b"\r\n\r\n")
            if len(head) > _MAX_HEAD:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            if not self._authorised(headers):
                self.refused.append(target)
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                             b"Proxy-Authenticate: Basic realm=\"egress\"\r\n"
                             b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                return
            self.passed.append((method, target))
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                try:
                    up_reader, up_writer = await asyncio.open_connection(
                        self._resolve(host.strip("[]")), int(port))
                except OSError:  # as real proxies answer an upstream they cannot reach
                    writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n"
                                 b"Connection: close\r\n\r\n")
                    await writer.drain()
                    return
                await self._pipe(reader, writer, up_reader, up_writer,
                                 b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                await self._forward(method, target, version, lines[1:], reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _socks5(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A SOCKS5 CONNECT (RFC 1928), with username/password (RFC 1929)
        when the proxy has credentials; logged as ``("SOCKS5", "host:port")``."""
        methods = await reader.readexactly((await reader.readexactly(1))[0])
        wanted = 2 if self.credentials else 0
        if wanted not in methods:
            self.refused.append("socks5")  # before the answer: a client may look at once
            writer.write(b"\x05\xff")
            return
        writer.write(bytes([5, wanted]))
        if wanted == 2:
            await reader.readexactly(1)  # subnegotiation version
            user = await reader.readexactly((await reader.readexactly(1))[0])
            password = await reader.readexactly((await reader.readexactly(1))[0])
            if f"{user.decode()}:{password.decode()}" != self.credentials:
                self.refused.append("socks5")
                writer.write(b"\x01\x01")
                return
            writer.write(b"\x01\x00")
        _version, command, _reserved, kind = await reader.readexactly(4)
        if kind == 1:
            host = ".".join(str(b) for b in await reader.readexactly(4))
        elif kind == 3:
            host = (await reader.readexactly((await reader.readexactly(1))[0])).decode()
        else:
            host = "[" + ":".join((await reader.readexactly(16)).hex()[i:i + 4]
                                  for i in range(0, 32, 4)) + "]"
        port = int.from_bytes(await reader.readexactly(2), "big")
        if command != 1:
            writer.write(b"\x05\x07\x00\x01" + bytes(6))
            return
        self.passed.append(("SOCKS5", f"{host}:{port}"))
        up_reader, up_writer = await asyncio.open_connection(self._resolve(host.strip("[]")), port)
        await self._pipe(reader, writer, up_reader, up_writer, b"\x05\x00\x00\x01" + bytes(6))

    @property
    def socks_url(self) -> str:
        auth = f"{self.credentials}@" if self.credentials else ""
        return f"socks5://{auth}127.0.0.1:{self.port}"

    async def _forward(self, method: str, target: str, version: str, header_lines: list[str],
                       reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One absolute-form request, sent on with ``Via: 1.1 egress-proxy``
        (as real proxies add) and ``Connection: close``, and its answer piped
        back until the upstream closes."""
        parts = urlsplit(target)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        kept = [h for h in header_lines if h and not h.lower().startswith(
            ("proxy-", "connection:", "keep-alive:"))]
        up_reader, up_writer = await asyncio.open_connection(self._resolve(parts.hostname or ""),
                                                             parts.port or 80)
        up_writer.write(("\r\n".join([f"{method} {path} {version}", *kept, "Via: 1.1 egress-proxy",
                                    "Connection: close"])
                         + "\r\n\r\n").encode("latin-1"))
        self._writers.add(up_writer)
        sending = asyncio.ensure_future(_copy(reader, up_writer))  # the request's body
        try:
            # the answer says Connection: close, so the client sends its next request anew
            head = (await up_reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            head = [h for h in head if h and not h.lower().startswith(("connection:", "keep-alive:"))]
            writer.write(("\r\n".join([*head, "Connection: close"]) + "\r\n\r\n").encode("latin-1"))
            await _copy(up_reader, writer)
        finally:
            sending.cancel()
            self._writers.discard(up_writer)
            up_writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter,
                    reply: bytes) -> None:
        """``reply`` to the client, then both ways until either side ends. The
        upstream connection is closed whatever happens, also when the client is
        cut while the reply is on its way (a stop mid-CONNECT): an upstream
        writer left to the garbage collector is an "unclosed" warning, which
        fails whichever test runs at that moment."""
        self._writers.add(up_writer)
        try:
            writer.write(reply)
            await writer.drain()
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        finally:
            self._writers.discard(up_writer)
            up_writer.close()


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        dst.close()
