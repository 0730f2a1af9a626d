"""``claude auth login`` of the fake Claude CLI (see fake_claude.py).

Prints the real prompts ("If the browser didn't open, visit: URL" and "Paste
code here if prompted > "), with the authorize URL on ``FAKE_CLAUDE_OAUTH_URL``
(a tests/fakes/idp.py server; its callback page shows ``code#state``), then
reads the code from its terminal: like the real CLI's Ink prompt it needs a
TTY (without one it fails the way Ink's raw mode does). The code's state must
be this process's own (a new process has a new PKCE pair), and the code is
exchanged at the IdP's ``/oauth/token`` with the PKCE verifier; the tokens go
to ``$CLAUDE_CONFIG_DIR/.credentials.json`` (0600) and the account to
``.claude.json``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlencode

CLIENT_ID = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"
SCOPES = "org:create_api_key user:profile user:inference"


def auth_login(home: str) -> int:
    base = os.environ.get("FAKE_CLAUDE_OAUTH_URL", "https://claude.com/cai")
    verifier = secrets.token_urlsafe(32)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    state = secrets.token_urlsafe(16)
    redirect = f"{base}/oauth/code/callback"
    url = f"{base}/oauth/authorize?" + urlencode({
        "code": "true", "client_id": CLIENT_ID, "response_type": "code",
        "redirect_uri": redirect, "scope": SCOPES,
        "code_challenge": challenge.rstrip(b"=").decode(), "code_challenge_method": "S256",
        "state": state})
    print("Opening browser to sign in…")
    print(f"If the browser didn't open, visit: {url}")
    sys.stdout.write("Paste code here if prompted > ")
    sys.stdout.flush()
    if not os.isatty(0):
        print("\nError: Raw mode is not supported on the current process.stdin")
        return 1
    line = sys.stdin.readline().strip()
    code, _, got_state = line.partition("#")
    if not code or got_state != state:
        print("OAuth error: Invalid code or state")
        return 1
    body = json.dumps({"grant_type": "authorization_code", "code": code, "state": got_state,
                       "code_verifier": verifier, "redirect_uri": redirect,
                       "client_id": CLIENT_ID}).encode()
    request = urllib.request.Request(f"{base}/oauth/token", data=body,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            tokens = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        print(f"OAuth error: Request failed with status code {exc.code}")
        return 1
    os.makedirs(home, exist_ok=True)
    write_private(os.path.join(home, ".credentials.json"), {"claudeAiOauth": {
        "accessToken": tokens["access_token"], "refreshToken": tokens["refresh_token"],
        "expiresAt": int((time.time() + tokens.get("expires_in", 3600)) * 1000),
        "scopes": SCOPES.split(), "subscriptionType": "max"}})
    email = tokens.get("account", {}).get("email_address")
    write_private(os.path.join(home, ".claude.json"),
                  {"oauthAccount": {"emailAddress": email}, "hasCompletedOnboarding": True})
    print("Login successful.")
    return 0


def write_private(path: str, data: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
