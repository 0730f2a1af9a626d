"""Quota from what the CLIs print: Claude's ``rate_limit_event`` and
``get_usage`` answer, Codex's ``account/rateLimits/*``, as windows the host
merges into the account's quota and shows in its status. CLI output is
hostile: junk gives no window (or a clamped one), never an exception, and
never a poisoned quota."""

from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import ValidationError

from app.worker_settings import WorkerSettings

from pool.cli.claude_events import ClaudeStream
from pool.cli.counted import CountedQuota, CountedWindow
from pool.cli.codex_thread import reset_at
from pool.cli.events import QuotaReport, RateLimited, TextChunk, TurnFailed, TurnFinished
from pool.cli.quota_events import MAX_WINDOWS, claude_usage, codex_rate_limits, window
from pool.errors import GatewayError
from pool.quota import COUNTED, QuotaWindow
from tests.unit.test_cli_host import ScriptedDriver, _host, _request, _user

RESET = 1900000000


def _event(**info: object) -> dict:
    return {"type": "rate_limit_event", "rate_limit_info": info, "session_id": "s"}


def test_a_claude_warning_is_the_window_in_percent_with_its_length():
    [report] = ClaudeStream().feed(_event(status="allowed_warning", resetsAt=RESET,
                                          rateLimitType="five_hour", utilization=0.97,
                                          isUsingOverage=False))
    [five] = report.windows
    assert (five.name, five.used_percent, five.resets_at, five.window_seconds, five.source) == (
        "five_hour", pytest.approx(97.0), RESET, 18000, "vendor")
    assert abs(five.seen_at - time.time()) < 5
    [report] = ClaudeStream().feed(_event(status="allowed_warning", resetsAt=RESET,
                                          rateLimitType="seven_day", utilization=0.8))
    assert report.windows[0].window_seconds == 604800


def test_claude_2_1_332_events_carry_every_window_in_unified_windows():
    stream = ClaudeStream()
    [report] = stream.feed(_event(
        status="allowed", resetsAt=RESET, rateLimitType="seven_day", isUsingOverage=False,
        unifiedWindows={"five_hour": {"utilization": 0.05, "resetsAt": RESET, "status": "allowed"},
                        "seven_day": {"utilization": 0.1, "resetsAt": RESET + 9,
                                      "status": "allowed"},
                        "junk": "x", "bad name!": {"utilization": 0.5}}))
    assert {w.name: (round(w.used_percent, 6), w.resets_at, w.window_seconds)
            for w in report.windows} == {"five_hour": (5, RESET, 18000),
                                         "seven_day": (10, RESET + 9, 604800)}
    assert stream.rate_info is None  # every window came: no get_usage needed for it
    report, limited = ClaudeStream().feed(_event(
        status="rejected", resetsAt=RESET, rateLimitType="five_hour",
        unifiedWindows={"five_hour": {"utilization": 1, "resetsAt": RESET, "status": "rejected"},
                        "seven_day": {"utilization": 0.4, "resetsAt": RESET}}))
    assert {w.name: w.used_percent for w in report.windows} == {"five_hour": 100,
                                                                "seven_day": 40}
    assert isinstance(limited, RateLimited)
    many = {f"w{i}": {"utilization": 0.1, "resetsAt": RESET} for i in range(1000)}
    [report] = ClaudeStream().feed(_event(status="allowed", unifiedWindows=many))
    assert len(report.windows) == MAX_WINDOWS


def test_a_claude_rejection_is_a_spent_window_and_a_rate_limit():
    report, limited = ClaudeStream().feed(_event(status="rejected", resetsAt=RESET,
                                                 rateLimitType="five_hour"))
    assert report.windows[0].used_percent == 100 and report.windows[0].resets_at == RESET
    assert limited == RateLimited("the account's rate limit was reached", float(RESET))


def test_claude_allowed_without_numbers_reports_nothing_but_is_noticed():
    stream = ClaudeStream()
    assert stream.feed(_event(status="allowed", resetsAt=RESET, rateLimitType="seven_day",
                              overageStatus="rejected")) == []
    assert stream.rate_info == ("allowed", "seven_day", "None", str(RESET))  # asks get_usage


@pytest.mark.parametrize("info", [
    None, [], "rejected", 7,
    {"status": "allowed_warning", "rateLimitType": "five_hour", "utilization": "0.97"},
    {"status": "allowed_warning", "rateLimitType": 5, "utilization": 0.5},
    {"status": "allowed_warning", "rateLimitType": "x" * 300, "utilization": 0.5},
    {"status": "allowed_warning", "rateLimitType": "five hour; drop", "utilization": 0.5},
    {"status": "allowed_warning", "rateLimitType": "five_hour", "utilization": float("nan")},
    {"status": "allowed_warning", "rateLimitType": "five_hour", "utilization": True},
    {"status": "allowed_warning", "rateLimitType": None, "utilization": 0.5},
    {"status": "allowed", "unifiedWindows": "x"},
    {"status": "allowed", "unifiedWindows": [{"utilization": 0.5}]},
    {"status": "allowed", "unifiedWindows": {"five_hour": {"utilization": "half"}}},
])
def test_junk_claude_rate_limit_events_give_no_window(info):
    events = ClaudeStream().feed({"type": "rate_limit_event", "rate_limit_info": info})
    assert not any(isinstance(e, QuotaReport) for e in events)


def test_junk_numbers_are_clamped_or_dropped_not_kept():
    [report] = ClaudeStream().feed(_event(status="allowed_warning", rateLimitType="five_hour",
                                          utilization=7.5, resetsAt=1e20))
    assert report.windows[0].used_percent == 100 and report.windows[0].resets_at is None
    assert window("w", -3, resets_at="soon", window_seconds=-1, seen_at=1.0) == QuotaWindow(
        "w", 0.0, None, None, seen_at=1.0)
    assert window("w", 10, resets_at="2030-01-01T00:00:00", seen_at=1.0).resets_at is None
    assert window("w", 10, resets_at="2030-01-01T00:00:00Z", seen_at=1.0).resets_at == 1893456000


def test_the_claude_get_usage_answer_is_every_window_in_percent():
    answer = {"subscription_type": "max", "rate_limits_available": True, "rate_limits": {
        "five_hour": {"utilization": 50, "resets_at": "2030-01-01T00:00:00+00:00"},
        "seven_day": {"utilization": 20.5, "resets_at": "2030-01-05T00:00:00Z"},
        "seven_day_opus": {"utilization": None, "resets_at": None},  # unknown, not 0 %
        "junk": "x"}}
    five, seven = claude_usage(answer, 100.0)
    assert (five.name, five.used_percent, five.resets_at, five.window_seconds) == (
        "five_hour", 50, 1893456000, 18000)
    assert (seven.name, seven.used_percent, seven.resets_at) == ("seven_day", 20.5, 1893801600)
    assert claude_usage({"rate_limits": [1, 2]}, 1.0) == () == claude_usage("x", 1.0)
    many = {"rate_limits": {f"w{i}": {"utilization": i} for i in range(100)}}
    assert len(claude_usage(many, 1.0)) == MAX_WINDOWS


def test_codex_rate_limits_are_primary_and_secondary_with_their_length():
    params = {"rateLimits": {"limitId": "codex", "limitName": None,
                             "primary": {"usedPercent": 97, "windowDurationMins": 300,
                                         "resetsAt": RESET},
                             "secondary": {"usedPercent": 40.5, "windowDurationMins": 10080,
                                           "resetsAt": RESET + 86400},
                             "credits": None, "planType": None}}
    primary, secondary = codex_rate_limits(params, 5.0)
    assert (primary.name, primary.used_percent, primary.window_seconds, primary.resets_at) == (
        "primary", 97, 18000, RESET)
    assert (secondary.name, secondary.used_percent, secondary.window_seconds) == (
        "secondary", 40.5, 604800)
    other = {"rateLimits": {"limitId": "gpt-5-mini", "primary": {"usedPercent": 3}}}
    assert [w.name for w in codex_rate_limits(other, 1.0)] == ["gpt-5-mini:primary"]
    read = {"rateLimits": params["rateLimits"], "rateLimitsByLimitId": {
        "codex": params["rateLimits"], "mini": {"primary": {"usedPercent": 1}}}}
    assert [w.name for w in codex_rate_limits(read, 1.0)] == ["primary", "secondary",
                                                             "mini:primary"]
    for junk in (None, [], {"rateLimits": "x"}, {"rateLimits": {"primary": "x"}},
                 {"rateLimits": {"primary": {"usedPercent": "97"}}},
                 {"rateLimitsByLimitId": ["x"]}):
        assert codex_rate_limits(junk, 1.0) == ()


def test_the_host_merges_reports_into_its_status_and_keeps_a_bounded_quota():
    async def go() -> None:
        five = QuotaWindow("five_hour", 40, RESET, 18000, seen_at=time.time() - 120)
        driver = ScriptedDriver([[QuotaReport((five,)), TextChunk("a"), TurnFinished()],
                                 [TextChunk("b"), TurnFinished()]])
        host = _host(driver)
        await host.start()
        assert (await host.status())["quota"] == []
        [event async for event in host.answer(_request(_user("q")))]
        [shown] = (await host.status())["quota"]
        assert (shown["window"], shown["used_percent"], shown["source"]) == ("five_hour", 40,
                                                                             "vendor")
        host.report_quota((QuotaWindow("five_hour", 60, RESET, 18000, seen_at=time.time()),))
        [merged] = host.quota.windows
        assert (merged.used_percent, merged.prev_percent) == (60, 40)
        host.report_quota(("junk", None))  # type: ignore[arg-type]
        host.report_quota(tuple(QuotaWindow(f"w{i}", i, seen_at=float(i)) for i in range(40)))
        assert len(host.quota.windows) == 16
        assert "w39" in {w.name for w in host.quota.windows}
        await host.aclose()

    asyncio.run(go())


# --- counted windows ----------------------------------------------------------------------

def test_counted_windows_start_with_the_first_tokens_and_reset_after_their_length():
    counted = CountedQuota((CountedWindow("five_hour", 18000, 1000),
                            CountedWindow("week", 604800, 10000)))
    [five, week] = counted.quota(1000.0).windows
    assert (five.used_percent, five.resets_at, five.source) == (0, None, COUNTED)
    counted.add(250, now=1000.0)
    counted.add(0, now=1001.0)  # nothing to count
    counted.add(250, now=1100.0)
    five, week = counted.quota(1200.0).windows
    assert (five.used_percent, five.resets_at, five.window_seconds) == (50, 19000, 18000)
    assert (five.prev_percent, five.prev_seen_at, five.seen_at) == (25, 1000.0, 1100.0)
    assert (week.used_percent, week.resets_at) == (5, 605800)
    counted.add(5000, now=1300.0)
    assert counted.quota(1300.0).windows[0].used_percent == 100  # capped
    five, week = counted.quota(19000.0).windows  # the 5-hour window has reset
    assert (five.used_percent, five.resets_at, five.prev_percent) == (0, None, None)
    assert week.used_percent == 55
    counted.add(100, now=20000.0)  # a new 5-hour window
    five = counted.quota(20000.0).windows[0]
    assert (five.used_percent, five.resets_at, five.prev_percent) == (10, 38000, None)
    assert CountedQuota(()).quota().windows == ()


@pytest.mark.parametrize("windows, message", [
    ([{"name": "five hour", "seconds": 1, "tokens": 1}], "name"),
    ([{"name": "w", "seconds": 0, "tokens": 1}], "seconds"),
    ([{"name": "w", "seconds": 1, "tokens": 0}], "tokens"),
    ([{"name": "w", "seconds": 1, "tokens": 1, "limit": 3}], "limit"),
    ([{"name": "w", "seconds": 1, "tokens": 1}] * 2, "a name of its own"),
    ([{"name": f"w{i}", "seconds": 1, "tokens": 1} for i in range(9)], "quota_windows"),
])
def test_quota_windows_settings_are_checked(windows, message):
    with pytest.raises(ValidationError) as err:
        WorkerSettings(name="q", kind="cli", cli="qwen", home="/tmp/q", models=("m",),
                       quota_windows=windows)
    assert message in str(err.value)


def test_quota_windows_are_for_cli_workers_only():
    with pytest.raises(ValidationError, match="only a cli worker"):
        WorkerSettings(name="r", kind="remote", dialect="openai", url="http://127.0.0.1:1",
                       models=("m",), quota_windows=[{"name": "w", "seconds": 1, "tokens": 1}])
    ok = WorkerSettings(name="q", kind="cli", cli="qwen", home="/tmp/q", models=("m",),
                        quota_windows=[{"name": "five_hour", "seconds": 18000,
                                        "tokens": 2000000}])
    assert ok.quota_windows[0].tokens == 2000000


def test_a_limit_without_a_reset_cools_down_until_the_spent_windows_reset():
    async def go() -> None:
        spent = QuotaWindow("primary", 100, time.time() + 3000, 18000, seen_at=time.time())
        fine = QuotaWindow("secondary", 41, time.time() + 90000, 604800, seen_at=time.time())
        driver = ScriptedDriver([[QuotaReport((spent, fine)),
                                  RateLimited("You've hit your usage limit."),
                                  TurnFailed("overloaded", "usage limit", 429)]])
        host = _host(driver)
        await host.start()
        with pytest.raises(GatewayError):
            [event async for event in host.answer(_request(_user("q")))]
        assert host.cooldown_until == spent.resets_at  # not the 60 s default
        await host.aclose()

    asyncio.run(go())


def test_codex_0_171_says_try_again_with_a_capital_t():
    now = time.mktime((2026, 11, 27, 7, 0, 0, 0, 0, -1))
    at = reset_at("You\u2019ve hit your usage limit. Try again at 10:31 AM.", now)
    assert at == time.mktime((2026, 11, 27, 10, 31, 0, 0, 0, -1))
