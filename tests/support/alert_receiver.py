"""A real HTTP receiver of poolgate's alerts on 127.0.0.1, for tests.

Its socket is bound at once, so its URL is known, but it listens only from
:meth:`AlertReceiver.listen`: until then every connection is refused (a
receiver that is down), after it every POST is recorded."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with self.server.lock:
            self.server.posts.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler, bind_and_activate=False)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server_bind()  # bound, not listening: connections are refused
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self.lock = threading.Lock()


class AlertReceiver:
    def __init__(self) -> None:
        self._server = _Server()
        self._thread: threading.Thread | None = None
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks/poolgate"

    def listen(self) -> None:
        self._server.server_activate()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()

    def posts(self) -> list[tuple[dict[str, str], bytes]]:
        with self._server.lock:
            return list(self._server.posts)

    def alerts(self, event: str | None = None) -> list[dict[str, Any]]:
        found = [json.loads(body) for _, body in self.posts()]
        return [a for a in found if event is None or a["event"] == event]

    def wait(self, check: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"the receiver got {self.alerts()}")
            time.sleep(0.05)


def verify(secret: str, headers: dict[str, str], body: bytes, tolerance: float = 300) -> bool:
    """What a receiver does: the signature over ``"<timestamp>." + body``, and a fresh timestamp."""
    timestamp = headers["x-poolgate-timestamp"]
    expected = "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body,
                                    hashlib.sha256).hexdigest()
    return (hmac.compare_digest(expected, headers["x-poolgate-signature"])
            and abs(time.time() - int(timestamp)) <= tolerance)
