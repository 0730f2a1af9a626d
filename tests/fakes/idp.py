"""A fake OAuth identity provider (stdlib ``ThreadingHTTPServer``) for login tests.

Flow: ``GET /oauth/authorize?redirect_uri&state&code_challenge…`` sets a CSRF
cookie and shows the login form (username, password, a hidden CSRF token
checked against the cookie, and a submit button that only JavaScript
enables); a wrong password re-renders it with ``<p id="error">`` (401); the
user ``slow`` makes the consent POST hang; then a consent page (``#allow``),
then a 302 to ``redirect_uri?code=…&state=…``. ``redirect_uri`` may be the
IdP's own ``/oauth/code/callback``, which shows ``code#state`` in
``<code id="code">`` as Anthropic's callback page does.

Google's shape too (Gemini CLI's login): ``GET /o/oauth2/v2/auth`` shows an
email step (``#identifierId``, ``#identifierNext``), then a password step
(``input[name=Passwd]``, ``#passwordNext``; a wrong one shows ``#pwError``
"Wrong password. Try again or click Forgot password to reset it."), then a
consent page (a "Continue" button), then a 302 to ``redirect_uri?code&state``;
``/authcode`` shows the code as ``codeassist.google.com/authcode`` does.

Users given a TOTP seed (``totp=``) must also fill ``#otp`` with a valid code.
``POST /oauth/token`` (form or JSON: ``code``, ``code_verifier``) checks PKCE
(S256) and answers tokens that name the user (``at-<user>-…``, and an
unsigned ``id_token`` with the claims Codex reads), so tests can tell whose
login ended where; a token-exchange grant (Codex asking for an API key) gets one.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

__all__ = ["FakeIdP"]

LOGIN_PAGE = """<!doctype html><html><body><h1>Sign in</h1>{error}
<form method="post" action="/login">
<input type="hidden" name="csrf" value="{csrf}"><input type="hidden" name="flow" value="{flow}">
<label>Email <input id="username" name="username"></label>
<label>Password <input id="password" name="password" type="password"></label>
<label>One-time code <input id="otp" name="otp"></label>
<button id="submit" type="submit" disabled>Continue</button></form>
<script>setTimeout(function(){{document.getElementById('submit').disabled=false}}, 150)</script>
</body></html>"""
CONSENT_PAGE = """<!doctype html><html><body><h1>Allow access?</h1>
<form method="post" action="/consent"><input type="hidden" name="flow" value="{flow}">
<button id="allow" type="submit">Allow</button></form></body></html>"""
GOOGLE_EMAIL_PAGE = """<!doctype html><html><body><h1>Sign in</h1>
<form method="post" action="/v3/signin/identifier"><input type="hidden" name="flow" value="{flow}">
<input type="email" id="identifierId" name="identifier">
<div id="identifierNext"><button type="submit">Next</button></div></form></body></html>"""
GOOGLE_PASSWORD_PAGE = """<!doctype html><html><body><h1>Welcome</h1>{error}
<form method="post" action="/v3/signin/challenge/pwd"><input type="hidden" name="flow" value="{flow}">
<input type="password" name="Passwd">
<div id="passwordNext"><button type="submit">Next</button></div></form></body></html>"""
GOOGLE_CONSENT_PAGE = """<!doctype html><html><body>
<h1>Gemini Code Assist wants to access your Google Account</h1>
<form method="post" action="/signin/oauth/consent"><input type="hidden" name="flow" value="{flow}">
<button type="button">Cancel</button><button type="submit">Continue</button></form></body></html>"""
AUTHCODE_PAGE = """<!doctype html><html><body><p>Sign in to Gemini Code Assist</p>
<p>Copy this code and paste it into your app:</p><textarea readonly>{code}</textarea>
</body></html>"""
CALLBACK_PAGE = """<!doctype html><html><body><p>Paste this code into the CLI:</p>
<code id="code">{code}#{state}</code></body></html>"""


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """Browsers abort requests (favicons, closed contexts): not the test's failure."""
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def _id_token(user: str) -> str:
    """An unsigned JWT with the claims Codex reads (email, ChatGPT account)."""
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    claims = {"email": user, "exp": int(time.time()) + 3600, "iat": int(time.time()),
              "https://api.openai.com/auth": {"chatgpt_account_id": f"acct-{user}",
                                              "chatgpt_plan_type": "pro",
                                              "chatgpt_user_id": f"user-{user}"}}
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.sig"


class FakeIdP:
    def __init__(self, users: dict[str, str], *, hang_seconds: float = 30.0,
                 totp: dict[str, str] | None = None) -> None:
        self.users = dict(users)
        self.totp = dict(totp or {})  # user -> TOTP seed: these users must give a valid otp
        self.hang_seconds = hang_seconds
        self.flows: dict[str, dict[str, str]] = {}  # flow id -> authorize params + user
        self.codes: dict[str, dict[str, str]] = {}  # code -> flow
        self.tokens_issued: list[str] = []  # users, in order
        # every request: (method, path, its Via header: None when it came direct)
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        self.server = _QuietServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def authorize_url(self, redirect_uri: str, state: str, challenge: str = "") -> str:
        return f"{self.url}/oauth/authorize?" + urlencode(
            {"response_type": "code", "client_id": "test", "redirect_uri": redirect_uri,
             "state": state, "code_challenge": challenge, "code_challenge_method": "S256"})

    def _otp_ok(self, user: str, form: dict[str, str]) -> bool:
        if user not in self.totp:
            return True
        import pyotp

        return bool(pyotp.TOTP(self.totp[user]).verify(form.get("otp", ""), valid_window=1))

    def sign_in(self, url: str, user: str, password: str) -> str:
        """What a person does in a browser (elsewhere): sign in at ``url``, allow,
        and copy where the IdP redirects (the callback URL with code and state)."""
        import httpx  # a test dependency; the server itself is stdlib

        with httpx.Client(timeout=30) as browser:
            page = browser.get(url).text
            csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
            flow = re.search(r'name="flow" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
            browser.post(f"{self.url}/login", data={"csrf": csrf, "flow": flow,
                                                    "username": user, "password": password})
            return browser.post(f"{self.url}/consent", data={"flow": flow}).headers["location"]

    def __enter__(self) -> FakeIdP:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: str, ctype: str = "text/html",
                      headers: dict[str, str] | None = None) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _form(self) -> dict[str, str]:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
                if self.headers.get("content-type", "").startswith("application/json"):
                    return {k: str(v) for k, v in json.loads(raw or "{}").items()}
                return dict(parse_qsl(raw))

            def _cookie(self, name: str) -> str | None:
                for part in (self.headers.get("cookie") or "").split(";"):
                    k, _, v = part.strip().partition("=")
                    if k == name:
                        return v
                return None

            def _seen(self) -> None:
                # a request a proxy forwarded carries its Via header (tests/fakes/egress_proxy.py)
                with idp.lock:
                    idp.requests.append((self.command, urlsplit(self.path).path,
                                         self.headers.get("via")))

            def do_GET(self) -> None:
                self._seen()
                url = urlsplit(self.path)
                query = dict(parse_qsl(url.query))
                if url.path == "/oauth/authorize":
                    flow = secrets.token_hex(8)
                    with idp.lock:
                        idp.flows[flow] = dict(query)
                    csrf = secrets.token_hex(8)
                    self._send(200, LOGIN_PAGE.format(error="", csrf=csrf, flow=flow),
                               headers={"set-cookie": f"csrf={csrf}; Path=/"})
                elif url.path == "/o/oauth2/v2/auth":
                    flow = secrets.token_hex(8)
                    with idp.lock:
                        idp.flows[flow] = dict(query)
                    self._send(200, GOOGLE_EMAIL_PAGE.format(flow=flow))
                elif url.path == "/authcode":
                    self._send(200, AUTHCODE_PAGE.format(code=html.escape(query.get("code", ""))))
                elif url.path == "/oauth/code/callback":
                    self._send(200, CALLBACK_PAGE.format(code=html.escape(query.get("code", "")),
                                                         state=html.escape(query.get("state", ""))))
                elif url.path == "/favicon.ico":
                    self._send(404, "")
                else:
                    self._send(404, "<p id='error'>not found</p>")

            def do_POST(self) -> None:
                self._seen()
                path = urlsplit(self.path).path
                form = self._form()
                if path == "/login":
                    self._login(form)
                elif path == "/consent":
                    self._consent(form)
                elif path == "/v3/signin/identifier":
                    self._google_identifier(form)
                elif path == "/v3/signin/challenge/pwd":
                    self._google_password(form)
                elif path == "/signin/oauth/consent":
                    self._consent(form)
                elif path == "/oauth/token":
                    self._token(form)
                else:
                    self._send(404, "")

            def _login(self, form: dict[str, str]) -> None:
                flow = idp.flows.get(form.get("flow", ""))
                if flow is None or form.get("csrf") != self._cookie("csrf"):
                    self._send(403, "<p id='error'>CSRF check failed.</p>")
                    return
                user = form.get("username", "")
                if idp.users.get(user) != form.get("password") or not idp._otp_ok(user, form):
                    csrf = secrets.token_hex(8)
                    self._send(401, LOGIN_PAGE.format(
                        error="<p id='error'>Invalid username or password.</p>",
                        csrf=csrf, flow=form["flow"]),
                        headers={"set-cookie": f"csrf={csrf}; Path=/"})
                    return
                flow["user"] = user
                self._send(200, CONSENT_PAGE.format(flow=form["flow"]))

            def _google_identifier(self, form: dict[str, str]) -> None:
                flow = idp.flows.get(form.get("flow", ""))
                if flow is None:
                    self._send(400, "<p id='error'>No login in progress.</p>")
                    return
                flow["identifier"] = form.get("identifier", "")
                self._send(200, GOOGLE_PASSWORD_PAGE.format(error="", flow=form["flow"]))

            def _google_password(self, form: dict[str, str]) -> None:
                flow = idp.flows.get(form.get("flow", ""))
                if flow is None or "identifier" not in flow:
                    self._send(400, "<p id='error'>No login in progress.</p>")
                    return
                user = flow["identifier"]
                if idp.users.get(user) != form.get("Passwd"):
                    self._send(200, GOOGLE_PASSWORD_PAGE.format(flow=form["flow"], error=(
                        "<div id='pwError'>Wrong password. Try again or click Forgot "
                        "password to reset it.</div>")))
                    return
                flow["user"] = user
                self._send(200, GOOGLE_CONSENT_PAGE.format(flow=form["flow"]))

            def _consent(self, form: dict[str, str]) -> None:
                flow = idp.flows.get(form.get("flow", ""))
                if flow is None or "user" not in flow:
                    self._send(400, "<p id='error'>No login in progress.</p>")
                    return
                if flow["user"] == "slow":
                    time.sleep(idp.hang_seconds)
                code = f"c-{flow['user']}-{secrets.token_hex(6)}"
                with idp.lock:
                    idp.codes[code] = flow
                target = flow.get("redirect_uri", "")
                sep = "&" if "?" in target else "?"
                self._send(302, "", headers={"location": target + sep + urlencode(
                    {"code": code, "state": flow.get("state", "")})})

            def _token(self, form: dict[str, str]) -> None:
                if form.get("grant_type", "").endswith("token-exchange"):  # Codex: an API key
                    self._send(200, json.dumps({"access_token": "sk-exchanged-" +
                                                secrets.token_hex(4)}), "application/json")
                    return
                with idp.lock:
                    flow = idp.codes.pop(form.get("code", ""), None)
                if flow is None:
                    self._send(400, json.dumps({"error": "invalid_grant"}), "application/json")
                    return
                verifier = form.get("code_verifier", "")
                digest = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
                if flow.get("code_challenge") and \
                        digest.rstrip(b"=").decode() != flow["code_challenge"]:
                    self._send(400, json.dumps({"error": "invalid_grant", "why": "pkce"}),
                               "application/json")
                    return
                user = flow["user"]
                with idp.lock:
                    idp.tokens_issued.append(user)
                self._send(200, json.dumps({
                    "id_token": _id_token(user),
                    "access_token": f"at-{user}-{secrets.token_hex(4)}",
                    "refresh_token": f"rt-{user}-{secrets.token_hex(4)}",
                    "expires_in": 3600, "account": {"email_address": user}}),
                    "application/json")

        return Handler
