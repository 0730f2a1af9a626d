"""Logins of cli accounts through a real poolgate: the fake ``claude auth
login`` (real prompts, the code read from its pty) against a fake identity
provider; the operator path (the URL in the status, the code pasted at the
admin API) and auto-login (real Chromium through the recipe), each confirmed
by a turn the upstream sees with the new account's token."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import anthropic
import httpx
import pytest
from pydantic import SecretStr

from app.account_settings import LoginSettings
from app.factory import create_app
from app.settings import ServerSettings, Settings
from auth.autologin import CHROMIUM
from tests.fakes.egress_proxy import EgressProxy
from tests.fakes.idp import FakeIdP
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import fake_claude_worker, wait_for
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

ADMIN = {"authorization": "Bearer admin-token"}
MODEL = "claude-sonnet-4-6"
ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "examples" / "login-recipes" / "form-consent.toml")
USERS = {"alice@example.com": "pw-alice", "bob@example.com": "pw-bob"}
needs_chromium = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"Chromium is not installed at {CHROMIUM} (Debian package 'chromium'; make test "
           "installs it)")


@pytest.fixture
def upstream():
    with FakeUpstream(models=(MODEL,)) as fake:
        yield fake


@pytest.fixture
def idp():
    with FakeIdP(USERS) as server:
        yield server


def worker(tmp_path: Path, name: str, upstream: FakeUpstream, idp: FakeIdP, **extra):
    return fake_claude_worker(name, tmp_path / name, upstream.anthropic_url, tmp_path / f"{name}.log",
                              env={"FAKE_CLAUDE_OAUTH_URL": idp.url, **extra.pop("env", {})},
                              **extra)


def gateway(*workers) -> ServerThread:
    return ServerThread(create_app(Settings(
        server=ServerSettings(admin_token="admin-token", api_keys={"team": "sk-team"},
                              metrics_public=True),
        workers=tuple(workers))))


def login_state(http: httpx.Client, name: str) -> dict:
    return http.get(f"/internal/workers/{name}/login", headers=ADMIN).json()


def settle(http: httpx.Client, name: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while (status := login_state(http, name))["state"] not in ("ready", "failed"):
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    return status


def sign_in_as_a_person(idp: FakeIdP, url: str, user: str, password: str) -> str:
    """What the operator does in a browser: sign in, allow, copy code#state."""
    query = dict(parse_qsl(urlsplit(idp.sign_in(url, user, password)).query))
    return f"{query['code']}#{query['state']}"


def turn(srv: ServerThread) -> None:
    with anthropic.Anthropic(base_url=srv.url, api_key="sk-team", max_retries=0) as client:
        client.messages.create(model=MODEL, max_tokens=16,
                               messages=[{"role": "user", "content": "Say hi"}])


def test_the_operator_pastes_the_code_into_the_same_cli_process(
        tmp_path: Path, upstream: FakeUpstream, idp: FakeIdP, capsys) -> None:
    with gateway(worker(tmp_path, "claude-a", upstream, idp)) as srv, \
            httpx.Client(base_url=srv.url, timeout=120) as http:
        wait_for(lambda: login_state(http, "claude-a")["login"] == "logged_out")
        early = http.post("/internal/workers/claude-a/login/code", headers=ADMIN,
                          json={"code": "x#y"})
        assert early.status_code == 409 and "not waiting for a code" in early.text
        auto = http.post("/internal/workers/claude-a/login", headers=ADMIN, json={"auto": True})
        assert auto.status_code == 400 and auto.json()["error"]["param"] == "auto"

        started = http.post("/internal/workers/claude-a/login", headers=ADMIN,
                            json={"auto": False})
        assert started.status_code == 202, started.text
        status = started.json()
        assert status["state"] == "waiting_for_code" and status["auto"] is False
        assert status["url"].startswith(f"{idp.url}/oauth/authorize?")
        workers = http.get("/internal/workers", headers=ADMIN).json()["workers"]
        assert (workers[0]["state"], workers[0]["login"]) == ("logging_in", "logging_in")
        again = http.post("/internal/workers/claude-a/login", headers=ADMIN, json={"auto": False})
        assert again.status_code == 409

        code = sign_in_as_a_person(idp, status["url"], "alice@example.com", "pw-alice")
        bad = http.post("/internal/workers/claude-a/login/code", headers=ADMIN, json={})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "code"
        pasted = http.post("/internal/workers/claude-a/login/code", headers=ADMIN,
                           json={"code": code})
        assert pasted.status_code == 200
        done = settle(http, "claude-a")
        assert done["state"] == "ready", done
        assert done["login"] == "ready" and done["code_sha256"] and code not in str(done)
        turn(srv)
        assert upstream.last.headers["authorization"].startswith("Bearer at-alice@example.com-")
        metrics = http.get("/metrics").text
        assert 'poolgate_logins_succeeded_total{mode="operator",worker="claude-a"} 1.0' in metrics
        assert 'poolgate_accounts{state="ready"} 1.0' in metrics
    assert code not in capsys.readouterr().out  # not in any log line


def test_a_wrong_code_fails_and_says_so_without_the_code(
        tmp_path: Path, upstream: FakeUpstream, idp: FakeIdP) -> None:
    with gateway(worker(tmp_path, "claude-a", upstream, idp)) as srv, \
            httpx.Client(base_url=srv.url, timeout=120) as http:
        wait_for(lambda: login_state(http, "claude-a")["login"] == "logged_out")
        http.post("/internal/workers/claude-a/login", headers=ADMIN, json={"auto": False})
        http.post("/internal/workers/claude-a/login/code", headers=ADMIN,
                  json={"code": "c-forged-code#wrong-state"})
        done = settle(http, "claude-a")
        assert done["state"] == "failed" and done["reason"] == "code_refused"
        assert "refused the code" in done["last_error"] and "c-forged-code" not in str(done)
        assert done["login"] == "logged_out"
        assert not (tmp_path / "claude-a" / ".credentials.json").exists()


@needs_chromium
def test_auto_login_of_two_accounts_at_once_does_not_cross_them(
        tmp_path: Path, upstream: FakeUpstream, idp: FakeIdP) -> None:
    workers = [worker(tmp_path, f"claude-{user[0]}", upstream, idp, login=LoginSettings(
        recipe=RECIPE, username=SecretStr(user), password=SecretStr(pw), timeout=60,
        relogin=False))
        for user, pw in USERS.items()]
    with gateway(*workers) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
        for w in workers:
            wait_for(lambda: login_state(http, w.name)["login"] == "logged_out")
        for w in workers:  # the seed's alias, then the status of both
            started = http.post(f"/internal/auto-login/start?instance={w.name}", headers=ADMIN)
            assert started.status_code == 202, started.text
        for w in workers:
            assert settle(http, w.name)["state"] == "ready"
        everyone = http.get("/internal/auto-login/status", headers=ADMIN).json()["instances"]
        assert {n: s["state"] for n, s in everyone.items()} == {"claude-a": "ready",
                                                                "claude-b": "ready"}
        for user, pw in USERS.items():
            creds = (tmp_path / f"claude-{user[0]}" / ".credentials.json").read_text()
            assert f"at-{user}-" in creds and pw not in creds
        assert "pw-alice" not in str(everyone) and "pw-bob" not in str(everyone)
        turn(srv)


@needs_chromium
def test_a_wrong_password_stops_at_once_with_a_screenshot(
        tmp_path: Path, upstream: FakeUpstream, idp: FakeIdP, capsys) -> None:
    w = worker(tmp_path, "claude-a", upstream, idp, login=LoginSettings(
        recipe=RECIPE, username=SecretStr("alice@example.com"),
        password=SecretStr("not-the-password"), attempts=3, backoff=1, timeout=60,
        relogin=False))
    with gateway(w) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
        wait_for(lambda: login_state(http, "claude-a")["login"] == "logged_out")
        assert http.post("/internal/workers/claude-a/login", headers=ADMIN).status_code == 202
        done = settle(http, "claude-a")
        assert done["state"] == "failed" and done["reason"] == "wrong_password"
        assert done["attempt"] == 1 and "not retried" in done["last_error"]
        assert "Invalid username or password" in done["page_text"]
        assert "not-the-password" not in str(done)
        assert done["screenshot"] is True
        shot = http.get(done["screenshot_url"], headers=ADMIN)
        assert shot.headers["content-type"] == "image/png" and shot.content[:4] == b"\x89PNG"
        metrics = http.get("/metrics").text
        assert 'poolgate_logins_failed_total{reason="wrong_password",worker="claude-a"} 1.0' \
            in metrics
        assert 'poolgate_accounts{state="failed"} 1.0' in metrics
        assert "not-the-password" not in metrics
    assert "not-the-password" not in capsys.readouterr().out  # nor in any log line


@needs_chromium
def test_a_logged_out_account_with_credentials_logs_itself_in(
        tmp_path: Path, upstream: FakeUpstream, idp: FakeIdP) -> None:
    w = worker(tmp_path, "claude-a", upstream, idp, login=LoginSettings(
        recipe=RECIPE, username=SecretStr("alice@example.com"), password=SecretStr("pw-alice"),
        timeout=60))
    with gateway(w) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
        # no admin call: the watcher finds the account logged out
        wait_for(lambda: login_state(http, "claude-a")["state"] != "idle", timeout=30)
        done = settle(http, "claude-a")
        assert done["state"] == "ready" and done["auto"] is True and done["login"] == "ready"
        turn(srv)
        assert upstream.last.headers["authorization"].startswith("Bearer at-alice@example.com-")


@needs_chromium
def test_a_hanging_page_times_out_is_retried_after_a_delay_and_kept_for_operators(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    with FakeIdP({"slow": "pw-slow"}, hang_seconds=30) as idp:
        w = worker(tmp_path, "claude-a", upstream, idp, login=LoginSettings(
            recipe=RECIPE, username=SecretStr("slow"), password=SecretStr("pw-slow"),
            timeout=4, attempts=2, backoff=2, relogin=False))
        with gateway(w) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
            wait_for(lambda: login_state(http, "claude-a")["login"] == "logged_out")
            http.post("/internal/workers/claude-a/login", headers=ADMIN, json={"auto": True})
            retrying = wait_for(lambda: (s := login_state(http, "claude-a"))["state"] == "retrying"
                                and s, timeout=60)
            assert retrying["reason"] == "timeout" and retrying["attempt"] == 1
            assert retrying["next_attempt_at"] > time.time() - 1  # a delay, not a tight loop
            done = settle(http, "claude-a")
            assert done["state"] == "failed" and done["attempt"] == 2
            assert done["reason"] == "timeout" and "in time" in done["last_error"]
            shot = http.get(done["screenshot_url"], headers=ADMIN)
            assert shot.status_code == 200 and shot.content[:4] == b"\x89PNG"
            assert done["finished_at"] - done["started_at"] >= 4 + 2 + 4  # two attempts + delay
            metrics = http.get("/metrics").text
            assert 'poolgate_logins_failed_total{reason="timeout",worker="claude-a"} 2.0' in metrics


PROXY_PASSWORD = "egress-pw-24681357"


@needs_chromium
def test_an_accounts_login_goes_through_its_egress_proxy_browser_and_cli_alike(
        tmp_path: Path, upstream: FakeUpstream, idp: FakeIdP, capsys) -> None:
    """The browser of the automatic login and the CLI's own login (its token
    exchange) both leave through the account's proxy; then its turns do."""
    # the IdP by a name only the proxy's DNS knows: nothing can reach it around the proxy
    remote = f"http://idp.egress.test:{idp.server.server_address[1]}"
    with EgressProxy(credentials=f"egress:{PROXY_PASSWORD}",
                     hosts={"idp.egress.test": "127.0.0.1"}) as proxy:
        w = worker(tmp_path, "claude-a", upstream, idp, proxy=proxy.url, login=LoginSettings(
            recipe=RECIPE, username=SecretStr("alice@example.com"),
            password=SecretStr("pw-alice"), timeout=60, relogin=False),
            env={"FAKE_CLAUDE_OAUTH_URL": remote})
        with gateway(w) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
            wait_for(lambda: login_state(http, "claude-a")["login"] == "logged_out")
            assert http.post("/internal/workers/claude-a/login", headers=ADMIN,
                             json={"auto": True}).status_code == 202
            done = settle(http, "claude-a")
            assert done["state"] == "ready", done
            paths = [p for _m, p, _via in idp.requests]
            assert "/oauth/authorize" in paths and "/consent" in paths  # the browser's
            assert "/oauth/token" in paths  # the CLI's own exchange
            direct = [(m, p) for m, p, via in idp.requests if not via]
            assert direct == []
            turn(srv)
            assert upstream.last.headers["authorization"].startswith("Bearer at-alice@example.com-")
            assert any("/v1/messages" in t for _m, t in proxy.passed)
            assert PROXY_PASSWORD not in str(login_state(http, "claude-a"))
    assert PROXY_PASSWORD not in capsys.readouterr().out


def test_the_operators_login_runs_the_cli_with_the_accounts_proxy(
        tmp_path: Path, upstream: FakeUpstream, idp: FakeIdP) -> None:
    with EgressProxy(credentials=f"egress:{PROXY_PASSWORD}") as proxy:
        w = worker(tmp_path, "claude-a", upstream, idp, proxy=proxy.url)
        with gateway(w) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
            wait_for(lambda: login_state(http, "claude-a")["login"] == "logged_out")
            status = http.post("/internal/workers/claude-a/login", headers=ADMIN,
                               json={"auto": False}).json()
            # the operator's own browser is theirs: not the account's proxy
            code = sign_in_as_a_person(idp, status["url"], "alice@example.com", "pw-alice")
            http.post("/internal/workers/claude-a/login/code", headers=ADMIN, json={"code": code})
            assert settle(http, "claude-a")["state"] == "ready"
            exchanges = [via for _m, p, via in idp.requests if p == "/oauth/token"]
            assert exchanges and all(exchanges), idp.requests  # the CLI's, through the proxy
