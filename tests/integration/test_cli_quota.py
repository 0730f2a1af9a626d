"""An account's live quota, read from what its CLI reports, behind a real
poolgate: the fake ``claude`` reads a subscription upstream's
``anthropic-ratelimit-unified-*`` headers as the real one does, the worker
child merges the reports, and ``CliWorker.quota`` (what ``/internal/workers``,
``/internal/accounts`` and routing read) shows them right after the turn."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anthropic
import httpx
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings
from pool.quota import VENDOR
from tests.fakes.upstreams import FakeUpstream
from tests.fakes.vendor_quota import FakeQuota
from tests.support.cli_accounts import claude_home, fake_claude_worker, wait_for
from tests.support.server import ServerThread

ADMIN = {"authorization": "Bearer admin-token"}
TOKEN = "sk-ant-oat01-quota-account"
MODEL = "claude-sonnet-4-6"


@pytest.fixture
def upstream():
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as fake:
        yield fake


@pytest.fixture
def claude(tmp_path: Path, upstream: FakeUpstream):
    worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                upstream.anthropic_url, tmp_path / "claude.log")
    app = create_app(Settings(server=ServerSettings(admin_token="admin-token",
                                                    api_keys={"team-a": "sk-team-a"}),
                              workers=(worker,)))
    with ServerThread(app) as srv:
        yield srv, app.state.gateway.pool.workers[0]


def _ask(srv: ServerThread, text: str = "hello") -> anthropic.types.Message:
    client = anthropic.Anthropic(base_url=srv.url, api_key="sk-team-a", max_retries=0)
    return client.messages.create(model=MODEL, max_tokens=64,
                                  messages=[{"role": "user", "content": text}])


def _windows(worker) -> dict[str, dict]:
    """The worker's quota as ``/internal/workers`` shows it, by window."""
    return {w["window"]: w for w in worker.quota.to_json(time.time())}


def test_a_warning_from_the_vendor_reaches_worker_quota_right_after_the_turn(claude, upstream):
    srv, worker = claude
    assert worker.quota.windows == ()  # nothing known before any answer
    quota = upstream.quota[TOKEN] = FakeQuota(five_hour=97, seven_day=40)
    _ask(srv)
    # the status is polled from the child just after the answer
    five = wait_for(lambda: _windows(worker).get("five_hour"), timeout=5)
    assert five["used_percent"] == 97 and five["source"] == VENDOR
    assert five["resets_at"] == quota.five_hour_reset and five["window_seconds"] == 18000
    [window] = worker.quota.windows
    assert (window.name, window.used_percent, window.resets_at) == (
        "five_hour", 97.0, quota.five_hour_reset)
    assert worker.quota.headroom(window.seen_at) == pytest.approx(3.0)


def test_the_limit_shows_as_a_spent_window_and_a_cooldown(claude, upstream):
    srv, worker = claude
    quota = upstream.quota[TOKEN] = FakeQuota(five_hour=100, seven_day=40)
    with pytest.raises(anthropic.APIStatusError) as err:
        _ask(srv)
    assert err.value.status_code in (429, 529)
    # the cooldown lasts until the reset the vendor reported
    assert abs(int(err.value.response.headers["retry-after"]) - (quota.five_hour_reset
                                                                  - time.time())) < 5
    five = wait_for(lambda: _windows(worker).get("five_hour"), timeout=5)
    assert five["used_percent"] == 100 and five["left_percent"] == 0
    assert five["resets_at"] == quota.five_hour_reset
    assert worker.quota.headroom(five["seen_at"]) == 0


def test_a_restarted_child_that_knows_nothing_yet_leaves_the_account_quota_standing(
        claude, upstream):
    srv, worker = claude
    upstream.quota[TOKEN] = FakeQuota(five_hour=97, seven_day=40)
    _ask(srv)
    wait_for(lambda: worker.quota.windows, timeout=5)
    before = worker.quota
    with httpx.Client(base_url=srv.url, timeout=10) as http:
        def info() -> dict:
            return http.get("/internal/workers", headers=ADMIN).json()["workers"][0]
        child = info()["pid"]
        os.kill(child, signal.SIGKILL)
        wait_for(lambda: (w := info())["state"] == "ready" and w["pid"] != child
                 and w["login"] == "ready", timeout=15)
    assert worker.quota == before  # the numbers are the account's, not the process's
