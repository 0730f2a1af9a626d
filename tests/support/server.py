"""Run a real ASGI app under uvicorn on 127.0.0.1:<ephemeral> in a thread."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from app.protocol import LeanHttpToolsProtocol


class ServerThread:
    """``with ServerThread(app) as srv: srv.url`` — a real uvicorn server with
    its own event loop, so sync and async clients in the test can both use it."""

    def __init__(self, app: Any, *, lifespan: str = "on", start_timeout: float = 30,
                 **options: Any) -> None:
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
