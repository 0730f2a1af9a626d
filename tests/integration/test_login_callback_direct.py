"""The operator's pasted Codex redirect URL (``http://localhost:1455/auth/
callback?code=…``) is fetched on this host, directly: never through a proxy
the gateway's own environment names (that would hand the code to it)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pool.cli.login import _fetch
from tests.fakes.egress_proxy import EgressProxy


class _Callback(BaseHTTPRequestHandler):
    hits: list[tuple[str, str | None]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.hits.append((self.path, self.headers.get("via")))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.mark.parametrize("name", ["http_proxy", "HTTP_PROXY", "all_proxy"])
def test_the_pasted_callback_goes_direct_whatever_the_gateways_proxy(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Callback)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with EgressProxy() as proxy:
            for var in ("no_proxy", "NO_PROXY"):
                monkeypatch.delenv(var, raising=False)
            monkeypatch.setenv(name, proxy.url)
            _fetch(f"http://127.0.0.1:{server.server_address[1]}/auth/callback?code=c-secret", 5)
            assert proxy.passed == []
            assert _Callback.hits[-1] == ("/auth/callback?code=c-secret", None)
    finally:
        server.shutdown()
        server.server_close()
