"""The account's quota read from the real binaries (npm, pinned), offline,
behind a real poolgate: Claude Code with a planted subscription login
(``.credentials.json``, ``user:inference``) and Codex with an API-key
``auth.json``, both against fake upstreams that send the vendors'
rate-limit headers (``anthropic-ratelimit-unified-*``, ``x-codex-*``)."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import anthropic
import pytest

from app.settings import WorkerSettings
from pool.cli.claude import ClaudeDriver
from pool.cli.driver import DriverConfig
from pool.cli.events import ConversationSetup, QuotaReport, Turn, TurnFinished
from pool.model import Message, TextPart
from tests.fakes.responses_upstream import ResponsesUpstream
from tests.fakes.upstreams import FakeUpstream
from tests.fakes.vendor_quota import FakeQuota
from tests.integration.clis import CLAUDE_CODE, CODEX, NPM_PREFIX, _base_env, ensure_cli
from tests.integration.test_cli_quota import _serve, _windows
from tests.support.cli_accounts import claude_home, wait_for
from tests.support.codex_accounts import CODEX_MODEL, codex_home, codex_worker
from tests.support.sdk_clients import closed_at_end

pytestmark = [pytest.mark.cli, pytest.mark.slow]

TOKEN = "sk-ant-oat01-planted-quota"
MODEL = "claude-sonnet-4-6"
CODEX_KEY = "sk-codex-real-quota"


@pytest.fixture(scope="module")
def claude_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Claude Code")
    assert ensure_cli(*CLAUDE_CODE) is not None
    native = NPM_PREFIX / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    assert native.exists()
    return str(native)


@pytest.fixture(scope="module")
def codex_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Codex")
    path = ensure_cli(*CODEX)
    assert path is not None
    return path


def _claude(tmp_path: Path, claude_bin: str, upstream: FakeUpstream) -> WorkerSettings:
    env = _base_env(tmp_path / "os-home")
    env.update(ANTHROPIC_BASE_URL=upstream.anthropic_url, ANTHROPIC_SMALL_FAST_MODEL=MODEL,
               ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL)
    return WorkerSettings(name="claude-real", kind="cli", cli="claude", models=(MODEL,),
                          home=str(claude_home(tmp_path / "account", TOKEN)),
                          command=(claude_bin,), env=env, ready_timeout=60,
                          health_interval=1.0)


def _ask(srv, text: str, model: str = MODEL) -> None:
    client = closed_at_end(anthropic.Anthropic(base_url=srv.url, api_key="sk-team-a",
                                               max_retries=0))
    client.messages.create(model=model, max_tokens=64,
                           messages=[{"role": "user", "content": text}])


def test_the_real_claude_reports_a_warning_and_get_usage_every_window(tmp_path, claude_bin):
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        quota = upstream.quota[TOKEN] = FakeQuota(five_hour=97, seven_day=40)
        with _serve(_claude(tmp_path, claude_bin, upstream)) as (srv, worker):
            _ask(srv, "hello")
            found = wait_for(lambda: len(worker.quota.windows) == 2 and _windows(worker),
                             timeout=30)
    five, seven = found["five_hour"], found["seven_day"]
    assert (five["used_percent"], five["resets_at"], five["window_seconds"]) == (
        97, quota.five_hour_reset, 18000)
    assert (seven["used_percent"], seven["resets_at"]) == (40, quota.seven_day_reset)
    assert five["source"] == seven["source"] == "vendor"


async def test_the_real_claude_answers_get_usage_with_every_window(tmp_path, claude_bin):
    """The driver's own ``get_usage`` against the real binary: asked after the
    turn (the first of the account), and answered with percents and ISO resets."""
    reports: list = []
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        quota = upstream.quota[TOKEN] = FakeQuota(five_hour=5, seven_day=10)
        env = _base_env(tmp_path / "os-home")
        env.update(ANTHROPIC_BASE_URL=upstream.anthropic_url, ANTHROPIC_SMALL_FAST_MODEL=MODEL,
                   ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL)
        home = claude_home(tmp_path / "account", TOKEN)
        (tmp_path / "cwd").mkdir()
        driver = ClaudeDriver(DriverConfig(name="claude-real", cli="claude", home=str(home),
                                           cwd=str(tmp_path / "cwd"), command=(claude_bin,),
                                           env=env))
        driver.on_quota = reports.append
        await driver.start()
        conv = await driver.open(ConversationSetup(model=MODEL, system="S"))
        try:
            events = [e async for e in conv.send(Turn((Message("user", (TextPart("hi"),)),)))]
            assert isinstance(events[-1], TurnFinished)
            [event_report] = [e for e in events if isinstance(e, QuotaReport)]
            asked = await conv.usage()
            for _ in range(100):  # the driver's own ask after the turn
                if reports:
                    break
                await asyncio.sleep(0.1)
        finally:
            await conv.close()
            await driver.stop()
    by_name = {w.name: w for w in asked}
    assert (by_name["five_hour"].used_percent, by_name["five_hour"].resets_at) == (
        5, quota.five_hour_reset)
    assert (by_name["seven_day"].used_percent, by_name["seven_day"].resets_at) == (
        10, quota.seven_day_reset)
    assert {w.name: w.used_percent for w in reports[0]} == {"five_hour": 5, "seven_day": 10}
    # 2.1.332's event already holds every window (unifiedWindows)
    assert {w.name: w.used_percent for w in event_report.windows} == pytest.approx(
        {"five_hour": 5, "seven_day": 10})


def test_the_real_claude_at_its_limit_is_a_spent_window(tmp_path, claude_bin):
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        quota = upstream.quota[TOKEN] = FakeQuota(five_hour=100, seven_day=40)
        with _serve(_claude(tmp_path, claude_bin, upstream)) as (srv, worker):
            with pytest.raises(anthropic.APIStatusError) as err:
                _ask(srv, "hello")
            found = wait_for(lambda: _windows(worker).get("five_hour"), timeout=30)
    assert err.value.status_code in (429, 529)
    assert (found["used_percent"], found["resets_at"]) == (100, quota.five_hour_reset)


def test_the_real_codex_reports_its_windows_after_a_turn(tmp_path, codex_bin):
    with ResponsesUpstream(api_key=CODEX_KEY, models=(CODEX_MODEL,)) as upstream:
        quota = upstream.quota[CODEX_KEY] = FakeQuota(five_hour=97.2, seven_day=40.5)
        worker = codex_worker("codex-real", codex_home(tmp_path / "c", CODEX_KEY), upstream.url,
                              command=(codex_bin,), ready_timeout=60)
        with _serve(worker) as (srv, worker):
            _ask(srv, "hello", CODEX_MODEL)
            found = wait_for(lambda: len(worker.quota.windows) == 2 and _windows(worker),
                             timeout=30)
    primary, secondary = found["primary"], found["secondary"]
    # Codex 0.171.0 sends whole percents, rounded half away from zero
    assert (primary["used_percent"], primary["window_seconds"], primary["resets_at"]) == (
        97, 18000, quota.five_hour_reset)
    assert (secondary["used_percent"], secondary["window_seconds"], secondary["resets_at"]) == (
        41, 604800, quota.seven_day_reset)
    assert time.time() - primary["seen_at"] < 60
