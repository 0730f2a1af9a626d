"""Codex accounts logged in through a real poolgate, on the fake app-server
(its ``account/login/start`` builds the URL at the issuer, listens for the
callback and exchanges the code like the real one): auto-login through real
Chromium, where the browser's redirect reaches the app-server's own listener,
and the operator path, where the pasted redirect URL is fetched locally;
each confirmed by a turn that reaches the upstream with the new token."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import openai
import pytest
from pydantic import SecretStr

from app.account_settings import LoginSettings
from app.factory import create_app
from app.settings import ServerSettings, Settings
from auth.autologin import CHROMIUM
from tests.fakes.idp import FakeIdP
from tests.fakes.responses_upstream import ResponsesUpstream
from tests.integration.clis import CODEX, ensure_cli
from tests.support.codex_accounts import (CODEX_MODEL, FAKE_CODEX, codex_home, codex_worker,
                                          provider_options)
from tests.support.cli_accounts import wait_for
from tests.support.procs import alive
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

ADMIN = {"authorization": "Bearer admin-token"}
RECIPE = str(Path(__file__).resolve().parents[2] / "examples" / "login-recipes" /
             "form-consent.toml")


@pytest.fixture
def upstream():
    with ResponsesUpstream(models=(CODEX_MODEL,)) as fake:
        yield fake


@pytest.fixture
def idp():
    with FakeIdP({"alice@example.com": "pw-alice"}) as server:
        yield server


def served(tmp_path: Path, upstream: ResponsesUpstream, idp: FakeIdP, **extra) -> ServerThread:
    worker = codex_worker("codex-a", codex_home(tmp_path / "codex-a", None), upstream.url,
                          env={"CODEX_APP_SERVER_LOGIN_ISSUER": idp.url}, **extra)
    return ServerThread(create_app(Settings(
        server=ServerSettings(admin_token="admin-token", api_keys={"team": "sk-team"}),
        workers=(worker,))))


def status(http: httpx.Client) -> dict:
    return http.get("/internal/workers/codex-a/login", headers=ADMIN).json()


def settle(http: httpx.Client) -> dict:
    deadline = time.monotonic() + 90
    while (s := status(http))["state"] not in ("ready", "failed"):
        assert time.monotonic() < deadline, s
        time.sleep(0.2)
    return s


def turn(srv: ServerThread, upstream: ResponsesUpstream) -> None:
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-team", max_retries=0) as client:
        client.chat.completions.create(model=CODEX_MODEL,
                                       messages=[{"role": "user", "content": "Say hi"}])
    auth = [r.headers.get("authorization") for r in upstream.requests if r.body is not None]
    assert auth and auth[-1].startswith("Bearer at-alice@example.com-")


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"Chromium is not at {CHROMIUM}")
def test_auto_login_of_a_codex_account(tmp_path: Path, upstream: ResponsesUpstream,
                                       idp: FakeIdP) -> None:
    login = LoginSettings(recipe=RECIPE, username=SecretStr("alice@example.com"),
                          password=SecretStr("pw-alice"), timeout=60, relogin=False)
    with served(tmp_path, upstream, idp, login=login) as srv, \
            httpx.Client(base_url=srv.url, timeout=120) as http:
        wait_for(lambda: status(http)["login"] == "logged_out", timeout=30)
        started = http.post("/internal/workers/codex-a/login", headers=ADMIN, json={})
        assert started.status_code == 202 and started.json()["auto"] is True
        done = settle(http)
        assert done["state"] == "ready", done
        assert done["url"].startswith(f"{idp.url}/oauth/authorize?")
        turn(srv, upstream)


def test_the_operator_pastes_the_codex_redirect_url(tmp_path: Path, upstream: ResponsesUpstream,
                                                     idp: FakeIdP) -> None:
    with served(tmp_path, upstream, idp) as srv, \
            httpx.Client(base_url=srv.url, timeout=120) as http:
        wait_for(lambda: status(http)["login"] == "logged_out", timeout=30)
        started = http.post("/internal/workers/codex-a/login", headers=ADMIN,
                            json={"auto": False}).json()
        assert started["state"] == "waiting_for_code"
        redirect = idp.sign_in(started["url"], "alice@example.com", "pw-alice")
        assert redirect.startswith("http://127.0.0.1:") and "/auth/callback?" in redirect
        pasted = http.post("/internal/workers/codex-a/login/code", headers=ADMIN,
                           json={"code": redirect})
        assert pasted.status_code == 200
        done = settle(http)
        assert done["state"] == "ready", done
        assert "code=" not in str({k: v for k, v in done.items() if k != "url"})
        turn(srv, upstream)


def test_codex_logins_wait_in_line_for_the_fixed_port(tmp_path: Path, upstream: ResponsesUpstream,
                                                      idp: FakeIdP) -> None:
    workers = [codex_worker(n, codex_home(tmp_path / n, None), upstream.url,
                            env={"CODEX_APP_SERVER_LOGIN_ISSUER": idp.url})
               for n in ("codex-a", "codex-b")]
    settings = Settings(server=ServerSettings(admin_token="admin-token",
                                              api_keys={"team": "sk-team"}),
                        workers=tuple(workers))
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=120, headers=ADMIN) as http:
        def state(name: str) -> dict:
            return http.get(f"/internal/workers/{name}/login").json()

        for name in ("codex-a", "codex-b"):
            wait_for(lambda: state(name)["login"] == "logged_out", timeout=30)
        a = http.post("/internal/workers/codex-a/login", json={"auto": False}).json()
        b = http.post("/internal/workers/codex-b/login", json={"auto": False}).json()
        assert a["state"] == "waiting_for_code"
        assert b["state"] == "queued" and b["url"] is None and "port 1455" in b["last_error"]
        http.post("/internal/workers/codex-a/login/code",
                  json={"code": idp.sign_in(a["url"], "alice@example.com", "pw-alice")})
        b = wait_for(lambda: (s := state("codex-b"))["state"] == "waiting_for_code" and s)
        assert state("codex-a")["state"] == "ready" and b["url"].startswith(idp.url)


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.cli)])
def command(request: pytest.FixtureRequest) -> tuple[str, ...]:
    if request.param == "fake":
        return FAKE_CODEX
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install the Codex CLI")
    path = ensure_cli(*CODEX)
    assert path is not None
    return (path,)


def test_a_provider_that_needs_no_openai_login_is_ready(
        tmp_path: Path, upstream: ResponsesUpstream, command: tuple[str, ...]) -> None:
    """A custom ``model_provider`` with ``requires_openai_auth = false``: ``account/read``
    answers ``account: null, requiresOpenaiAuth: false``, and the account serves."""
    options = provider_options(upstream.url)
    options["config"]["model_providers.fake.requires_openai_auth"] = False
    worker = codex_worker("codex-a", codex_home(tmp_path / "codex-a", None), upstream.url,
                          cli_options=options, command=command)
    settings = Settings(server=ServerSettings(admin_token="admin-token",
                                              api_keys={"team": "sk-team"}),
                        workers=(worker,))
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=60, headers=ADMIN) as http:
        wait_for(lambda: status(http)["login"] is not None, timeout=30)
        assert status(http)["login"] == "ready"
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-team", max_retries=0) as client:
            answer = client.chat.completions.create(
                model=CODEX_MODEL, messages=[{"role": "user", "content": "Say hi"}])
        assert answer.choices[0].message.content
        assert [r.headers.get("authorization") for r in upstream.requests
                if r.body is not None] == [None]


def test_a_cancelled_codex_login_frees_the_port_for_the_next_at_once(
        tmp_path: Path, upstream: ResponsesUpstream, idp: FakeIdP) -> None:
    workers = [codex_worker(n, codex_home(tmp_path / n, None), upstream.url,
                            env={"CODEX_APP_SERVER_LOGIN_ISSUER": idp.url})
               for n in ("codex-a", "codex-b")]
    settings = Settings(server=ServerSettings(admin_token="admin-token",
                                              api_keys={"team": "sk-team"}),
                        workers=tuple(workers))
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=120, headers=ADMIN) as http:
        def state(name: str) -> dict:
            return http.get(f"/internal/workers/{name}/login").json()

        for name in ("codex-a", "codex-b"):
            wait_for(lambda: state(name)["login"] == "logged_out", timeout=30)
        a = http.post("/internal/workers/codex-a/login", json={"auto": False}).json()
        b = http.post("/internal/workers/codex-b/login", json={"auto": False}).json()
        assert a["state"] == "waiting_for_code" and a["pid"]
        assert b["state"] == "queued"
        cancelled = http.delete("/internal/workers/codex-a/login")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["state"] == "cancelled" and cancelled.json()["pid"] is None
        assert not alive(a["pid"])  # the app-server that held port 1455
        b = wait_for(lambda: (s := state("codex-b"))["state"] == "waiting_for_code" and s,
                     timeout=5)
        assert b["url"].startswith(idp.url)
        http.post("/internal/workers/codex-b/login/code",
                  json={"code": idp.sign_in(b["url"], "alice@example.com", "pw-alice")})
        wait_for(lambda: state("codex-b")["state"] == "ready", timeout=60)
        assert state("codex-a")["account_state"] == "logged_out"
