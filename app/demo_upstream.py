"""The demo upstream: a small, fast OpenAI- and Anthropic-compatible model server.

``poolgate serve`` with no workers configured starts it inside the gateway and
puts ``remote`` workers in front of it, so the first command of the README
works offline; ``bench/`` uses it as the upstream. What it answers (a reply
quoting the last user message, tool calls on request, the ``-dN``/``-nN``/``-tN``
model-name knobs) is in :mod:`app.demo_replies`.

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST
/v1/messages``, ``POST /v1/messages/count_tokens``, ``GET /`` and ``/health``,
``GET /stats`` (request counters). Streaming replies are SSE with ``event:``
lines for Anthropic and ``[DONE]`` for OpenAI.

It doubles as the benchmark's upstream, so it is built for speed: a raw
asyncio protocol on httptools' parser, keep-alive and pipelining, replies
rendered once per distinct request body and cached as bytes (a repeated
request costs a parse of the HTTP head, a dict lookup and one write), and
streams paced by loop callbacks rather than tasks.

Run standalone: ``python -m app.demo_upstream --port 8001``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httptools
import orjson

from app.demo_replies import (DEFAULT_MODELS, Canned, Stream, canned, error_reply, models_body,
                              render)
from pool.errors import BadRequest, NotFound

__all__ = ["DEFAULT_MODELS", "DemoUpstream", "start_demo_upstream", "main"]

_CACHE_MAX_BODY = 16 * 1024
_CACHE_MAX_ENTRIES = 1024
_STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"cache-control: no-cache\r\n")


_POST_ROUTES = {b"/v1/chat/completions": "chat", b"/chat/completions": "chat",
                b"/v1/messages": "messages", b"/v1/messages/count_tokens": "count_tokens"}
_GET_ROUTES = {b"/v1/models": "models", b"/models": "models", b"/": "health",
               b"/health": "health", b"/healthz": "health", b"/stats": "stats"}
_BAD_HTTP = error_reply(BadRequest("malformed HTTP request"), "openai").data


class _App:
    """State shared by the connections of one server: reply cache, counters, static bodies."""

    __slots__ = ("stats", "connections", "_cache", "_static")

    def __init__(self, models: tuple[str, ...]) -> None:
        self.stats = dict.fromkeys(("requests", "chat", "chat_stream", "messages",
                                    "messages_stream", "count_tokens", "models", "health",
                                    "stats", "errors"), 0)
        self.connections: set[_Connection] = set()
        self._cache: dict[tuple[str, bytes], Canned | Stream] = {}
        self._static = {"models": canned(200, models_body(models), "models"),
                        "health": canned(200, b'{"status":"ok"}', "health")}

    def get(self, route: str) -> Canned:
        if route == "stats":
            return canned(200, orjson.dumps(self.stats), "stats")
        return self._static[route]

    def post(self, route: str, body: bytes) -> Canned | Stream:
        key = (route, body)
        reply = self._cache.get(key)
        if reply is None:
            reply = render(route, body)
            if len(body) <= _CACHE_MAX_BODY:
                if len(self._cache) >= _CACHE_MAX_ENTRIES:
                    self._cache.clear()
                self._cache[key] = reply
        return reply


def _not_found(path: bytes, status: int = 404) -> Canned:
    dialect = "anthropic" if b"/messages" in path else "openai"
    what = "route" if status == 404 else "method for route"
    exc = NotFound(f"no such {what}: {path.decode('latin-1')}", status=status, code="unknown_route")
    return error_reply(exc, dialect)


class _Connection(asyncio.Protocol):
    """One client connection: HTTP/1.1 with keep-alive and pipelining, answered in order."""

    __slots__ = ("_app", "_transport", "_parser", "_url", "_body", "_busy", "_backlog",
                 "_paused", "_resume", "closed")

    def __init__(self, app: _App) -> None:
        self._app = app
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._body: list[bytes] = []
        self._busy = False               # a streamed or delayed reply is under way
        self._backlog: deque[tuple[bytes, bytes, bytes, bool, bool]] = deque()
        self._paused = False
        self._resume: Any = None
        self.closed = False

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._app.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._resume = None
        self._app.connections.discard(self)

    def abort(self) -> None:
        self._transport.abort()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        resume, self._resume = self._resume, None
        if resume is not None:
            resume()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._app.stats["errors"] += 1
            self.send(_BAD_HTTP, keep=False)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        p = self._parser
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = (p.get_method(), self._url, body, p.should_keep_alive(),
                   p.get_http_version() != "1.0")
        if self._busy:
            self._backlog.append(request)
        else:
            self._serve(*request)

    # replies
    def _serve(self, method: bytes, url: bytes, body: bytes, keep: bool, chunked: bool) -> None:
        app = self._app
        app.stats["requests"] += 1
        path = url.partition(b"?")[0].rstrip(b"/") or b"/"
        route = _POST_ROUTES.get(path)
        if route is not None and method == b"POST":
            reply = app.post(route, body)
        elif (get := _GET_ROUTES.get(path)) is not None and method in (b"GET", b"HEAD"):
            reply = app.get(get)
        else:
            reply = _not_found(path, 404 if route is None and path not in _GET_ROUTES else 405)
        app.stats[reply.stat] += 1
        if type(reply) is Stream:
            _StreamWriter(self, reply, keep, chunked).start()
        elif reply.delay:
            self._busy = True
            asyncio.get_running_loop().call_later(reply.delay, self._send_delayed, reply.data, keep)
        elif method == b"HEAD":
            self.send(reply.data[:reply.data.index(b"\r\n\r\n") + 4], keep)
        else:
            self.send(reply.data, keep)

    def send(self, data: bytes, keep: bool = True) -> None:
        """A complete response (rendered for keep-alive); closes after it unless ``keep``."""
        if self.closed:
            return
        if not keep:  # the first occurrence is the header: bodies come after it
            data = data.replace(b"connection: keep-alive", b"connection: close", 1)
        self._transport.write(data)
        self.end(keep)

    def end(self, keep: bool) -> None:
        if not keep and not self.closed:
            self._transport.close()
            self.closed = True

    def _send_delayed(self, data: bytes, keep: bool) -> None:
        self.send(data, keep)
        self.done()

    def write(self, data: bytes) -> None:
        self._transport.write(data)

    def wait_writable(self, resume: Any) -> bool:
        """True when the transport is paused; ``resume`` is then called once it drains."""
        if self._paused:
            self._resume = resume
        return self._paused

    def done(self) -> None:
        """The reply under way is complete: serve the pipelined requests behind it."""
        self._busy = False
        while self._backlog and not self._busy and not self.closed:
            self._serve(*self._backlog.popleft())

    def start_busy(self) -> None:
        self._busy = True


class _StreamWriter:
    """Writes one SSE reply on a fixed schedule (first chunk at ``ttft``, then every
    ``delay``) with loop callbacks, no task; late wake-ups do not accumulate."""

    __slots__ = ("_conn", "_stream", "_keep", "_chunked", "_next", "_due", "_loop")

    def __init__(self, conn: _Connection, stream: Stream, keep: bool, chunked: bool) -> None:
        self._conn, self._stream = conn, stream
        self._keep, self._chunked = keep and chunked, chunked
        self._next = 0
        self._loop = asyncio.get_running_loop()
        self._due = 0.0

    def _frame(self, payload: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(payload), payload) if self._chunked else payload

    def start(self) -> None:
        conn = self._conn
        conn.start_busy()
        head = _STREAM_HEAD + (b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
                               if self._keep else
                               b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
                               if self._chunked else b"connection: close\r\n\r\n")
        conn.write(head + self._frame(self._stream.head))
        self._due = self._loop.time() + self._stream.ttft
        self._schedule()

    def _schedule(self) -> None:
        if self._due > self._loop.time():
            self._loop.call_at(self._due, self._step)
        else:
            self._loop.call_soon(self._step)   # still yield, so streams interleave

    def _step(self) -> None:
        conn, stream = self._conn, self._stream
        if conn.closed or conn.wait_writable(self._step):
            return
        chunks = stream.chunks
        i = self._next
        if i < len(chunks):
            conn.write(self._frame(chunks[i]))
            self._next = i = i + 1
            if i < len(chunks):
                self._due += stream.delay
                self._schedule()
                return
        conn.write(self._frame(stream.tail) + (b"0\r\n\r\n" if self._chunked else b""))
        conn.end(self._keep)
        conn.done()


# ------------------------------------------------------------------ public API
@dataclass(frozen=True, slots=True)
class DemoUpstream:
    """A running demo upstream; ``await close()`` stops it and drops its connections."""

    host: str
    port: int
    _server: asyncio.Server = field(repr=False)
    _app: _App = field(repr=False)

    @property
    def openai_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def stats(self) -> dict[str, int]:
        """Request counters by kind (also served as ``GET /stats``)."""
        return dict(self._app.stats)

    async def close(self) -> None:
        self._server.close()
        for conn in list(self._app.connections):
            conn.abort()
        await self._server.wait_closed()


async def start_demo_upstream(host: str = "127.0.0.1", port: int = 0, *,
                              models: tuple[str, ...] = DEFAULT_MODELS) -> DemoUpstream:
    """Listen on ``host:port`` (0 = a free port) in the running loop; ``models`` is
    what ``GET /v1/models`` lists (every model name is answered)."""
    app = _App(tuple(models))
    server = await asyncio.get_running_loop().create_server(
        lambda: _Connection(app), host, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    return DemoUpstream(host, bound, server, app)


async def _serve_until_signalled(args: argparse.Namespace) -> None:
    upstream = await start_demo_upstream(args.host, args.port,
                                         models=tuple(args.model or DEFAULT_MODELS))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"demo upstream on {upstream.anthropic_url} pid={os.getpid()}", flush=True)
    await stop.wait()
    await upstream.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m app.demo_upstream [--host H] [--port P] [--model NAME ...]``."""
    parser = argparse.ArgumentParser(prog="python -m app.demo_upstream",
                                     description="poolgate's demo OpenAI + Anthropic upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    parser.add_argument("--model", action="append",
                        help="a name GET /v1/models lists (repeatable); every name is answered")
    args = parser.parse_args(argv)
    try:
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_serve_until_signalled(args))


if __name__ == "__main__":
    main()
