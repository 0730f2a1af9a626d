"""``pool.quota``: headroom, the tightest window, the forecast, and the JSON
round trip the status frame relies on."""

from __future__ import annotations

from pool.quota import COUNTED, VENDOR, AccountQuota, QuotaWindow

HOUR = 3600.0
NOW = 1_800_000_000.0


def five_hour(used: float, *, elapsed: float, seen: float = NOW) -> QuotaWindow:
    return QuotaWindow("five_hour", used, resets_at=seen - elapsed + 5 * HOUR,
                       window_seconds=5 * HOUR, seen_at=seen)


def test_headroom_is_the_tightest_current_window() -> None:
    weekly = QuotaWindow("seven_day", 40, resets_at=NOW + 3 * 24 * HOUR,
                         window_seconds=7 * 24 * HOUR, seen_at=NOW)
    quota = AccountQuota((five_hour(97, elapsed=HOUR), weekly))
    assert quota.headroom(NOW) == 3
    assert quota.tightest(NOW).name == "five_hour"
    # once the five-hour window has reset, the weekly one is the tightest
    later = NOW + 4 * HOUR + 1
    assert quota.headroom(later) == 60
    assert quota.tightest(later).name == "seven_day"
    assert AccountQuota().headroom(NOW) is None


def test_forecast_from_the_average_rate_and_none_past_the_reset() -> None:
    # 50 % in the first hour: 50 more takes another hour, well before the reset
    assert five_hour(50, elapsed=HOUR).forecast(NOW) == NOW + HOUR
    # 10 % in four hours: at that rate it outlives the window
    assert five_hour(10, elapsed=4 * HOUR).forecast(NOW) is None
    # too early in the window to say
    assert five_hour(5, elapsed=10).forecast(NOW) is None
    assert five_hour(100, elapsed=HOUR).forecast(NOW) == NOW


def test_a_second_sample_of_the_same_window_gives_the_recent_rate() -> None:
    first = five_hour(20, elapsed=2 * HOUR, seen=NOW)
    second = five_hour(40, elapsed=2 * HOUR + 600, seen=NOW + 600)
    quota = AccountQuota((first,)).merged([second])
    window = quota.windows[0]
    assert (window.prev_percent, window.prev_seen_at) == (20, NOW)
    # 20 points in 10 minutes: 60 more in 30 minutes
    assert window.forecast(NOW + 600) == NOW + 600 + 1800
    # a reset starts the history afresh
    fresh = QuotaWindow("five_hour", 1, resets_at=NOW + 10 * HOUR, window_seconds=5 * HOUR,
                        seen_at=NOW + 700)
    assert quota.merged([fresh]).windows[0].prev_percent is None


def test_json_round_trip_and_hostile_input() -> None:
    quota = AccountQuota((five_hour(50, elapsed=HOUR),
                          QuotaWindow("tokens_5h", 12.5, source=COUNTED, seen_at=NOW)))
    again = AccountQuota.from_json(quota.to_json(NOW))
    assert again == quota
    assert again.source() == VENDOR
    assert again.to_json(NOW)[0]["forecast_empty_at"] == NOW + HOUR
    junk = AccountQuota.from_json([{"window": "x", "used_percent": "lots", "source": "me"},
                                   "nope", {"used_percent": 1e9, "seen_at": True}])
    assert [(w.name, w.used_percent, w.source) for w in junk.windows] == [
        ("x", 0.0, VENDOR), ("unknown", 100.0, VENDOR)]
    assert AccountQuota.from_json({"not": "a list"}) == AccountQuota()
