#!/usr/bin/env python3
"""The floor: the least a Starlette + uvicorn + aiohttp gateway can do per request.

It reads the request body, forwards it with the client's content type and
credentials to the same path on one upstream through one pooled aiohttp
session, and copies the status, headers and body back (a ``StreamingResponse``
relaying each upstream read for SSE). No auth, no parsing, no routing, no
translation: whatever poolgate costs above this is poolgate's own. Served like
poolgate (uvicorn with uvloop and httptools, no access log), so the two differ
only in what the application does.

    .venv/bin/python bench/floor.py --upstream http://127.0.0.1:8001 --port 8080

``bench/run.py`` and ``bench/open_streams.py`` start it next to poolgate (with the
soft RLIMIT_NOFILE raised to the hard limit, as for poolgate).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

# response headers that describe the upstream connection, not the body
_HOP = frozenset(("content-length", "transfer-encoding", "connection", "keep-alive",
                  "content-encoding", "date", "server"))
_PASSED = ("authorization", "x-api-key", "anthropic-version", "anthropic-beta")


def build_app(upstream: str) -> Starlette:
    """The pass-through application for ``upstream`` (scheme, host and port, no path)."""
    base = upstream.rstrip("/")
    state: dict[str, aiohttp.ClientSession] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        try:
            yield
        finally:
            await state["session"].close()

    async def forward(request: Request) -> Response:
        body = await request.body()
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        for name in _PASSED:
            value = request.headers.get(name)
            if value is not None:
                headers[name] = value
        upstream_resp = await state["session"].request(
            request.method, base + request.url.path, data=body or None, headers=headers)
        out = {k: v for k, v in upstream_resp.headers.items() if k.lower() not in _HOP}
        if upstream_resp.headers.get("content-type", "").startswith("text/event-stream"):
            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for chunk in upstream_resp.content.iter_any():
                        yield chunk
                finally:
                    upstream_resp.release()
            return StreamingResponse(relay(), status_code=upstream_resp.status, headers=out)
        try:
            data = await upstream_resp.read()
        finally:
            upstream_resp.release()
        return Response(data, status_code=upstream_resp.status, headers=out)

    return Starlette(routes=[
        Route("/v1/models", forward, methods=["GET"]),
        Route("/health", forward, methods=["GET"]),
        Route("/v1/chat/completions", forward, methods=["POST"]),
        Route("/v1/messages", forward, methods=["POST"]),
    ], lifespan=lifespan)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:8001")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args(argv)
    import uvicorn
    uvicorn.run(build_app(a.upstream), host=a.host, port=a.port, loop="uvloop", http="httptools",
                access_log=False, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
