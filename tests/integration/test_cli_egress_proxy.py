"""``proxy`` on a cli worker: the CLI child reaches its upstream only through
the egress proxy (the fake Claude Code picks its proxy from the environment
as the real binary does), the worker's own ``env`` cannot route around it,
and a proxy that is down means failed turns, never direct ones. The real
binary through the proxy: tests/integration/test_cli_egress_proxy_real.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from app.factory import cli_spec, create_app
from app.settings import ServerSettings, Settings
from tests.fakes.egress_proxy import EgressProxy
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import claude_home, fake_claude_worker
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

TOKEN = "sk-ant-oat01-team-account"
MODEL = "claude-sonnet-4-6"
PROXY_PASSWORD = "proxy-password-9876543210"
ADMIN = {"authorization": "Bearer admin-token"}


def _wait_state(http: httpx.Client, state: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        seen = http.get("/internal/workers").json()["workers"][0]["state"]
        if seen == state or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


def _ask(srv, text: str) -> str:
    client = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-team-a",
                                         max_retries=0))
    answer = client.chat.completions.create(model=MODEL,
                                            messages=[{"role": "user", "content": text}])
    return answer.choices[0].message.content


def test_a_cli_worker_reaches_its_upstream_only_through_the_proxy(tmp_path: Path) -> None:
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream, \
            EgressProxy(credentials=f"egress:{PROXY_PASSWORD}") as proxy:
        # the operator's env says to go direct to the upstream: the proxy still wins
        worker = fake_claude_worker(
            "claude-a", claude_home(tmp_path / "a", TOKEN), upstream.anthropic_url,
            tmp_path / "claude.log", proxy=proxy.url,
            env={"NO_PROXY": "127.0.0.1,localhost", "HTTPS_PROXY": "http://127.0.0.1:9"})
        settings = Settings(server=ServerSettings(admin_token="admin-token",
                                                  api_keys={"team-a": "sk-team-a"}),
                            workers=(worker,))
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30, headers=ADMIN) as http:
            assert _ask(srv, "through the proxy") == "echo: through the proxy"
            root = upstream.anthropic_url
            assert ("POST", f"{root}/v1/messages") in proxy.passed
            assert upstream.requests
            assert all(r.headers.get("via") == "1.1 egress-proxy" for r in upstream.requests)
            proxy.stop()
            seen = len(upstream.requests)
            with pytest.raises(openai.APIError) as failed:
                _ask(srv, "around the proxy?")
            assert PROXY_PASSWORD not in str(failed.value)
            assert len(upstream.requests) == seen  # nothing went direct
            # the gateway sees the proxy down and takes the account out, then back in
            assert _wait_state(http, "unhealthy") == "unhealthy"
            info = http.get("/internal/workers").json()["workers"][0]
            assert PROXY_PASSWORD not in json.dumps(info)
            with pytest.raises(openai.APIStatusError) as refused:
                _ask(srv, "still down?")
            assert "egress proxy of worker claude-a" in refused.value.message
            proxy.start()
            assert _wait_state(http, "ready") == "ready"
            assert _ask(srv, "back") == "echo: back"
            assert len(upstream.requests) == seen + 1


def test_the_cli_child_gets_the_proxy_in_every_variable_and_no_bypass(tmp_path: Path) -> None:
    worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                "http://127.0.0.1:1", tmp_path / "claude.log",
                                proxy="http://u:pw@proxy.internal:3128",
                                env={"no_proxy": "*", "ALL_PROXY": "http://elsewhere:1"})
    env = cli_spec(worker, {"PATH": "/usr/bin", "HTTPS_PROXY": "http://gateway-own:1",
                            "NO_PROXY": "*"}).env
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        assert env[name] == env[name.lower()] == "http://u:pw@proxy.internal:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == ""
    assert "u:pw" not in repr(cli_spec(worker, {}))
