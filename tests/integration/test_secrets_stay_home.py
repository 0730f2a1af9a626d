"""The gateway's secrets stay home (issue 21, section 4), through a real
gateway: a run-time worker may only name in ``api_key_env`` the variables
``server.runtime_secret_envs`` lists (else its health probe would carry, say,
the admin token to a URL of the registrant's choosing), and ``poolgate join``
never follows a redirect with the admin token."""

from __future__ import annotations

import http.server
import os
import random
import re
import subprocess
import sys
import threading
from typing import Any, Iterator

import httpx
import pytest

from app.factory import create_app
from app.settings import load_settings
from tests.fakes.upstreams import FakeUpstream
from tests.support.paths import REPO
from tests.support.server import ServerThread

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ADMIN_TOKEN = "admin-token-stays-home-0123456789"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
UPSTREAM_SECRET = "sk-upstream-allowed-0123456789"
CLOUD_SECRET = "cloud-secret-never-leaves-0123456789"


@pytest.fixture
def thief() -> Iterator[FakeUpstream]:
    """A server of the registrant's choosing: it records every header it gets."""
    with FakeUpstream(models=("stolen-model",)) as server:
        yield server


def _gateway(secret_envs: list[str]) -> tuple[Any, dict[str, str]]:
    environ = {"POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN, "UPSTREAM_SECRET": UPSTREAM_SECRET,
               "AWS_SECRET_ACCESS_KEY": CLOUD_SECRET}
    settings = load_settings(None, environ, {"server": {"port": 0,
                                                        "runtime_secret_envs": secret_envs}})
    return create_app(settings), environ


def _sent(server: FakeUpstream) -> str:
    return repr([r.headers for r in server.requests])


@pytest.mark.parametrize("variable", ["POOLGATE_ADMIN_TOKEN", "AWS_SECRET_ACCESS_KEY",
                                      "UPSTREAM_SECRET"])
def test_a_registered_worker_cannot_name_an_unlisted_variable(thief, variable) -> None:
    app, _ = _gateway([])  # nothing listed (the default): no variable may be named
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        r = http.post("/internal/workers", headers=ADMIN, json={
            "name": "thief", "dialect": "openai", "url": thief.url, "models": ["stolen-model"],
            "api_key_env": variable})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "api_key_env"
        assert "runtime_secret_envs" in r.json()["error"]["message"]
        assert ADMIN_TOKEN not in r.text and CLOUD_SECRET not in r.text
        names = {w["name"] for w in http.get("/internal/workers", headers=ADMIN).json()["workers"]}
        assert "thief" not in names
    for secret in (ADMIN_TOKEN, CLOUD_SECRET, UPSTREAM_SECRET):
        assert secret not in _sent(thief)


def test_a_listed_variable_may_be_named_and_only_that_one(thief) -> None:
    app, _ = _gateway(["UPSTREAM_SECRET"])
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        refused = http.post("/internal/workers", headers=ADMIN, json={
            "name": "thief", "dialect": "openai", "url": thief.url, "models": ["stolen-model"],
            "api_key_env": "POOLGATE_ADMIN_TOKEN"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "api_key_env"
        assert ADMIN_TOKEN not in _sent(thief)
        allowed = http.post("/internal/workers", headers=ADMIN, json={
            "name": "allowed", "dialect": "openai", "url": thief.url,
            "models": ["stolen-model"], "api_key_env": "UPSTREAM_SECRET"})
        assert allowed.status_code == 201, allowed.text
        assert thief.requests[-1].headers["authorization"] == f"Bearer {UPSTREAM_SECRET}"


def test_runtime_secret_envs_must_be_variable_names() -> None:
    from app.settings import ConfigError
    with pytest.raises(ConfigError, match="runtime_secret_envs"):
        load_settings(None, {}, {"server": {"runtime_secret_envs": ["NOT A NAME"]}})


# --- poolgate join and redirects -------------------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers with ``server.answer(handler)``; records each request's headers."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.seen.append(dict(self.headers))  # type: ignore[attr-defined]
        self.server.answer(self)  # type: ignore[attr-defined]

    do_GET = do_POST

    def log_message(self, *args: Any) -> None:
        pass


class _Server:
    def __init__(self, answer: Any) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        self.httpd.seen = []  # type: ignore[attr-defined]
        self.httpd.answer = answer  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def seen(self) -> list[dict[str, str]]:
        return self.httpd.seen  # type: ignore[attr-defined]

    def __enter__(self) -> "_Server":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _redirect_to(target: str, status: int) -> Any:
    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("location", target + "/internal/workers")
        handler.send_header("content-length", "0")
        handler.end_headers()
    return answer


def _created(handler: http.server.BaseHTTPRequestHandler) -> None:
    body = b'{"name": "w", "state": "ready", "models": ["m"]}'
    handler.send_response(201)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_poolgate_join_never_follows_a_redirect_with_the_admin_token(status) -> None:
    with _Server(_created) as elsewhere, _Server(_redirect_to(elsewhere.url, status)) as gateway:
        env = {k: v for k, v in os.environ.items() if not k.startswith("POOLGATE_")}
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "join", "--gateway", gateway.url, "--name", "w",
             "--dialect", "openai", "--url", "http://127.0.0.1:9/v1", "--model", "m",
             "--wait", "0"],
            env={**env, "POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN}, cwd=REPO, capture_output=True,
            text=True, timeout=60)
        assert len(gateway.seen) == 1  # the gateway itself got the token, as it should
        assert elsewhere.seen == []  # nobody else did
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"redirect ({status})" in done.stdout
        assert elsewhere.url + "/internal/workers" in done.stdout  # says where to point it
        assert ADMIN_TOKEN not in done.stdout + done.stderr


# --- ids from the CSPRNG ---------------------------------------------------------------------


def test_request_and_response_ids_do_not_come_from_the_random_module() -> None:
    """``random`` is the Mersenne Twister: its state is recoverable from its
    outputs (which ``x-request-id`` exposed) and resettable by any library
    calling ``random.seed``. Ids from the OS's CSPRNG differ however it is seeded."""
    with FakeUpstream(api_key=UPSTREAM_SECRET, models=("m",)) as upstream:
        settings = load_settings(None, {"UPSTREAM_SECRET": UPSTREAM_SECRET}, {
            "server": {"port": 0, "api_keys": {"team": "sk-ids-client"}},
            "workers": [{"name": "w", "dialect": "openai", "url": upstream.url, "models": ["m"],
                         "api_key_env": "UPSTREAM_SECRET"}]})
        with ServerThread(create_app(settings)) as srv, httpx.Client(base_url=srv.url) as http:
            seen: list[tuple[str, str]] = []
            for _ in range(3):
                random.seed(1234)  # the same state of `random` before each request
                # an Anthropic request to an OpenAI worker: the gateway names the response
                r = http.post("/v1/messages", headers={"authorization": "Bearer sk-ids-client"},
                              json={"model": "m", "max_tokens": 8,
                                    "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200, r.text
                request_id, response_id = r.headers["x-request-id"], r.json()["id"]
                assert re.fullmatch(r"[0-9a-f]{32}", request_id)
                assert re.fullmatch(r"msg_[0-9a-f]{24}", response_id)
                seen.append((request_id, response_id))
    assert len({request_id for request_id, _ in seen}) == 3
    assert len({response_id for _, response_id in seen}) == 3
