"""The real Claude Code and Gemini CLI binaries as cli workers with ``proxy``:
their requests to a fake upstream pass through a real local proxy that logs
them, even though the worker's env lists the upstream in NO_PROXY; with the
proxy down, a turn fails and nothing reaches the upstream around it."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.egress_proxy import EgressProxy
from tests.fakes.gemini_cli_upstream import GeminiCliUpstream
from tests.fakes.upstreams import FakeUpstream
from tests.integration.clis import (CLAUDE_CODE, GEMINI_CLI, GEMINI_PREFIX, NPM_PREFIX, _base_env,
                                    ensure_cli)
from tests.support.cli_accounts import claude_home
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

pytestmark = [pytest.mark.cli, pytest.mark.slow]

TOKEN = "sk-ant-oat01-planted-for-tests"
MODEL = "claude-sonnet-4-6"
GATEWAY_KEY = "sk-poolgate-team"
PROXY_PASSWORD = "proxy-password-9876543210"


@pytest.fixture(scope="module")
def claude_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Claude Code")
    assert ensure_cli(*CLAUDE_CODE) is not None
    native = NPM_PREFIX / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    assert native.exists()
    return str(native)


def test_the_real_claude_reaches_its_upstream_only_through_the_proxy(tmp_path: Path,
                                                                      claude_bin: str) -> None:
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream, \
            EgressProxy(credentials=f"egress:{PROXY_PASSWORD}") as proxy:
        env = _base_env(tmp_path / "os-home")  # NO_PROXY=127.0.0.1,…: overridden by proxy
        env.update(ANTHROPIC_BASE_URL=upstream.anthropic_url, ANTHROPIC_SMALL_FAST_MODEL=MODEL,
                   ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                   CLAUDE_CODE_MAX_RETRIES="1")  # the turn with the proxy down fails soon
        worker = WorkerSettings(
            name="claude-real", kind="cli", cli="claude", models=(MODEL,),
            home=str(claude_home(tmp_path / "account", TOKEN)), command=(claude_bin,), env=env,
            proxy=proxy.url, ready_timeout=60, health_interval=1.0)
        settings = Settings(server=ServerSettings(admin_token="admin-token",
                                                  api_keys={"team": GATEWAY_KEY}),
                            workers=(worker,))
        with ServerThread(create_app(settings)) as srv:
            client = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key=GATEWAY_KEY,
                                                 max_retries=0, timeout=120))
            answer = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello through the proxy"}])
            assert answer.choices[0].message.content == "echo: hello through the proxy"
            assert [r for r in upstream.requests if r.path == "/v1/messages"]
            # every request the upstream saw came through the proxy (it adds Via)
            assert all(r.headers.get("via") == "1.1 egress-proxy" for r in upstream.requests)
            assert any(target.startswith(f"{upstream.anthropic_url}/v1/messages")
                       for _method, target in proxy.passed)
            assert proxy.refused == []
            proxy.stop()
            seen = len(upstream.requests)
            with pytest.raises(openai.APIError) as failed:
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "around it?"}])
            assert PROXY_PASSWORD not in str(failed.value)
            assert len(upstream.requests) == seen


# --- Gemini CLI 0.61.0 ---------------------------------------------------------------------

GEMINI_MODEL = "gemini-2.5-pro"
GEMINI_KEY = "gemini-real-account-key"


@pytest.fixture(scope="module")
def gemini_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Gemini CLI")
    path = ensure_cli(*GEMINI_CLI, prefix=GEMINI_PREFIX)
    assert path is not None
    return path


def _gemini_through(tmp_path: Path, gemini_bin: str, upstream: GeminiCliUpstream,
                    proxy: EgressProxy, env: dict[str, str]) -> None:
    """A turn of the real Gemini CLI behind poolgate with ``proxy``: it reaches
    the upstream only through the proxy; with the proxy down, not at all."""
    worker = WorkerSettings(
        name="gemini-real", kind="cli", cli="gemini", models=(GEMINI_MODEL,),
        home=str(tmp_path / "account"), command=(gemini_bin,), ready_timeout=60,
        health_interval=1.0, proxy=proxy.url,
        # the operator's NO_PROXY names the upstream: the proxy still takes it
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NO_PROXY": "127.0.0.1,localhost",
             **env})
    settings = Settings(server=ServerSettings(admin_token="admin-token",
                                              api_keys={"team": GATEWAY_KEY}),
                        workers=(worker,))
    with ServerThread(create_app(settings)) as srv:
        client = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key=GATEWAY_KEY,
                                             max_retries=0, timeout=120))
        answer = client.chat.completions.create(
            model=GEMINI_MODEL, messages=[{"role": "user", "content": "hello through the proxy"}])
        assert answer.choices[0].message.content == "echo: hello through the proxy"
        upstream_host = upstream.url.removeprefix("http://")
        assert upstream.generations() and upstream_host in proxy.targets()
        assert proxy.refused == []
        proxy.stop()
        time.sleep(1.0)  # a background call (quota, experiments) tunnelled before the stop lands
        seen = len(upstream.requests)
        with pytest.raises(openai.APIError) as failed:
            client.chat.completions.create(
                model=GEMINI_MODEL, messages=[{"role": "user", "content": "around it?"}])
        assert PROXY_PASSWORD not in str(failed.value)
        assert len(upstream.requests) == seen
        # the account is not taken for logged out (no alert, no automatic login through
        # the proxy): the worker is unhealthy because its proxy is down
        info = httpx.get(srv.url + "/internal/workers", timeout=10,
                         headers={"authorization": "Bearer admin-token"}).json()["workers"][0]
        assert info["login"] != "logged_out" and info["account_state"] != "logged_out", info
        assert info["state"] == "unhealthy", info


def test_the_real_gemini_on_an_api_key_goes_only_through_the_proxy(tmp_path: Path,
                                                                   gemini_bin: str) -> None:
    with GeminiCliUpstream(api_key=GEMINI_KEY) as upstream, \
            EgressProxy(credentials=f"egress:{PROXY_PASSWORD}") as proxy:
        _gemini_through(tmp_path, gemini_bin, upstream, proxy,
                        {"GOOGLE_GEMINI_BASE_URL": upstream.url, "GEMINI_API_KEY": GEMINI_KEY})
        # a CONNECT tunnel: the Gemini API is https:// in real life, and undici tunnels both
        assert all(method == "CONNECT" for method, _ in proxy.passed)


def test_the_real_gemini_on_a_google_login_goes_only_through_the_proxy(tmp_path: Path,
                                                                       gemini_bin: str) -> None:
    """Code Assist (a Google login): the turns, and Google's own user-info call,
    go through the proxy (the access token from the environment, so the CLI
    does not need Google's token endpoint, which a test cannot reach)."""
    home = tmp_path / "account" / ".gemini"
    home.mkdir(parents=True)
    (home / "oauth_creds.json").write_text(json.dumps({
        "access_token": "ya29.fake", "refresh_token": "1//planted", "token_type": "Bearer",
        "expiry_date": int((time.time() + 3600) * 1000)}))
    with GeminiCliUpstream(oauth_token="ya29.fake") as upstream, \
            EgressProxy(credentials=f"egress:{PROXY_PASSWORD}") as proxy:
        _gemini_through(tmp_path, gemini_bin, upstream, proxy,
                        {"CODE_ASSIST_ENDPOINT": upstream.url, "GOOGLE_GENAI_USE_GCA": "true",
                         "GOOGLE_CLOUD_ACCESS_TOKEN": "ya29.fake"})
        assert any(p.endswith(":loadCodeAssist") for p in (r.path for r in upstream.requests))
        assert "www.googleapis.com:443" in proxy.targets()  # the user-info call, not direct
