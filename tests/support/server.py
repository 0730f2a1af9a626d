"""Run a real ASGI app under uvicorn on 127.0.0.1:<ephemeral> in a thread
(the gateway's app on granian instead when the run asks for it:
``TEST_SERVER_HTTP=granian``, see :mod:`tests.support.server_http`)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import uvicorn

from app.hot import GatewayApp
from app.protocol import LeanHttpToolsProtocol

from .server_http import SERVER_HTTP


class ServerThread:
    """``with ServerThread(app) as srv: srv.url`` — a real uvicorn server with
    its own event loop, so sync and async clients in the test can both use it.
    With ``TEST_SERVER_HTTP=granian`` a gateway app (``create_app``'s, not the
    fakes of other servers) is served by granian, as ``server.http =
    "granian"`` serves it; ``http="uvicorn"`` keeps a test that reads
    uvicorn's own state on uvicorn."""

    def __new__(cls, app: Any, *, http: str | None = None, **options: Any) -> "ServerThread":
        if cls is ServerThread and (http or SERVER_HTTP) == "granian" \
                and isinstance(app, GatewayApp):
            return super().__new__(GranianThread)
        return super().__new__(cls)

    def __init__(self, app: Any, *, lifespan: str = "on", start_timeout: float = 30,
                 http: str | None = None, **options: Any) -> None:
        self.start_timeout = start_timeout  # the app's lifespan may load models
        # log_config=None: leave logging as the process has it (no dictConfig per server)
        self.config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan=lifespan, log_config=None,
                                     log_level="warning", access_log=False,
                                     loop="asyncio", http=LeanHttpToolsProtocol,
                                     timeout_graceful_shutdown=5, **options)
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class GranianThread(ServerThread):
    """The gateway's app on granian's embedded server, run as ``poolgate serve``
    runs it with ``server.http = "granian"`` (``app.granian_server``), on a
    uvloop loop of its own in a thread."""

    def __init__(self, app: Any, *, lifespan: str = "on", start_timeout: float = 30,
                 http: str | None = None, **options: Any) -> None:
        from app.granian_server import build

        assert lifespan == "on" and not options, "granian runs the gateway as poolgate serve does"
        self.app = app
        self.start_timeout = start_timeout
        self.port = 0
        self.started = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping: asyncio.Event | None = None
        self.server = build(app, host="127.0.0.1", port=0, log_level="warning",
                            on_started=self._on_started)
        self.thread = threading.Thread(target=self._run, name="granian", daemon=True)

    def _on_started(self, url: str) -> None:
        self.port = int(url.rsplit(":", 1)[1])
        self.started.set()

    def _run(self) -> None:
        import uvloop

        from app.granian_server import run

        async def serve() -> None:
            self.stopping = asyncio.Event()
            await run(self.app, self.server, self.stopping, shutdown_timeout=5)

        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(serve())
        finally:
            self.loop.close()

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.started.wait(0.01):
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("granian did not start")
        return self

    def stop(self) -> None:
        if self.loop is not None and self.stopping is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(timeout=30)
