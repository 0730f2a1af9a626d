"""The life of a cli account through a real poolgate (pool/cli/account.py):
a login ends at its deadline with its CLI process and lock; a worker an
operator stopped stays stopped (no automatic login, no restart); actions the
account's state does not allow are a 409 naming the state; an account
refused once recovers by itself when its credentials work again."""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import anthropic
import httpx
import openai
import pytest
from pydantic import SecretStr

from app.account_settings import LoginSettings
from app.factory import create_app
from app.settings import ServerSettings, Settings
from tests.fakes.idp import FakeIdP
from tests.fakes.responses_upstream import ResponsesUpstream
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import claude_home, fake_claude_worker, wait_for
from tests.support.codex_accounts import CODEX_MODEL, codex_home, codex_worker
from tests.support.cli_fakes import fake_cli_worker, openai_client, serve
from tests.support.procs import alive
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

ADMIN = {"authorization": "Bearer admin-token"}
MODEL = "claude-sonnet-4-6"


@pytest.fixture
def upstream():
    with FakeUpstream(models=(MODEL,)) as fake:
        yield fake


@pytest.fixture
def idp():
    with FakeIdP({"alice@example.com": "pw-alice"}) as server:
        yield server


def gateway(*workers) -> ServerThread:
    return ServerThread(create_app(Settings(
        server=ServerSettings(admin_token="admin-token", api_keys={"team": "sk-team"},
                              metrics_public=True),
        workers=tuple(workers))))


def login(http: httpx.Client, name: str = "claude-a") -> dict:
    return http.get(f"/internal/workers/{name}/login", headers=ADMIN).json()


def worker(http: httpx.Client, name: str = "claude-a") -> dict:
    return {w["name"]: w for w in http.get("/internal/workers", headers=ADMIN).json()["workers"]}[
        name]


def started_logins(http: httpx.Client) -> float:
    found = re.findall(r'poolgate_logins_started_total\{[^}]*worker="claude-a"[^}]*\} (\S+)',
                       http.get("/metrics").text)
    return sum(float(n) for n in found)


def test_a_login_whose_code_never_comes_ends_at_its_deadline(
        tmp_path: Path, upstream: FakeUpstream, idp: FakeIdP) -> None:
    w = fake_claude_worker("claude-a", tmp_path / "a", upstream.anthropic_url, tmp_path / "a.log",
                           env={"FAKE_CLAUDE_OAUTH_URL": idp.url}, login_timeout=3)
    with gateway(w) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        wait_for(lambda: login(http)["login"] == "logged_out")
        started = http.post("/internal/workers/claude-a/login", headers=ADMIN,
                            json={"auto": False}).json()
        assert started["state"] == "waiting_for_code" and started["pid"]
        pid = started["pid"]
        assert alive(pid)
        done = wait_for(lambda: (s := login(http))["state"] not in ("waiting_for_code",) and s,
                        timeout=20)
        assert done["state"] == "failed" and done["reason"] == "timeout", done
        assert "login_timeout" in done["last_error"] and done["pid"] is None
        assert not alive(pid)  # the claude auth login process (its whole group) is gone
        assert done["account_state"] == "logged_out"
        assert (worker(http)["state"], worker(http)["login"]) == ("unhealthy", "logged_out")
        # its lock is free: the next login starts at once
        again = http.post("/internal/workers/claude-a/login", headers=ADMIN, json={"auto": False})
        assert again.status_code == 202 and again.json()["state"] == "waiting_for_code"
        cancelled = http.delete("/internal/workers/claude-a/login", headers=ADMIN)
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        assert not alive(again.json()["pid"])
        nothing = http.delete("/internal/workers/claude-a/login", headers=ADMIN)
        assert nothing.status_code == 409 and "logged_out" in nothing.json()["error"]["message"]


def test_a_stopped_worker_is_not_logged_in_nor_restarted_by_itself(
        tmp_path: Path, upstream: FakeUpstream, idp: FakeIdP) -> None:
    # automatic re-login every second: the recipe is missing, so every attempt fails fast
    auto = LoginSettings(recipe=str(tmp_path / "missing-recipe.toml"),
                         username=SecretStr("alice@example.com"), password=SecretStr("pw-alice"),
                         attempts=1, backoff=0.5, timeout=10)
    w = fake_claude_worker("claude-a", tmp_path / "a", upstream.anthropic_url, tmp_path / "a.log",
                           env={"FAKE_CLAUDE_OAUTH_URL": idp.url}, login=auto)
    with gateway(w) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        wait_for(lambda: started_logins(http) >= 1 and login(http)["state"] == "failed",
                 timeout=30)
        stopped = http.post("/internal/workers/claude-a/stop", headers=ADMIN)
        assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
        count = started_logins(http)
        time.sleep(6)  # three watch rounds, each of which would find the account due
        assert started_logins(http) == count
        info = worker(http)
        assert (info["state"], info["pid"], info["account_state"]) == ("stopped", None, "stopped")
        refused = http.post("/internal/workers/claude-a/login", headers=ADMIN,
                            json={"auto": False})
        assert refused.status_code == 409
        assert "is stopped" in refused.json()["error"]["message"]
        assert refused.json()["error"]["code"] == "account_state"
        assert http.post("/internal/workers/claude-a/restart", headers=ADMIN).status_code == 200
        wait_for(lambda: worker(http)["pid"] is not None)


def test_an_api_key_refused_once_recovers_when_it_works_again(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    upstream.api_key = "sk-ant-api03-the-one-upstream-wants"
    w = fake_claude_worker("claude-a", claude_home(tmp_path / "a", None), upstream.anthropic_url,
                           tmp_path / "a.log", login_probe_interval=1,
                           env={"ANTHROPIC_API_KEY": "sk-ant-api03-suspended"})
    with gateway(w) as srv, httpx.Client(base_url=srv.url, timeout=60) as http, \
            anthropic.Anthropic(base_url=srv.url, api_key="sk-team", max_retries=0) as client:
        wait_for(lambda: login(http)["login"] == "ready")
        with pytest.raises(anthropic.APIStatusError):
            client.messages.create(model=MODEL, max_tokens=8,
                                   messages=[{"role": "user", "content": "hi"}])
        wait_for(lambda: login(http)["login"] == "logged_out")
        time.sleep(3)  # probed (and refused) again meanwhile
        assert login(http)["login"] == "logged_out"
        upstream.api_key = None  # the key works again (its account was paid, say)
        wait_for(lambda: login(http)["login"] == "ready", timeout=30)
        answer = client.messages.create(model=MODEL, max_tokens=8,
                                        messages=[{"role": "user", "content": "hi"}])
        assert answer.content[0].text == "echo: hi"


@pytest.mark.parametrize("cli", ["qwen", "jsonrpc"])
def test_a_refused_qwen_or_jsonrpc_account_recovers_when_its_key_works_again(
        tmp_path: Path, cli: str) -> None:
    key = "sk-the-one-upstream-wants"
    with FakeUpstream(api_key=key, models=("qwen-coder",)) as upstream:
        w = fake_cli_worker(cli, "agent-a", tmp_path / "a", upstream.url, tmp_path / "a.log",
                            api_key="sk-revoked", login_probe_interval=1)
        with serve(w) as srv, httpx.Client(base_url=srv.url, timeout=60) as http, \
                openai_client(srv) as client:
            def state() -> str | None:
                return login(http, "agent-a")["login"]

            wait_for(lambda: state() == "ready")
            with pytest.raises(openai.APIStatusError):
                client.chat.completions.create(model="qwen-coder",
                                               messages=[{"role": "user", "content": "hi"}])
            wait_for(lambda: state() == "logged_out")
            time.sleep(2.5)  # probed (and refused) again meanwhile
            assert state() == "logged_out"
            upstream.api_key = None  # the key works again
            wait_for(lambda: state() == "ready", timeout=30)
            answer = client.chat.completions.create(model="qwen-coder",
                                                    messages=[{"role": "user", "content": "hi"}])
            assert answer.choices[0].message.content.endswith("hi")


def test_a_refused_codex_api_key_recovers_when_it_works_again(tmp_path: Path) -> None:
    with ResponsesUpstream(models=(CODEX_MODEL,)) as upstream:
        home = codex_home(tmp_path / "codex-a", "sk-codex-account")
        w = codex_worker("codex-a", home, upstream.url, login_probe_interval=1)
        with serve(w) as srv, httpx.Client(base_url=srv.url, timeout=60) as http, \
                openai_client(srv) as client:
            wait_for(lambda: login(http, "codex-a")["login"] == "ready", timeout=30)
            (home / "fault").write_text("401")  # the upstream refuses the key (same auth.json)
            with pytest.raises(openai.APIStatusError):
                client.chat.completions.create(model=CODEX_MODEL,
                                               messages=[{"role": "user", "content": "hi"}])
            wait_for(lambda: login(http, "codex-a")["login"] == "logged_out")
            time.sleep(2.5)  # probed (and refused) again meanwhile
            assert login(http, "codex-a")["login"] == "logged_out"
            (home / "fault").unlink()  # the key works again
            wait_for(lambda: login(http, "codex-a")["login"] == "ready", timeout=30)
            answer = client.chat.completions.create(
                model=CODEX_MODEL, messages=[{"role": "user", "content": "hi"}])
            assert answer.choices[0].message.content == "echo: hi"


def test_a_stop_during_a_login_ends_it_and_its_code_restarts_nothing(
        tmp_path: Path, upstream: FakeUpstream, idp: FakeIdP) -> None:
    w = fake_claude_worker("claude-a", tmp_path / "a", upstream.anthropic_url, tmp_path / "a.log",
                           env={"FAKE_CLAUDE_OAUTH_URL": idp.url})
    with gateway(w) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        wait_for(lambda: login(http)["login"] == "logged_out")
        started = http.post("/internal/workers/claude-a/login", headers=ADMIN,
                            json={"auto": False}).json()
        assert started["state"] == "waiting_for_code"
        stopped = http.post("/internal/workers/claude-a/stop", headers=ADMIN)
        assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
        assert login(http)["state"] == "cancelled"
        assert not alive(started["pid"])
        query = dict(parse_qsl(urlsplit(idp.sign_in(started["url"], "alice@example.com",
                                                    "pw-alice")).query))
        late = http.post("/internal/workers/claude-a/login/code", headers=ADMIN,
                         json={"code": f"{query['code']}#{query['state']}"})
        assert late.status_code == 409 and "is stopped" in late.json()["error"]["message"]
        time.sleep(1.5)
        info = worker(http)
        assert (info["state"], info["pid"]) == ("stopped", None)
        assert not (tmp_path / "a" / ".credentials.json").exists()
