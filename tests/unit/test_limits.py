"""The memory LimitStore with a controlled clock: minute windows, calendar budgets."""

from __future__ import annotations

import asyncio
import calendar

import pytest

from auth.limits import KeyPolicy, MemoryLimits, model_allowed

T0 = float(calendar.timegm((2026, 1, 31, 23, 59, 0)))  # a minute before a new day and month


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run(coro):
    return asyncio.run(coro)


def test_rpm_window_refuses_then_reopens() -> None:
    clock = Clock(T0)
    limits = MemoryLimits(clock)
    policy = KeyPolicy("a", rpm=2)
    assert run(limits.admit(policy)) is None
    clock.now += 10
    assert run(limits.admit(policy)) is None
    refusal = run(limits.admit(policy))
    assert refusal is not None and refusal.limit == "requests"
    assert refusal.retry_after == pytest.approx(50)
    assert refusal.window.requests_remaining == 0 and refusal.window.rpm == 2
    clock.now += 50
    assert run(limits.admit(policy)) is None


def test_tpm_is_charged_and_counts_against_the_window() -> None:
    clock = Clock(T0)
    limits = MemoryLimits(clock)
    policy = KeyPolicy("a", tpm=100)
    assert run(limits.admit(policy)) is None
    limits.charge("a", 60)
    assert run(limits.admit(policy)) is None
    limits.charge("a", 60)
    refusal = run(limits.admit(policy))
    assert refusal.limit == "tokens" and refusal.window.tokens_remaining == 0


def test_budgets_reset_at_utc_midnight_and_month_start() -> None:
    clock = Clock(T0)
    limits = MemoryLimits(clock)
    day, month = KeyPolicy("d", budget_day=10), KeyPolicy("m", budget_month=10)
    for policy in (day, month):
        assert run(limits.admit(policy)) is None
        limits.charge(policy.name, 10)
    refusal = run(limits.admit(day))
    assert refusal.limit == "budget_day" and refusal.budget == 10
    assert refusal.resets_at == calendar.timegm((2026, 2, 1, 0, 0, 0))
    assert refusal.retry_after == pytest.approx(60)
    refusal = run(limits.admit(month))
    assert refusal.limit == "budget_month"
    assert refusal.resets_at == calendar.timegm((2026, 2, 1, 0, 0, 0))
    clock.now += 61  # 1 February
    assert run(limits.admit(day)) is None and run(limits.admit(month)) is None


def test_month_budget_outlives_a_day() -> None:
    clock = Clock(float(calendar.timegm((2026, 3, 10, 12, 0, 0))))
    limits = MemoryLimits(clock)
    policy = KeyPolicy("m", budget_month=10, budget_day=100)
    run(limits.seed("m", 0, 10))
    assert run(limits.admit(policy)).limit == "budget_month"
    clock.now += 86400
    refusal = run(limits.admit(policy))
    assert refusal.limit == "budget_month"
    assert refusal.resets_at == calendar.timegm((2026, 4, 1, 0, 0, 0))


def test_forget_and_unlimited_policy() -> None:
    limits = MemoryLimits(Clock(T0))
    policy = KeyPolicy("a", rpm=1)
    assert run(limits.admit(policy)) is None
    assert run(limits.admit(policy)) is not None
    run(limits.forget("a"))
    assert run(limits.admit(policy)) is None
    assert not KeyPolicy("free").limited and KeyPolicy("x", tpm=1).limited


@pytest.mark.parametrize("patterns,model,allowed", [
    (("claude-*",), "claude-sonnet-4-6", True),
    (("claude-*",), "gpt-4o", False),
    (("claude-*", "gpt-4o-mini"), "gpt-4o-mini", True),
    (("gpt-4o-mini",), "gpt-4o-mini-2", False),
    (("*",), "anything", True),
    (("Claude-*",), "claude-x", False),
])
def test_model_globs(patterns, model, allowed) -> None:
    assert model_allowed(patterns, model) is allowed
    assert KeyPolicy("k", models=patterns).allows(model) is allowed


def test_budget_floor_never_lowered_and_refuses_alone() -> None:
    clock = Clock(T0)
    limits = MemoryLimits(clock)
    policy = KeyPolicy("a", rpm=1000, budget_day=100, budget_month=1000)
    assert limits.over_budget(policy) is None  # nothing known of the key yet
    run(limits.rebuild({"a": (120, 500)}))
    limits.raise_to("a", 50, 50)  # a lower answer (a flushed Redis) changes nothing
    assert limits.budget_used("a") == (120, 500)
    refusal = limits.over_budget(policy)
    assert refusal is not None and refusal.limit == "budget_day" and refusal.budget == 100
    assert limits.over_budget(KeyPolicy("a", rpm=1)) is None  # no budget: never refused by it
    clock.now += 60  # the next UTC day (and month): the day's floor starts again
    assert limits.budget_used("a") == (0, 0)
    assert limits.over_budget(policy) is None
