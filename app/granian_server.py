"""``server.http = "granian"``: the app served by granian instead of uvicorn.

granian's HTTP/1.1 parsing, connection handling and response writing run in
Rust; the ASGI app runs on this process's event loop (uvloop), one worker in
this process, as with uvicorn (granian's *embedded* server: no child
processes, the same ``poolgate serve`` process, signals handled here).

What the gateway needs of its server, and how it is kept here:

- the lifespan: granian's ASGI lifespan runs the app's startup before the
  first connection is accepted, and its shutdown last;
- graceful shutdown (SIGTERM, SIGINT): the listener closes at once, the
  requests in flight (open streams too) finish within
  ``server.shutdown_timeout``, then the app's lifespan shutdown runs and the
  access lines still buffered are written;
- ``server.listening`` with the bound address (port 0 included: the socket
  is bound here, not in granian's worker);
- granian's own log lines go through poolgate's logging (JSON or console),
  and granian writes no access log of its own.

granian is an optional dependency (``pip install 'poolgate[granian]'``);
:func:`missing` says so when it is asked for but not installed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from typing import Any

from .settings import Settings

__all__ = ["serve", "build", "missing"]


# granian's loggers go to the root logger (poolgate's renderer): incremental,
# so granian's dictConfig leaves every handler as poolgate configured it; its
# access log stays off (poolgate writes its own line per request)
_LOGGING = {
    "incremental": True,
    "handlers": {},
    "loggers": {"granian.access": {"propagate": False, "level": "CRITICAL"}},
}


def missing() -> str | None:
    """Why granian cannot serve here (not installed), or None."""
    try:
        import granian  # noqa: F401
    except ImportError:
        return ('server.http = "granian" needs granian: pip install "poolgate[granian]" '
                '(or set server.http = "uvicorn")')
    return None


def serve(app: Any, settings: Settings, on_started: Any, on_stopped: Any) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then shut down gracefully.
    ``on_started(url)`` runs once the app started and the socket listens;
    ``on_stopped()`` once every request has ended."""
    import uvloop

    uvloop.run(_serve(app, settings, on_started, on_stopped))


async def _serve(app: Any, settings: Settings, on_started: Any, on_stopped: Any) -> None:
    server = settings.server
    granian = build(app, host=server.host, port=server.port, log_level=server.log_level,
                    shutdown_timeout=server.shutdown_timeout, on_started=on_started)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, granian.stop)
    try:
        await granian.serve()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        on_stopped()


def build(app: Any, *, host: str, port: int, log_level: str, shutdown_timeout: float,
          on_started: Any) -> Any:
    """granian's embedded server for ``app`` (not started: ``await it.serve()``,
    ``it.stop()`` from its loop); ``on_started(url)`` once it serves."""
    from granian.constants import HTTPModes, Interfaces
    from granian.log import LogLevels
    from granian.net import SocketSpec
    from granian.server.embed import Server

    class _Server(Server):
        """granian's embedded server on a socket bound here (so the port is known)."""

        def _init_shared_socket(self) -> None:
            self._shd = SocketSpec(self.bind_addr, self.bind_port, self.backlog).build()
            self._sfd = self._shd.get_fd()
            self._ssp = None

    granian = _Server(
        _Announcing(app, lambda: on_started(_url(granian))), address=host, port=port,
        interface=Interfaces.ASGI, http=HTTPModes.http1, websockets=False, backlog=2048,
        log_level=LogLevels(log_level), log_dictconfig=_LOGGING, log_access=False,
    )
    granian.workers_kill_timeout = max(1, round(shutdown_timeout))
    return granian


class _Announcing:
    """``app``, calling ``started()`` once its lifespan startup completed (granian
    serves right after). Not a coroutine function: a request's call returns the
    app's own coroutine, no frame of ours in between."""

    __slots__ = ("app", "started")

    def __init__(self, app: Any, started: Any) -> None:
        self.app = app
        self.started = started

    def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "lifespan":
            return self.app(scope, receive, send)
        return self.app(scope, receive, self._sender(send))

    def _sender(self, send: Any) -> Any:
        async def sent(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete":
                self.started()
        return sent


def _url(granian: Any) -> str:
    """The address granian's socket is bound to."""
    with socket.socket(fileno=os.dup(granian._sfd)) as sock:
        host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"
