"""``pool.headroom``: which accounts take a new conversation (``quota_reserve``)
and which of the free ones should (the most headroom), on stand-in workers
carrying an :class:`AccountQuota` as cli workers do."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from app.errors import error_body, error_headers, error_status
from pool.headroom import UNKNOWN_RESET, QuotaReserveReached, QuotaRouting
from pool.quota import AccountQuota, QuotaWindow

NOW = 1_800_000_000.0
HOUR = 3600.0


@dataclass(frozen=True)
class Spec:
    quota_reserve: float | None = None


@dataclass(frozen=True)
class Account:
    """What the rules read of a cli worker: its name, ``quota``, ``cli_spec``."""

    name: str
    quota: AccountQuota = AccountQuota()
    cli_spec: Spec = field(default_factory=Spec)


@dataclass(frozen=True)
class Remote:
    name: str  # no quota attribute at all, as remote workers


def used(name: str, five_hour: float, *, weekly: float = 0.0, reset_in: float = HOUR,
         reserve: float | None = None) -> Account:
    windows = (QuotaWindow("five_hour", five_hour, resets_at=NOW + reset_in,
                           window_seconds=5 * HOUR, seen_at=NOW),
               QuotaWindow("seven_day", weekly, resets_at=NOW + 3 * 24 * HOUR,
                           window_seconds=7 * 24 * HOUR, seen_at=NOW))
    return Account(name, AccountQuota(windows), Spec(reserve))


def names(workers: Any) -> list[str]:
    return [w.name for w in workers]


def test_the_most_headroom_wins_by_the_tightest_window() -> None:
    # b has used less of its five-hour window but its weekly window is the tighter one
    a, b, c = used("a", 50), used("b", 10, weekly=70), used("c", 30)
    assert names(QuotaRouting().roomiest([a, b, c], NOW)) == ["c"]
    # whole percents tie: the policy then chooses by load
    d = used("d", 29.6)
    assert names(QuotaRouting().roomiest([a, c, d], NOW)) == ["c", "d"]
    # a vendor's fraction times 100 is a hair off a whole percent: still that percent
    e = used("e", 0.3 * 100)  # 30.000000000000004 used: 69.99999999999999 left
    assert names(QuotaRouting().roomiest([c, e], NOW)) == ["c", "e"]


def test_unknown_counts_as_full_and_all_alike_is_untouched() -> None:
    fresh, remote = Account("fresh"), Remote("remote")
    a, b = used("a", 60), used("b", 0)
    assert names(QuotaRouting().roomiest([a, fresh, b, remote], NOW)) == ["fresh", "b", "remote"]
    assert names(QuotaRouting().roomiest([a, fresh], NOW)) == ["fresh"]
    pool = [fresh, remote, Account("other")]
    assert QuotaRouting().roomiest(pool, NOW) is pool


def test_a_window_past_its_reset_counts_as_full() -> None:
    stale = used("stale", 95, reset_in=-1)  # reported before the window reset
    assert names(QuotaRouting().roomiest([used("a", 5), stale], NOW)) == ["stale"]


def test_headroom_off_leaves_the_choice_to_the_policy() -> None:
    pool = [used("a", 90), used("b", 10)]
    assert QuotaRouting(by_headroom=False).roomiest(pool, NOW) is pool


def test_below_the_reserve_takes_no_new_conversation_but_keeps_its_own() -> None:
    low, ok = used("low", 85, reserve=20), used("ok", 50, reserve=20)
    rules = QuotaRouting()
    assert names(rules.open_to_new([low, ok], "m", None, NOW)) == ["ok"]
    assert names(rules.open_to_new([low, ok], "m", "low", NOW)) == ["low", "ok"]
    # exactly at the reserve is not below it, float noise or not
    at = used("at", 0.55 * 100, reserve=45)  # 44.99999999999999 left
    assert names(rules.open_to_new([at, ok], "m", None, NOW)) == ["at", "ok"]
    # a reserve of 0 (the default) closes nothing, not even an empty account
    assert names(rules.open_to_new([used("empty", 100), ok], "m", None, NOW)) == ["empty", "ok"]
    # unknown quota is never below a reserve
    fresh = Account("fresh", cli_spec=Spec(50))
    assert names(rules.open_to_new([fresh, low], "m", None, NOW)) == ["fresh"]


def test_the_worker_reserve_wins_over_the_model_reserve() -> None:
    a, b = used("a", 75), used("b", 75, reserve=10)
    rules = QuotaRouting(reserves={"m": 30})
    assert names(rules.open_to_new([a, b], "m", None, NOW)) == ["b"]
    assert names(rules.open_to_new([a, b], "other", None, NOW)) == ["a", "b"]


def test_every_account_below_its_reserve_is_a_refusal_until_the_earliest_reset() -> None:
    a = used("a", 90, reserve=20, reset_in=2 * HOUR)
    b = used("b", 95, reserve=20, reset_in=HOUR + 0.5)
    with pytest.raises(QuotaReserveReached) as caught:
        QuotaRouting().open_to_new([a, b], "claude-x", None, NOW)
    exc = caught.value
    assert exc.retry_after == HOUR + 1
    assert "quota_reserve" in exc.message and "'claude-x'" in exc.message
    assert error_status(exc, "openai") == 429 and error_status(exc, "anthropic") == 529
    assert error_headers(exc) == {"retry-after": str(int(HOUR + 1))}
    assert error_body(exc, "openai")["error"]["code"] == "rate_limited"
    # the holder of the conversation is kept: no refusal
    assert names(QuotaRouting().open_to_new([a, b], "claude-x", "b", NOW)) == ["b"]


def test_back_above_the_reserve_means_every_low_window_has_reset() -> None:
    # the weekly window is low too: the five-hour reset alone does not reopen it
    a = used("a", 90, weekly=85, reserve=20, reset_in=HOUR)
    with pytest.raises(QuotaReserveReached) as caught:
        QuotaRouting().open_to_new([a], "m", None, NOW)
    assert caught.value.retry_after == 3 * 24 * HOUR
    # no reset known: a minute
    blind = Account("blind", AccountQuota((QuotaWindow("counted", 99, seen_at=NOW),)), Spec(5))
    with pytest.raises(QuotaReserveReached) as caught:
        QuotaRouting().open_to_new([blind], "m", None, NOW)
    assert caught.value.retry_after == UNKNOWN_RESET
