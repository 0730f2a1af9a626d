"""``account/login/start`` of the fake Codex app-server (see codex_app_server.py).

``{"type": "chatgpt"}`` answers ``{loginId, authUrl}`` with the authorize URL
at ``$CODEX_APP_SERVER_LOGIN_ISSUER`` (as the real 0.169.0 builds it: PKCE
S256, a state, ``redirect_uri=http://127.0.0.1:<port>/auth/callback``) and
starts the login listener. The real one listens on the fixed port 1455; the
fake on ``$FAKE_CODEX_LOGIN_PORT`` (default: any free port), so parallel test
runs do not collide. The callback checks the state, exchanges the code at
``<issuer>/oauth/token`` with the verifier, writes ``auth.json`` (its access
token as the key the fake uses upstream), notifies
``account/login/completed`` and redirects the browser to ``/success``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qsl, urlencode, urlsplit

CLIENT_ID = "app_EMoamEEZ73f0CkXaXp7hrann"


def start_login(home: Path, params: dict[str, Any],
                notify: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
    if params.get("type") != "chatgpt":
        raise LookupError(f"login type {params.get('type')!r} is not faked")
    issuer = os.environ.get("CODEX_APP_SERVER_LOGIN_ISSUER", "https://auth.openai.com")
    verifier = secrets.token_urlsafe(32)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    state, login_id = secrets.token_urlsafe(16), secrets.token_hex(8)
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("FAKE_CODEX_LOGIN_PORT", 0))),
                                 BaseHTTPRequestHandler)
    redirect = f"http://127.0.0.1:{server.server_address[1]}/auth/callback"

    def finish(success: bool, error: str | None) -> None:
        notify("account/login/completed", {"loginId": login_id, "success": success,
                                           "error": error})

    class Callback(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/success":
                self._answer(200, "<p id='done'>Signed in to Codex.</p>")
                threading.Thread(target=server.shutdown, daemon=True).start()
                return
            query = dict(parse_qsl(url.query))
            if url.path != "/auth/callback" or query.get("state") != state:
                self._answer(400, "<p id='error'>State mismatch.</p>")
                return
            error = exchange(issuer, query.get("code", ""), verifier, redirect, home)
            finish(error is None, error)
            if error is not None:
                self._answer(500, f"<p id='error'>{error}</p>")
                return
            self.send_response(302)
            self.send_header("location", "/success")
            self.send_header("content-length", "0")
            self.end_headers()

        def _answer(self, status: int, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server.RequestHandlerClass = Callback
    threading.Thread(target=server.serve_forever, daemon=True).start()
    auth_url = f"{issuer}/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": CLIENT_ID, "redirect_uri": redirect,
        "scope": "openid profile email offline_access",
        "code_challenge": challenge.rstrip(b"=").decode(), "code_challenge_method": "S256",
        "state": state})
    return {"type": "chatgpt", "loginId": login_id, "authUrl": auth_url}


def exchange(issuer: str, code: str, verifier: str, redirect: str, home: Path) -> str | None:
    body = urlencode({"grant_type": "authorization_code", "code": code,
                      "code_verifier": verifier, "redirect_uri": redirect,
                      "client_id": CLIENT_ID}).encode()
    request = urllib.request.Request(f"{issuer}/oauth/token", data=body, headers={
        "content-type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            tokens = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return f"Token exchange failed: {exc.code}"
    home.mkdir(parents=True, exist_ok=True)
    path = home / "auth.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"auth_mode": "chatgpt", "OPENAI_API_KEY": tokens["access_token"],
                   "tokens": {"id_token": tokens.get("id_token"),
                              "access_token": tokens["access_token"],
                              "refresh_token": tokens.get("refresh_token")}}, fh)
    return None
