"""``GET /internal/accounts``, the quota block of ``/internal/workers`` and the
``poolgate_account_quota_*`` gauges through a real poolgate with a real cli
worker (the fake Claude Code) and a real process worker."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.upstreams import FakeUpstream
from tests.fakes.vendor_quota import FakeQuota
from tests.support.cli_accounts import claude_home, fake_claude_worker, wait_for
from tests.support.cli_fakes import fake_cli_worker
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


def test_accounts_and_metrics_show_the_quota_the_cli_reported(tmp_path: Path) -> None:
    """The fake Claude Code reads the vendor's quota headers from its upstream
    as the real one does; after one turn the gateway shows them."""
    token = "sk-ant-oat01-quota-view"
    with FakeUpstream(api_key=token, models=(MODEL,)) as upstream:
        quota = upstream.quota[token] = FakeQuota(five_hour=97, seven_day=40)
        cli = fake_claude_worker("claude-a", claude_home(tmp_path / "a", token),
                                 upstream.anthropic_url, tmp_path / "a.log")
        settings = Settings(server=ServerSettings(admin_token="admin-token", metrics_public=True,
                                                  api_keys={"team": "sk-team"}),
                            workers=(cli,))
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30) as http:
            with anthropic.Anthropic(base_url=srv.url, api_key="sk-team", max_retries=0) as c:
                c.messages.create(model=MODEL, max_tokens=32,
                                  messages=[{"role": "user", "content": "hello"}])

            def reported() -> dict | None:
                [account] = http.get("/internal/accounts", headers=ADMIN).json()["accounts"]
                return account if account["windows"] else None
            account = wait_for(reported, timeout=10)
            assert account["source"] == "vendor" and account["state"] == "ready"
            five = next(w for w in account["windows"] if w["window"] == "five_hour")
            assert five["used_percent"] == 97 and five["left_percent"] == 3
            assert five["resets_at"] == quota.five_hour_reset
            assert five["resets_at_iso"].endswith("Z") and five["source"] == "vendor"
            assert time.time() - 30 < five["seen_at"] <= time.time()
            assert account["headroom_percent"] == 3 and account["tightest_window"] == "five_hour"

            [worker] = http.get("/internal/workers", headers=ADMIN).json()["workers"]
            assert worker["quota"]["windows"][0]["window"] == "five_hour"
            assert worker["quota"]["headroom_percent"] == 3

            text = http.get("/metrics").text
            five_labels = 'source="vendor",window="five_hour",worker="claude-a"'
            assert _sample(text, "used_percent", five_labels) == 97
            assert _sample(text, "reset_timestamp_seconds",
                           'window="five_hour",worker="claude-a"') == quota.five_hour_reset
            assert _sample(text, "seen_timestamp_seconds",
                           'window="five_hour",worker="claude-a"') == five["seen_at"]
            assert _sample(text, "headroom_percent", 'worker="claude-a"') == 3


def _sample(text: str, name: str, labels: str) -> float | None:
    found = re.search(rf"^poolgate_account_quota_{name}\{{{re.escape(labels)}\}} (\S+)$",
                      text, re.M)
    return float(found.group(1)) if found else None


def test_counted_windows_show_as_counted(tmp_path: Path) -> None:
    """A CLI that reports nothing (the fake Qwen Code) with ``quota_windows``:
    the gateway's own count, said to be one."""
    key = "sk-qwen-quota-view"
    with FakeUpstream(api_key=key, models=("qwen-coder",)) as upstream:
        cli = fake_cli_worker("qwen", "qwen-a", tmp_path / "q", upstream.url, tmp_path / "q.log",
                              api_key=key, quota_windows=(
                                  {"name": "five_hour", "seconds": 18000, "tokens": 1000},))
        settings = Settings(server=ServerSettings(admin_token="admin-token", metrics_public=True,
                                                  api_keys={"team": "sk-team"}),
                            workers=(cli,))
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30) as http, \
                openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-team", max_retries=0) as c:
            out = c.chat.completions.create(model="qwen-coder",
                                            messages=[{"role": "user", "content": "hello"}])
            used = 100 * (out.usage.prompt_tokens + out.usage.completion_tokens) / 1000
            [account] = http.get("/internal/accounts", headers=ADMIN).json()["accounts"]
            assert account["cli"] == "qwen" and account["source"] == "counted"
            [window] = account["windows"]
            assert window["source"] == "counted" and window["window"] == "five_hour"
            assert window["used_percent"] == pytest.approx(used, abs=0.01)
            assert account["headroom_percent"] == pytest.approx(100 - used, abs=0.01)
            assert _sample(http.get("/metrics").text, "used_percent",
                           'source="counted",window="five_hour",worker="qwen-a"') \
                == pytest.approx(used, abs=0.01)
