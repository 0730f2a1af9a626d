"""Accounts with the real vendor CLIs (npm, pinned), offline.

- A bundle exported from a poolgate whose real Claude Code is logged in
  (a planted ``.credentials.json``) is imported on a second poolgate with an
  empty home, and the real binary there serves a turn with the moved token.
- The real ``claude auth login`` on a pty: its own authorize URL, and the
  pasted code reaches the same process, which then stops offline at the token
  exchange (``platform.claude.com`` cannot be resolved here).
- The real ``codex app-server`` with ``CODEX_APP_SERVER_LOGIN_ISSUER`` at the
  fake IdP: the login URL comes from the real CLI, real Chromium signs in
  through the recipe, the redirect reaches Codex's own listener on 1455, Codex
  exchanges the code at the fake IdP and writes ``auth.json``; it stops at
  its "workspace routing discovery" (a ChatGPT backend call that the issuer
  override does not redirect), so the login reports failure offline.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import json
import os
import shutil
from pathlib import Path

import anthropic
import httpx
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from auth.autologin import CHROMIUM, Credentials, auto_login
from auth.recipes import load_recipe
from pool.cli.login import ClaudeLogin, CodexLogin, LoginFailed
from tests.fakes.idp import FakeIdP
from tests.fakes.upstreams import FakeUpstream
from tests.integration.clis import CLAUDE_CODE, CODEX, NPM_PREFIX, _base_env, ensure_cli
from tests.support.cli_accounts import claude_home, wait_for
from tests.support.procs import alive
from tests.support.server import ServerThread

pytestmark = [pytest.mark.cli, pytest.mark.slow]

TOKEN = "sk-ant-oat01-moved-by-bundle"
MODEL = "claude-sonnet-4-6"
ADMIN = {"authorization": "Bearer admin-token"}
RECIPE = Path(__file__).resolve().parents[2] / "examples" / "login-recipes" / "form-consent.toml"


def _cli(spec: tuple[str, str], native: Path) -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install the vendor CLI")
    assert ensure_cli(*spec) is not None
    assert native.exists()
    return str(native)


@pytest.fixture(scope="module")
def claude_bin() -> str:
    return _cli(CLAUDE_CODE, NPM_PREFIX / "node_modules" / "@anthropic-ai" /
                "claude-code-linux-x64" / "claude")


@pytest.fixture(scope="module")
def codex_bin() -> str:
    return _cli(CODEX, NPM_PREFIX / "node_modules" / "@openai" / "codex-linux-x64" / "vendor" /
                "x86_64-unknown-linux-musl" / "bin" / "codex")


def _gateway(worker: WorkerSettings) -> ServerThread:
    return ServerThread(create_app(Settings(
        server=ServerSettings(admin_token="admin-token", api_keys={"team": "sk-team"}),
        workers=(worker,))))


def _worker(name: str, home: Path, claude_bin: str, env: dict[str, str]) -> WorkerSettings:
    return WorkerSettings(name=name, kind="cli", cli="claude", models=(MODEL,), home=str(home),
                          command=(claude_bin,), env=env, ready_timeout=60, health_interval=1.0)


def _info(http: httpx.Client, name: str) -> dict:
    return next(w for w in http.get("/internal/workers").json()["workers"] if w["name"] == name)


def test_a_bundle_moves_a_real_claude_account_to_an_empty_home(
        tmp_path: Path, claude_bin: str) -> None:
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        env = _base_env(tmp_path / "os-home")
        env.update(ANTHROPIC_BASE_URL=upstream.anthropic_url, ANTHROPIC_SMALL_FAST_MODEL=MODEL,
                   ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL)
        src = _worker("claude-src", claude_home(tmp_path / "src", TOKEN), claude_bin, env)
        with _gateway(src) as srv, httpx.Client(base_url=srv.url, timeout=60,
                                                headers=ADMIN) as http:
            wait_for(lambda: _info(http, "claude-src")["login"] == "ready", timeout=60)
            http.post("/internal/workers/claude-src/stop")
            got = http.get("/internal/workers/claude-src/bundle")
            assert got.status_code == 200, got.text
        empty = tmp_path / "dst"
        with _gateway(_worker("claude-dst", empty, claude_bin, env)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60, headers=ADMIN) as http:
            wait_for(lambda: _info(http, "claude-dst")["login"] == "logged_out", timeout=60)
            http.post("/internal/workers/claude-dst/stop")
            put = http.put("/internal/workers/claude-dst/bundle", content=got.content)
            assert put.status_code == 200, put.text
            http.post("/internal/workers/claude-dst/restart")
            wait_for(lambda: _info(http, "claude-dst")["state"] == "ready"
                     and _info(http, "claude-dst")["login"] == "ready", timeout=60)
            with anthropic.Anthropic(base_url=srv.url, api_key="sk-team",
                                     max_retries=0) as client:
                answer = client.messages.create(model=MODEL, max_tokens=16, messages=[
                    {"role": "user", "content": "Say hi"}])
            assert answer.content[0].text
        sent = [r for r in upstream.requests if r.path == "/v1/messages"]
        assert sent and sent[-1].headers.get("authorization") == f"Bearer {TOKEN}"


async def test_the_real_claude_auth_login_takes_the_code_on_its_pty(
        tmp_path: Path, claude_bin: str) -> None:
    login = ClaudeLogin(home=str(tmp_path / "claude"), env=_base_env(tmp_path / "os-home"),
                        command=(claude_bin,))
    try:
        challenge = await login.begin(60)
        # 2.1.197 prints the whole authorize URL, 2.1.332 a short one (the rest is server-side)
        assert challenge.url.startswith(("https://claude.com/cai/oauth/authorize?",
                                         "https://claude.ai/oauth/authorize?"))
        if challenge.url.startswith("https://claude.com/"):
            assert "code_challenge=" in challenge.url and "state=" in challenge.url
        with pytest.raises(LoginFailed) as info:
            await login.submit("pasted-code#pasted-state", 60)
        # the code went into the same process, which tried to exchange it: offline, it stops here
        assert "platform.claude.com" in str(info.value)
        assert "pasted-code" not in str(info.value)
    finally:
        await login.close()
    assert not (tmp_path / "claude" / ".credentials.json").exists()


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"Chromium is not at {CHROMIUM}")
async def test_the_real_codex_login_url_and_chromium_through_the_fake_issuer(
        tmp_path: Path, codex_bin: str) -> None:
    with FakeIdP({"alice@example.com": "pw-alice"}) as idp:
        env = {**_base_env(tmp_path / "os-home"), "CODEX_APP_SERVER_LOGIN_ISSUER": idp.url}
        home = tmp_path / "codex"
        login = CodexLogin(home=str(home), env=env, command=(codex_bin,))
        try:
            challenge = await login.begin(60)
            assert challenge.url.startswith(f"{idp.url}/oauth/authorize?")
            assert "redirect_uri=http%3A%2F%2F127.0.0.1%3A1455%2Fauth%2Fcallback" in challenge.url
            assert challenge.wants_code is False  # the browser's redirect reaches Codex itself
            result = await auto_login(load_recipe(RECIPE), challenge.url,
                                      Credentials("alice@example.com", "pw-alice"), timeout=60)
            assert result.final_url.startswith("http://127.0.0.1:1455/")  # Codex answered it
            with pytest.raises(LoginFailed) as info:
                await login.wait(60)
        finally:
            await login.close()
    assert "workspace routing discovery failed" in str(info.value)
    assert idp.tokens_issued == ["alice@example.com"]  # Codex exchanged the code (PKCE checked)
    auth = json.loads((home / "auth.json").read_text())
    assert auth["auth_mode"] == "chatgpt" and auth["tokens"]["access_token"].startswith(
        "at-alice@example.com-")


async def test_the_operator_pastes_codex_s_redirect_url(tmp_path: Path, codex_bin: str) -> None:
    """The operator path for Codex: the browser ran elsewhere, its redirect to
    127.0.0.1:1455 failed there, and the operator pastes that URL; poolgate
    fetches it locally, so it reaches Codex's listener (then the same offline stop)."""
    with FakeIdP({"alice@example.com": "pw-alice"}) as idp:
        env = {**_base_env(tmp_path / "os-home"), "CODEX_APP_SERVER_LOGIN_ISSUER": idp.url}
        login = CodexLogin(home=str(tmp_path / "codex"), env=env, command=(codex_bin,))
        try:
            challenge = await login.begin(60)
            with pytest.raises(LoginFailed, match="whole redirect URL"):
                await login.submit("c-alice#state", 10)
            redirect = await asyncio.to_thread(idp.sign_in, challenge.url, "alice@example.com",
                                               "pw-alice")
            assert redirect.startswith("http://127.0.0.1:1455/auth/callback?")
            with pytest.raises(LoginFailed) as info:
                await login.submit(redirect, 60)
        finally:
            await login.close()
    assert "workspace routing discovery failed" in str(info.value)
    assert idp.tokens_issued == ["alice@example.com"]



async def test_an_abandoned_codex_login_frees_port_1455(tmp_path: Path, codex_bin: str) -> None:
    """A login that is cancelled (its deadline, or DELETE …/login) while Codex
    listens for the callback: the app-server is gone and the port is free."""
    with FakeIdP({"alice@example.com": "pw-alice"}) as idp:
        env = {**_base_env(tmp_path / "os-home"), "CODEX_APP_SERVER_LOGIN_ISSUER": idp.url}
        login = CodexLogin(home=str(tmp_path / "codex"), env=env, command=(codex_bin,))
        try:
            await login.begin(60)
            pid = login.pid
            assert pid is not None and alive(pid)
            waiting = asyncio.ensure_future(login.wait(600))
            await asyncio.sleep(0.5)
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
        finally:
            await login.close()
    assert not alive(pid)
    with socket.socket() as sock:
        # nobody listens there any more (SO_REUSEADDR, as Codex binds it: the
        # callback connections it made to itself may linger in TIME_WAIT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 1455))
        sock.listen()
