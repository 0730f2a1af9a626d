"""``account_quota_low`` and ``account_quota_forecast`` posted by the real
alert sender to a real HTTP receiver on 127.0.0.1, signed: once per window
however many reports say it is low, again after the window resets, and
delivered once a receiver that was down comes back."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from pathlib import Path

import anthropic
import pytest
from prometheus_client import CollectorRegistry

from app.alert_settings import AlertSettings
from app.alerts import Alerts
from app.factory import create_app
from app.quota_alerts import QuotaAlerts
from app.settings import ServerSettings, Settings
from pool.quota import AccountQuota, QuotaWindow
from tests.fakes.upstreams import FakeUpstream
from tests.fakes.vendor_quota import FakeQuota
from tests.support.alert_receiver import AlertReceiver, verify
from tests.support.cli_accounts import claude_home, fake_claude_worker
from tests.support.server import ServerThread

SECRET = "whsec-quota"
HOUR = 3600.0
MODEL = "claude-sonnet-4-6"


@dataclass
class Account:
    """A cli worker as the quota alerts read it."""

    name: str
    quota: AccountQuota
    kind: str = "cli"


def _five_hour(used: float, started: float, seen: float) -> QuotaWindow:
    return QuotaWindow("five_hour", used, resets_at=started + 5 * HOUR, window_seconds=5 * HOUR,
                       seen_at=seen)


async def _run(receiver: AlertReceiver, steps: list[tuple[float, float, float]],
               settle: float) -> None:
    """Feed ``(used, window start, at)`` reports of one account, checking after each."""
    alerts = Alerts([AlertSettings(url=receiver.url, secret=SECRET,
                                   events=("account_quota_low", "account_quota_forecast"),
                                   quota_warn_percent=20, forecast_warn_minutes=60,
                                   retry_initial=0.2, retry_max=0.5, max_attempts=40)],
                    CollectorRegistry())
    clock = [0.0]
    watch = QuotaAlerts(alerts, clock=lambda: clock[0])
    account = Account("claude-a", AccountQuota())
    alerts.start()
    try:
        for used, started, at in steps:
            clock[0] = at
            account.quota = account.quota.merged([_five_hour(used, started, at)])
            watch.check([account])
            await asyncio.sleep(0.02)
        await asyncio.sleep(settle)
    finally:
        await alerts.aclose()


def _events(receiver: AlertReceiver) -> list[tuple[str, str, str]]:
    return [(a["event"], a["worker"], a["details"]["window"]) for a in receiver.alerts()]


def test_a_low_window_alerts_once_until_it_resets() -> None:
    receiver = AlertReceiver()
    receiver.listen()
    try:
        start = time.time() - 4 * HOUR
        # 4 h into the window: 50 %, then 81..90 % over many reports (20 % or less
        # left, hovering), each reset time a second off the last; then it resets
        # and a new window runs low fast
        steps = [(50, start, start + 4 * HOUR)]
        steps += [(used, start + n % 2, start + 4 * HOUR + 30 * (n + 1))
                  for n, used in enumerate((81, 79, 85, 83, 90, 88))]
        later = start + 5 * HOUR + 120
        steps += [(96, start + 5 * HOUR, later)]
        asyncio.run(_run(receiver, steps, settle=1.5))
        assert _events(receiver) == [
            ("account_quota_low", "claude-a", "five_hour"),
            ("account_quota_forecast", "claude-a", "five_hour"),
            ("account_quota_low", "claude-a", "five_hour"),
            ("account_quota_forecast", "claude-a", "five_hour")], receiver.alerts()
        first = receiver.alerts()[0]
        assert first["state"] == "quota_low"
        assert first["details"]["left_percent"] == 19 and first["details"]["source"] == "vendor"
        assert first["details"]["resets_at"].endswith("Z")
        assert receiver.alerts()[1]["details"]["minutes_left"] <= 60
        for headers, body in receiver.posts():
            assert verify(SECRET, headers, body)
            assert SECRET.encode() not in body
    finally:
        receiver.close()


def test_a_receiver_down_for_a_while_gets_the_quota_alert_once_back() -> None:
    receiver = AlertReceiver()  # bound, not listening: refused

    async def scenario() -> None:
        start = time.time() - 4 * HOUR
        task = asyncio.ensure_future(_run(receiver, [
            (95, start, start + 4 * HOUR + n) for n in range(5)], settle=3.0))
        await asyncio.sleep(1.0)  # several attempts refused meanwhile
        assert receiver.posts() == []
        receiver.listen()
        await task
    try:
        asyncio.run(scenario())
        # 95 % after 4 h: low, and empty in about 13 minutes; each exactly once
        assert [e for e, _, _ in _events(receiver)] == [
            "account_quota_low", "account_quota_forecast"], receiver.alerts()
    finally:
        receiver.close()


@pytest.mark.slow
def test_a_gateway_alerts_a_low_account_once_however_many_turns_report_it(
        tmp_path: Path) -> None:
    """The fake Claude Code reads the vendor's quota headers as the real one
    does; five turns each report the 5-hour window low: one alert."""
    token = "sk-ant-oat01-quota-alerts"
    receiver = AlertReceiver()
    receiver.listen()
    try:
        with FakeUpstream(api_key=token, models=(MODEL,)) as upstream:
            upstream.quota[token] = FakeQuota(five_hour=90, seven_day=40)
            cli = fake_claude_worker("claude-a", claude_home(tmp_path / "a", token),
                                     upstream.anthropic_url, tmp_path / "a.log")
            settings = Settings(
                server=ServerSettings(admin_token="admin-token", api_keys={"team": "sk-team"}),
                workers=(cli,),
                alerts=(AlertSettings(url=receiver.url, secret=SECRET,
                                      secret_env="UNUSED_IN_TESTS",
                                      events=("account_quota_low", "account_cooling_down")),))
            with ServerThread(create_app(settings)) as srv, \
                    anthropic.Anthropic(base_url=srv.url, api_key="sk-team",
                                        max_retries=0) as client:
                for n in range(5):
                    upstream.quota[token].five_hour = 90 + n  # each turn a new number (Claude Code warns from 90 %)
                    client.messages.create(model=MODEL, max_tokens=32, messages=[
                        {"role": "user", "content": f"question {n}"}])
                receiver.wait(lambda: len(receiver.alerts()) >= 1, timeout=15)
                time.sleep(3)  # more checks (every 2 s) and status frames meanwhile
        alerts = receiver.alerts()
        assert [(a["event"], a["worker"], a["details"]["window"]) for a in alerts] == [
            ("account_quota_low", "claude-a", "five_hour")], alerts
        assert alerts[0]["details"]["source"] == "vendor"
        assert alerts[0]["details"]["left_percent"] <= 10
        assert verify(SECRET, *receiver.posts()[0])
    finally:
        receiver.close()
