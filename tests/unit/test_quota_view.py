"""What operators see of an account's quota (``app.quota_view``): the admin
JSON block, the ``/metrics`` gauges, and the quota alerts' deduplication, on
real :class:`pool.quota.AccountQuota` values."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from app.alert_settings import EVENTS, AlertSettings
from app.alerts import Alerts
from app.pool_metrics import PoolCollector
from app.quota_alerts import QuotaAlerts
from app.quota_view import quota_block, quota_metrics
from pool.quota import COUNTED, AccountQuota, QuotaWindow

HOUR = 3600.0
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Account:
    """A cli worker as these readers see it: a name, a kind and its quota."""

    name: str
    quota: AccountQuota = field(default_factory=AccountQuota)
    kind: str = "cli"


def five_hour(used: float, *, elapsed: float = HOUR, seen: float = NOW) -> QuotaWindow:
    return QuotaWindow("five_hour", used, resets_at=NOW - elapsed + 5 * HOUR,
                       window_seconds=5 * HOUR, seen_at=seen)


WEEKLY = QuotaWindow("seven_day", 40, resets_at=NOW + 3 * 24 * HOUR,
                     window_seconds=7 * 24 * HOUR, seen_at=NOW - 30)


def test_the_block_gives_each_window_headroom_and_forecast() -> None:
    block = quota_block(AccountQuota((five_hour(50), WEEKLY)), NOW)
    assert block["source"] == "vendor"
    assert block["headroom_percent"] == 50 and block["tightest_window"] == "five_hour"
    # 50 % in the first hour: empty an hour from now
    assert block["forecast_empty_at"] == NOW + HOUR
    assert block["forecast_empty_at_iso"] == "2027-01-15T09:00:00Z"
    assert block["forecast_seconds"] == HOUR
    five, week = block["windows"]
    assert five == {"window": "five_hour", "used_percent": 50, "left_percent": 50,
                    "current": True, "resets_at": NOW + 4 * HOUR,
                    "resets_at_iso": "2027-01-15T12:00:00Z", "window_seconds": 5 * HOUR,
                    "source": "vendor", "seen_at": NOW, "seen_at_iso": "2027-01-15T08:00:00Z",
                    "forecast_empty_at": NOW + HOUR,
                    "forecast_empty_at_iso": "2027-01-15T09:00:00Z", "forecast_seconds": HOUR}
    assert week["left_percent"] == 60 and week["forecast_empty_at"] is None
    assert week["seen_at_iso"] == "2027-01-15T07:59:30Z"


def test_an_account_with_nothing_known_says_so() -> None:
    assert quota_block(AccountQuota(), NOW) == {
        "source": None, "headroom_percent": None, "tightest_window": None,
        "forecast_empty_at": None, "forecast_empty_at_iso": None, "forecast_seconds": None,
        "windows": []}
    counted = AccountQuota((QuotaWindow("day", 10, source=COUNTED, seen_at=NOW),))
    assert quota_block(counted, NOW)["source"] == "counted"


def test_a_window_that_reset_since_is_all_left() -> None:
    block = quota_block(AccountQuota((five_hour(97),)), NOW + 5 * HOUR)
    assert block["windows"][0]["current"] is False
    assert block["windows"][0]["left_percent"] == 100 and block["headroom_percent"] == 100
    assert block["forecast_empty_at"] is None


def _scrape(workers: list[object], now: float) -> str:
    registry = CollectorRegistry()
    snapshot = {"workers": [], "admission": {"waiting": 0, "wait_count": 0, "wait_seconds": 0,
                                             "rejected": {}},
                "routing": {}, "bindings": {}, "quota": quota_metrics(workers, now)}
    registry.register(PoolCollector(lambda: snapshot))
    return generate_latest(registry).decode()


def _sample(text: str, name: str, labels: str) -> float | None:
    found = re.search(rf"^{name}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def test_metrics_per_account_and_window() -> None:
    text = _scrape([Account("claude-a", AccountQuota((five_hour(50), WEEKLY))),
                    Account("claude-b"), Account("p0", kind="process")], NOW)
    used = "poolgate_account_quota_used_percent"
    assert _sample(text, used, 'source="vendor",window="five_hour",worker="claude-a"') == 50
    assert _sample(text, used, 'source="vendor",window="seven_day",worker="claude-a"') == 40
    assert _sample(text, "poolgate_account_quota_reset_timestamp_seconds",
                   'window="five_hour",worker="claude-a"') == NOW + 4 * HOUR
    assert _sample(text, "poolgate_account_quota_seen_timestamp_seconds",
                   'window="seven_day",worker="claude-a"') == NOW - 30
    assert _sample(text, "poolgate_account_quota_headroom_percent", 'worker="claude-a"') == 50
    assert _sample(text, "poolgate_account_quota_forecast_seconds", 'worker="claude-a"') == HOUR
    # nothing known, or no quota at all: no samples (not a made-up 0 or 100)
    assert 'worker="claude-b"' not in text and 'worker="p0"' not in text


def test_no_forecast_no_forecast_sample() -> None:
    text = _scrape([Account("claude-a", AccountQuota((WEEKLY,)))], NOW)
    assert _sample(text, "poolgate_account_quota_headroom_percent", 'worker="claude-a"') == 60
    assert "poolgate_account_quota_forecast_seconds{" not in text


def _queued(alerts: Alerts) -> list[tuple[str, str, str]]:
    queue = alerts.receivers[0].queue
    out = []
    while not queue.empty():
        alert = queue.get_nowait()
        out.append((alert.event, alert.subject, alert.details["window"]))
    return out


def test_quota_alerts_fire_once_per_window_until_it_resets() -> None:
    async def scenario() -> None:
        clock = [NOW]
        alerts = Alerts([AlertSettings(url="http://127.0.0.1:9/x",
                                       events=("account_quota_low", "account_quota_forecast"),
                                       quota_warn_percent=20, forecast_warn_minutes=60)],
                        CollectorRegistry())  # not started: what it would send stays queued
        watch = QuotaAlerts(alerts, clock=lambda: clock[0])
        account = Account("claude-a", AccountQuota((five_hour(50, elapsed=3 * HOUR), WEEKLY)))
        watch.check([account])
        assert _queued(alerts) == []  # 50 % left, empty in 3 h: nothing yet
        # status frames report it low, hovering around the threshold, with a reset
        # that moves by seconds (as Codex's seconds-from-now do)
        for used, jitter in ((81, 0), (79, 2), (85, -3), (90, 1)):
            window = QuotaWindow("five_hour", used, resets_at=NOW + 2 * HOUR + jitter,
                                 window_seconds=5 * HOUR, seen_at=clock[0])
            account.quota = account.quota.merged([window])
            watch.check([account])
            clock[0] += 30
        assert _queued(alerts) == [("account_quota_low", "claude-a", "five_hour"),
                                   ("account_quota_forecast", "claude-a", "five_hour")]
        # the weekly window going low is its own alert
        account.quota = account.quota.merged([QuotaWindow(
            "seven_day", 95, resets_at=WEEKLY.resets_at, window_seconds=WEEKLY.window_seconds,
            seen_at=clock[0])])
        watch.check([account])
        assert ("account_quota_low", "claude-a", "seven_day") in _queued(alerts)
        # the five-hour window resets and runs low again: a new spell, a new alert
        clock[0] = NOW + 2 * HOUR + 60
        account.quota = account.quota.merged([QuotaWindow(
            "five_hour", 95, resets_at=NOW + 7 * HOUR, window_seconds=5 * HOUR,
            seen_at=clock[0])])
        watch.check([account])
        assert [a for a in _queued(alerts) if a[2] == "five_hour"] == [
            ("account_quota_low", "claude-a", "five_hour"),
            ("account_quota_forecast", "claude-a", "five_hour")]  # 95 % in its first minute
    asyncio.run(scenario())


def test_each_receiver_has_its_own_thresholds() -> None:
    async def scenario() -> None:
        alerts = Alerts([AlertSettings(url="http://127.0.0.1:9/a", events=("account_quota_low",),
                                       quota_warn_percent=30),
                         AlertSettings(url="http://127.0.0.1:9/b", events=("account_quota_low",),
                                       quota_warn_percent=10)], CollectorRegistry())
        watch = QuotaAlerts(alerts, clock=lambda: NOW)
        watch.check([Account("claude-a", AccountQuota((five_hour(75, elapsed=4 * HOUR),)))])
        assert [r.queue.qsize() for r in alerts.receivers] == [1, 0]
        watch.check([Account("claude-a", AccountQuota((five_hour(92, elapsed=4 * HOUR),)))])
        assert [r.queue.qsize() for r in alerts.receivers] == [1, 1]
    asyncio.run(scenario())


def test_the_events_table_in_the_docs_lists_every_event() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text()
    section = doc[doc.index("## `[[alerts]]`"):]
    table = set(re.findall(r"^\| `([a-z_]+)` \| ", section.split("| event | fires |")[1], re.M))
    assert table >= set(EVENTS), set(EVENTS) - table
    assert all(f"`{name}`" in section for name in EVENTS)
