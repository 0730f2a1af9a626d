"""``server.http = "granian"``: the app served by granian instead of uvicorn.

granian's HTTP/1.1 parsing, connection handling and response writing run in
Rust; the ASGI app runs on this process's event loop (uvloop), one worker in
this process, as with uvicorn (granian's *embedded* server: no child
processes, the same ``poolgate serve`` process, signals handled here).

What the gateway needs of its server, and how it is kept here:

- the lifespan is run here, around the server (granian serves the app
  without one: ``asginl``): startup before the socket is bound, shutdown
  once the server has stopped, and always (granian's own would be skipped
  when its worker is stopped by force, leaving worker processes behind);
- graceful shutdown (SIGTERM, SIGINT): the listener closes at once and the
  requests in flight (open streams too) get ``server.shutdown_timeout`` to
  finish; past it they are cancelled (as uvicorn does), then the lifespan
  shuts down;
- ``server.listening`` with the bound address (port 0 included: the socket is
  bound here, not in granian's worker);
- granian's own log lines go through poolgate's logging (JSON or console), and
  granian writes no access log of its own.

granian is an optional dependency (``pip install 'poolgate[granian]'``);
:func:`missing` says so when it is asked for but not installed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from typing import Any, Callable

import structlog

from .settings import Settings

__all__ = ["serve", "build", "run", "missing", "AFTER_SHUTDOWN"]

log = structlog.get_logger("poolgate")

# granian's loggers go to the root logger (poolgate's renderer): incremental,
# so granian's dictConfig leaves every handler as poolgate configured it; its
# access log stays off (poolgate writes its own line per request)
_LOGGING = {
    "incremental": True,
    "handlers": {},
    "loggers": {"granian.access": {"propagate": False, "level": "CRITICAL"}},
}

# seconds granian's worker gets to go once its requests were cancelled at the
# shutdown timeout (the lifespan shuts down after it either way)
AFTER_SHUTDOWN = 5.0


def missing() -> str | None:
    """Why granian cannot serve here (not installed), or None."""
    try:
        import granian  # noqa: F401
    except ImportError:
        return ('server.http = "granian" needs granian: pip install "poolgate[granian]" '
                '(or set server.http = "uvicorn")')
    return None


def serve(app: Any, settings: Settings, on_started: Callable[[str], None],
          on_stopped: Callable[[], None]) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then shut down gracefully.
    ``on_started(url)`` runs once the app started and the socket listens;
    ``on_stopped()`` once every request has ended."""
    import uvloop

    uvloop.run(_serve(app, settings, on_started, on_stopped))


async def _serve(app: Any, settings: Settings, on_started: Callable[[str], None],
                 on_stopped: Callable[[], None]) -> None:
    server = settings.server
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        granian = build(app, host=server.host, port=server.port, log_level=server.log_level,
                        on_started=on_started)
        await run(app, granian, stop, server.shutdown_timeout)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        on_stopped()


async def run(app: Any, granian: Any, stop: asyncio.Event, shutdown_timeout: float) -> None:
    """The app's lifespan around ``granian`` serving it, until ``stop`` is set."""
    serving: asyncio.Future[None] | None = None
    try:
        async with app.router.lifespan_context(app):
            serving = asyncio.ensure_future(granian.serve())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if serving.done():
                serving.result()  # it failed (the port is taken, …): say why
                return
            granian.stop()  # the listener closes; what is in flight goes on
            await asyncio.wait({serving}, timeout=shutdown_timeout)
            if not serving.done():
                log.warning("server.shutdown_timeout", seconds=shutdown_timeout,
                            detail="requests still in flight are cancelled")
                _quiet_cancelled(asyncio.get_running_loop())
                serving.cancel()  # granian's worker goes: its requests are cancelled
                await asyncio.wait({serving}, timeout=AFTER_SHUTDOWN)
    finally:
        if serving is not None and not serving.done():
            serving.cancel()


class _NotCancelled(logging.Filter):
    """Drops granian's report of a request cancelled at the shutdown timeout
    (its traceback ends in ``CancelledError``): cancelling them was ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().rstrip().endswith("CancelledError:")


def _quiet_cancelled(loop: asyncio.AbstractEventLoop) -> None:
    """Past the shutdown timeout, the requests cancelled and the worker stopped by
    force are no errors: granian's reports of them are dropped (its report of a
    request cancelled, and the failure of its "worker stopped" callback on the
    cancelled worker); anything else is reported as before."""
    logging.getLogger("_granian.utils").addFilter(_NotCancelled())
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), asyncio.InvalidStateError) \
                and "shutdown_glue" in repr(context.get("handle")):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def build(app: Any, *, host: str, port: int, log_level: str,
          on_started: Callable[[str], None]) -> Any:
    """granian's embedded server for ``app``, without a lifespan (:func:`run` runs
    it); ``on_started(url)`` once it listens."""
    from granian.constants import HTTPModes, Interfaces
    from granian.log import LogLevels
    from granian.net import SocketSpec
    from granian.server.embed import Server

    class _Server(Server):
        """granian's embedded server on a socket bound here (so the port is known),
        saying where it listens once its worker is spawned."""

        def _init_shared_socket(self) -> None:
            self._shd = SocketSpec(self.bind_addr, self.bind_port, self.backlog).build()
            self._sfd = self._shd.get_fd()
            self._ssp = None

        def startup(self, spawn_target: Any, target_loader: Any) -> None:
            super().startup(spawn_target, target_loader)
            on_started(_url(self._sfd))

    granian = _Server(
        app, address=host, port=port, interface=Interfaces.ASGINL, http=HTTPModes.http1,
        websockets=False, backlog=2048, log_level=LogLevels(log_level), log_dictconfig=_LOGGING,
        log_access=False,
    )
    granian.workers_kill_timeout = None  # run() bounds the shutdown itself
    return granian


def _url(fd: int) -> str:
    """The address the listening socket ``fd`` is bound to."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"
