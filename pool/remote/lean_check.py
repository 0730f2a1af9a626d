"""Does :func:`pool.remote.lean.lean_response` still behave on this aiohttp?

It swaps private attributes of aiohttp (verified on the aiohttp series
``pyproject.toml`` allows). :func:`self_test` streams two answers from a
throwaway server on 127.0.0.1 (chunked, then with a content length, on one
kept-alive connection) through responses made lean, read as the remote
worker reads them, and says what went wrong, if anything. The gateway runs
it at start-up (``remote.swap`` on or off in its log); off, remote workers
leave aiohttp's responses as they are (``RemoteSpec.lean``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import aiohttp

from .lean import lean_response, lean_state

__all__ = ["self_test"]

_FRAMES = [b"data: {\"n\": %d}\n\n" % n for n in range(40)]
_BODY = b"".join(_FRAMES)


async def self_test(swap: Callable[[Any], None] = lean_response) -> str | None:
    """None when responses made lean by ``swap`` stream the same bytes and
    are lean; else what went wrong (any failure, within 5 s)."""
    connections: list[asyncio.Task[Any]] = []  # the server's, one per connection
    server = await asyncio.start_server(lambda r, w: _serve(r, w, connections), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with asyncio.timeout(5):
            async with aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=1), auto_decompress=False,
                    cookie_jar=aiohttp.DummyCookieJar()) as session:
                for path in ("/chunked", "/sized"):
                    failure = await _one(session, f"http://127.0.0.1:{port}{path}", swap)
                    if failure is not None:
                        return f"{path}: {failure}"
        if len(connections) != 1:
            return f"the connection was not kept alive: {len(connections)} connections"
        return None
    except Exception as exc:  # noqa: BLE001 - any failure turns the swap off
        return f"{type(exc).__name__}: {exc}"
    finally:
        server.close()
        # the client closed its connection: the server's end on its own
        if connections:
            _done, pending = await asyncio.wait(connections, timeout=1)
            for task in pending:
                task.cancel()
        await server.wait_closed()


async def _one(session: aiohttp.ClientSession, url: str, swap: Callable[[Any], None]) -> str | None:
    async with session.post(url, data=b"{}", headers={"authorization": "Bearer self-test"}) as resp:
        if resp.status != 200 or "event-stream" not in resp.headers.get("content-type", ""):
            return f"status {resp.status}"
        swap(resp)
        state = lean_state(resp)
        if url.endswith("/sized"):  # no chunks: aiohttp makes no list of chunk ends
            del state["chunks"]
        if not all(state.values()):
            return f"not lean: {state}"
        content = resp.content
        received = bytearray()
        while True:  # as RemoteWorker reads a stream
            chunk = content.read_nowait()
            if not chunk and not content.is_eof():
                chunk = await content.readany()
            if not chunk:
                break
            received += chunk
        if bytes(received) != _BODY:
            return f"{len(received)} bytes read of {len(_BODY)}, or not the same"
    return None


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 connections: list[asyncio.Task[Any]]) -> None:
    task = asyncio.current_task()
    assert task is not None
    connections.append(task)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            chunked = head.startswith(b"POST /chunked ")
            framing = (b"transfer-encoding: chunked" if chunked
                       else b"content-length: %d" % len(_BODY))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         + framing + b"\r\n\r\n")
            for n in range(0, len(_FRAMES), 4):  # in pieces, some split mid-frame
                piece = b"".join(_FRAMES[n:n + 4])
                for part in (piece[:7], piece[7:]):
                    writer.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                    await writer.drain()
                    await asyncio.sleep(0)
            if chunked:
                writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the client closed the connection
    finally:
        writer.close()
