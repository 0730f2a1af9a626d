"""An account's live quota, read from what its CLI reports, behind a real
poolgate: the fake ``claude`` reads a subscription upstream's
``anthropic-ratelimit-unified-*`` headers as the real one does, the fake
codex app-server the ``x-codex-*`` ones; the worker child merges the
reports, and ``CliWorker.quota`` (what ``/internal/workers``,
``/internal/accounts`` and routing read) shows them right after the turn."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings
from pool.quota import VENDOR
from tests.fakes.responses_upstream import ResponsesUpstream
from tests.fakes.upstreams import FakeUpstream
from tests.fakes.vendor_quota import FakeQuota
from tests.support.cli_accounts import claude_home, fake_claude_worker, read_log, wait_for
from tests.support.cli_fakes import fake_cli_worker
from tests.support.codex_accounts import CODEX_MODEL, codex_home, codex_worker, provider_options
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

ADMIN = {"authorization": "Bearer admin-token"}
TOKEN = "sk-ant-oat01-quota-account"
MODEL = "claude-sonnet-4-6"


@pytest.fixture
def upstream():
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as fake:
        yield fake


@contextlib.contextmanager
def _serve(settings) -> Iterator[tuple[ServerThread, Any]]:
    """A real gateway with one worker; the worker object itself too."""
    app = create_app(Settings(server=ServerSettings(admin_token="admin-token",
                                                    api_keys={"team-a": "sk-team-a"}),
                              workers=(settings,)))
    with ServerThread(app) as srv:
        yield srv, app.state.gateway.pool.workers[0]


@pytest.fixture
def claude(tmp_path: Path, upstream: FakeUpstream):
    with _serve(fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                   upstream.anthropic_url, tmp_path / "claude.log")) as served:
        yield served


def _ask(srv: ServerThread, text: str = "hello", model: str = MODEL) -> anthropic.types.Message:
    client = closed_at_end(anthropic.Anthropic(base_url=srv.url, api_key="sk-team-a",
                                               max_retries=0))
    return client.messages.create(model=model, max_tokens=64,
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
    found = wait_for(lambda: len(worker.quota.windows) == 2 and _windows(worker), timeout=5)
    five, seven = found["five_hour"], found["seven_day"]
    assert five["used_percent"] == 97 and five["source"] == VENDOR
    assert five["resets_at"] == quota.five_hour_reset and five["window_seconds"] == 18000
    assert (seven["used_percent"], seven["resets_at"], seven["window_seconds"]) == (
        40, quota.seven_day_reset, 604800)
    assert worker.quota.headroom(five["seen_at"]) == pytest.approx(3.0)
    assert worker.quota.tightest(five["seen_at"]).name == "five_hour"


def test_every_window_comes_with_each_event_and_changes_show_after_each_turn(claude, upstream):
    srv, worker = claude
    quota = upstream.quota[TOKEN] = FakeQuota(five_hour=5, seven_day=10)
    _ask(srv)  # "allowed": still every window's numbers (unifiedWindows)
    wait_for(lambda: len(worker.quota.windows) == 2, timeout=5)
    assert {w.name: w.used_percent for w in worker.quota.windows} == pytest.approx(
        {"five_hour": 5, "seven_day": 10})
    quota.five_hour, quota.seven_day = 30, 12
    _ask(srv, "more")
    wait_for(lambda: _windows(worker)["five_hour"]["used_percent"] == 30, timeout=5)
    five = next(w for w in worker.quota.windows if w.name == "five_hour")
    assert five.prev_percent == pytest.approx(5)  # the earlier sample of the same window


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


def _usage_requests(log: Path) -> int:
    return sum(1 for e in read_log(log) if "stdin" in e
               and (e["stdin"].get("request") or {}).get("subtype") == "get_usage")


def test_get_usage_gives_a_fresh_accounts_windows_once_a_minute_and_after_a_change(
        upstream, tmp_path):
    log = tmp_path / "claude.log"
    # Claude Code 2.1.197's events: no unifiedWindows, numbers only near a limit
    settings = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                  upstream.anthropic_url, log,
                                  env={"FAKE_CLAUDE_RATE_EVENTS": "2.1.197"})
    with _serve(settings) as (srv, worker):
        _check_get_usage(srv, worker, upstream, log)


def _check_get_usage(srv, worker, upstream, log):
    quota = upstream.quota[TOKEN] = FakeQuota(five_hour=50, seven_day=20)
    _ask(srv)  # no warning: the rate_limit_event says "allowed", with no numbers
    found = wait_for(lambda: len(worker.quota.windows) == 2 and _windows(worker), timeout=5)
    assert (found["five_hour"]["used_percent"], found["five_hour"]["resets_at"]) == (
        50, quota.five_hour_reset)
    assert (found["seven_day"]["used_percent"], found["seven_day"]["window_seconds"]) == (
        20, 604800)
    assert _usage_requests(log) == 1
    quota.five_hour = 60  # the same derived status: no event, and the minute is not over
    _ask(srv, "again")
    time.sleep(0.5)
    assert _usage_requests(log) == 1 and _windows(worker)["five_hour"]["used_percent"] == 50
    quota.five_hour = 97  # a warning: an event, then get_usage at once
    _ask(srv, "and again")
    wait_for(lambda: _usage_requests(log) == 2, timeout=5)
    wait_for(lambda: _windows(worker)["five_hour"]["used_percent"] == 97, timeout=5)
    assert _windows(worker)["seven_day"]["used_percent"] == 20


def test_junk_quota_output_neither_breaks_a_turn_nor_poisons_the_quota(upstream, tmp_path):
    settings = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                  upstream.anthropic_url, tmp_path / "claude.log", env={
                                      "FAKE_CLAUDE_FAULT": "junk-quota",
                                      "FAKE_CLAUDE_USAGE": "junk",
                                      "FAKE_CLAUDE_RATE_EVENTS": "2.1.197"})
    upstream.quota[TOKEN] = FakeQuota(five_hour=97, seven_day=40)
    with _serve(settings) as (srv, worker):
        for text in ("one", "two"):
            assert _ask(srv, text).content[0].text == f"echo: {text}"
        time.sleep(0.5)  # the junk get_usage answer came and went
        assert {w.name: w.used_percent for w in worker.quota.windows} == pytest.approx(
            {"five_hour": 97})
        assert worker.process_state.value == "ready"


def test_a_get_usage_that_never_answers_holds_up_no_turn(upstream, tmp_path):
    settings = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                  upstream.anthropic_url, tmp_path / "claude.log",
                                  env={"FAKE_CLAUDE_USAGE": "hang"})
    upstream.quota[TOKEN] = FakeQuota(five_hour=20, seven_day=5)
    with _serve(settings) as (srv, worker):
        client = closed_at_end(anthropic.Anthropic(base_url=srv.url, api_key="sk-team-a",
                                                   max_retries=0))
        history = [{"role": "user", "content": "first"}]
        first = client.messages.create(model=MODEL, max_tokens=64, messages=history)
        history += [{"role": "assistant", "content": first.content[0].text},
                    {"role": "user", "content": "second"}]
        # the same conversation (its process still owes the get_usage answer) takes the turn
        second = client.messages.create(model=MODEL, max_tokens=64, messages=history)
        assert second.content[0].text == "echo: second"
        assert _usage_requests(tmp_path / "claude.log") == 1
        assert len({e["pid"] for e in read_log(tmp_path / "claude.log") if "argv" in e}) == 1
        assert {w.name for w in worker.quota.windows} == {"five_hour", "seven_day"}


# --- Codex --------------------------------------------------------------------------------

CODEX_KEY = "sk-codex-quota-account"


@pytest.fixture
def responses():
    with ResponsesUpstream(api_key=CODEX_KEY, models=(CODEX_MODEL,)) as fake:
        yield fake


def test_codex_rate_limit_notifications_reach_worker_quota(tmp_path, responses):
    quota = responses.quota[CODEX_KEY] = FakeQuota(five_hour=97.2, seven_day=40.5)
    with _serve(codex_worker("codex-a", codex_home(tmp_path / "c", CODEX_KEY),
                             responses.url)) as (srv, worker):
        assert worker.quota.windows == ()  # an API-key login: nothing to read before a turn
        _ask(srv, model=CODEX_MODEL)
        found = wait_for(lambda: len(worker.quota.windows) == 2 and _windows(worker), timeout=5)
    primary, secondary = found["primary"], found["secondary"]
    assert (primary["used_percent"], primary["window_seconds"], primary["resets_at"]) == (
        97, 18000, quota.five_hour_reset)
    # whole percents, rounded half away from zero, as Codex 0.171.0 sends them
    assert (secondary["used_percent"], secondary["window_seconds"], secondary["resets_at"]) == (
        41, 604800, quota.seven_day_reset)
    assert primary["source"] == VENDOR


def test_a_chatgpt_login_reads_its_rate_limits_before_any_turn(tmp_path, responses):
    quota = responses.quota[CODEX_KEY] = FakeQuota(five_hour=12, seven_day=3)
    home = codex_home(tmp_path / "c", None)
    (home / "auth.json").write_text(json.dumps({"auth_mode": "chatgpt",
                                                "OPENAI_API_KEY": CODEX_KEY}))
    (home / "auth.json").chmod(0o600)
    worker = codex_worker("codex-a", home, responses.url,
                          cli_options={"config": {**provider_options(responses.url)["config"],
                                                  "chatgpt_base_url": responses.chatgpt_url}})
    with _serve(worker) as (srv, worker):
        found = wait_for(lambda: len(worker.quota.windows) == 2 and _windows(worker), timeout=10)
    assert (found["primary"]["used_percent"], found["primary"]["resets_at"]) == (
        12, quota.five_hour_reset)
    assert found["secondary"]["used_percent"] == 3
    assert [r.path for r in responses.requests].count("/backend-api/wham/usage") == 1


# --- counted windows ----------------------------------------------------------------------

QWEN_KEY = "sk-qwen-quota-account"


def test_a_cli_that_reports_nothing_gets_its_tokens_counted_in_the_configured_windows(
        tmp_path):
    with FakeUpstream(api_key=QWEN_KEY, models=("qwen-coder",)) as upstream:
        settings = fake_cli_worker("qwen", "qwen-a", tmp_path / "q", upstream.url,
                                   tmp_path / "qwen.log", api_key=QWEN_KEY, quota_windows=(
                                       {"name": "five_hour", "seconds": 18000, "tokens": 1000},
                                       {"name": "day", "seconds": 86400, "tokens": 100000}))
        with _serve(settings) as (srv, worker):
            # known before any turn: nothing used yet
            assert {w.name: w.used_percent for w in worker.quota.windows} == {
                "five_hour": 0, "day": 0}
            client = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-team-a",
                                                 max_retries=0))
            used = 0
            for text in ("one", "two words"):
                out = client.chat.completions.create(model="qwen-coder", messages=[
                    {"role": "user", "content": text}])
                used += out.usage.prompt_tokens + out.usage.completion_tokens
            found = _windows(worker)
    assert used > 0
    five, day = found["five_hour"], found["day"]
    assert five["used_percent"] == pytest.approx(100 * used / 1000, abs=0.01)
    assert day["used_percent"] == pytest.approx(100 * used / 100000, abs=0.01)
    assert five["source"] == day["source"] == "counted"
    assert five["window_seconds"] == 18000
    assert 18000 - 60 < five["resets_at"] - time.time() <= 18000


def test_vendor_numbers_win_over_counted_ones(tmp_path, upstream):
    settings = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                  upstream.anthropic_url, tmp_path / "claude.log",
                                  quota_windows=({"name": "w", "seconds": 3600,
                                                  "tokens": 10000},))
    with _serve(settings) as (srv, worker):
        _ask(srv)  # the upstream sends no quota headers: counted
        wait_for(lambda: _windows(worker)["w"]["used_percent"] > 0, timeout=5)
        upstream.quota[TOKEN] = FakeQuota(five_hour=97, seven_day=40)
        _ask(srv, "now with the vendor's numbers")
        found = wait_for(lambda: "five_hour" in _windows(worker) and _windows(worker),
                         timeout=5)
    assert set(found) == {"five_hour", "seven_day"}
    assert {w["source"] for w in found.values()} == {VENDOR}
