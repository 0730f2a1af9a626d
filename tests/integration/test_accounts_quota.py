"""``GET /internal/accounts``, the quota block of ``/internal/workers`` and the
``poolgate_account_quota_*`` gauges through a real poolgate with a real cli
worker (the fake Claude Code) and a real process worker."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import claude_home, fake_claude_worker, wait_for
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ADMIN = {"authorization": "Bearer admin-token"}
MODEL = "claude-sonnet-4-6"


def _process_worker() -> WorkerSettings:
    return WorkerSettings(name="p0", kind="process", models=("echo",), cwd=str(REPO),
                          command=(sys.executable, "-m", "tests.fakes.echo_worker"),
                          health_interval=0.5, health_timeout=1.0, stop_timeout=3.0)


def test_accounts_lists_each_cli_account_and_says_when_nothing_is_known(tmp_path: Path) -> None:
    with FakeUpstream(models=(MODEL,)) as upstream:
        cli = fake_claude_worker("claude-a", claude_home(tmp_path / "a", "sk-ant-oat01-fake"),
                                 upstream.anthropic_url, tmp_path / "a.log")
        settings = Settings(server=ServerSettings(admin_token="admin-token", metrics_public=True),
                            workers=(cli, _process_worker()))
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30) as http:
            assert http.get("/internal/accounts").status_code == 401
            assert http.get("/internal/accounts",
                            headers={"authorization": "Bearer wrong"}).status_code == 401

            def ready() -> dict | None:
                answer = http.get("/internal/accounts", headers=ADMIN)
                assert answer.status_code == 200, answer.text
                accounts = answer.json()["accounts"]
                return accounts[0] if accounts and accounts[0]["state"] == "ready" else None
            account = wait_for(ready, timeout=30)
            assert [a["name"] for a in http.get("/internal/accounts", headers=ADMIN)
                    .json()["accounts"]] == ["claude-a"]  # the process worker is no account
            assert account["cli"] == "claude" and account["models"] == [MODEL]
            # the fake CLI reported no quota yet: nothing known, and it says so
            assert account["source"] is None and account["windows"] == []
            assert account["headroom_percent"] is None and account["forecast_empty_at"] is None

            workers = {w["name"]: w for w in
                       http.get("/internal/workers", headers=ADMIN).json()["workers"]}
            assert workers["claude-a"]["quota"] == {
                k: account[k] for k in ("source", "headroom_percent", "tightest_window",
                                        "forecast_empty_at", "forecast_empty_at_iso",
                                        "forecast_seconds", "windows")}
            assert "quota" not in workers["p0"]
            samples = [line for line in http.get("/metrics").text.splitlines()
                       if line.startswith("poolgate_account_quota_")]
            assert samples == []  # nothing known: no made-up 0 % or 100 %
