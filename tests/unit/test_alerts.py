"""``[[alerts]]`` settings are checked at load, and a full queue drops (and counts)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from app.alert_settings import AlertSettings
from app.alerts import AccountAlerts, Alerts, sign
from app.settings import ConfigError, load_settings
from pool.cli.account import AccountState


def _problems(alerts: list[dict], environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(None, environ or {}, {"alerts": alerts})
    return info.value.problems


def test_an_unknown_event_is_a_config_error_naming_it() -> None:
    problems = _problems([{"url": "https://hooks.example/x", "events": ["quota_low"]}])
    assert any(p.startswith("alerts[0].events") and "'quota_low'" in p for p in problems)


@pytest.mark.parametrize("url", ["ftp://hooks.example/x", "hooks.example/x", "http://"])
def test_a_url_must_be_http_or_https(url: str) -> None:
    problems = _problems([{"url": url, "events": ["login_failed"]}])
    assert any(p.startswith("alerts[0].url") for p in problems), problems


def test_a_secret_env_must_be_set_and_is_resolved_as_a_secret() -> None:
    alert = {"url": "http://127.0.0.1:9/x", "events": ["login_failed"], "secret_env": "HOOK_KEY"}
    assert _problems([alert]) == ["alerts[0].secret_env: environment variable HOOK_KEY is not set"]
    settings = load_settings(None, {"HOOK_KEY": "s3cret"}, {"alerts": [alert]})
    assert settings.alerts[0].secret.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)


def test_the_signature_covers_timestamp_and_body() -> None:
    assert sign(b"k", 1, b"{}") != sign(b"k", 2, b"{}") != sign(b"k", 1, b"{ }")
    assert sign(b"k", 1, b"{}").startswith("sha256=") and len(sign(b"k", 1, b"{}")) == 71


def _counted(registry: CollectorRegistry, name: str, event: str) -> float:
    return registry.get_sample_value(f"{name}_total", {"event": event}) or 0.0


def test_one_alert_per_state_and_a_full_queue_drops_and_counts() -> None:
    async def scenario() -> None:
        registry = CollectorRegistry()
        alerts = Alerts([AlertSettings(url="http://127.0.0.1:9/x", events=("key_over_budget",))],
                        registry, queue_size=1)  # not started: nothing leaves the queue
        for _ in range(3):
            alerts.notify("key_over_budget", "key", "a", "over_budget", once="day:1")
        assert alerts.receivers[0].queue.qsize() == 1
        assert _counted(registry, "poolgate_alerts_dropped", "key_over_budget") == 0
        alerts.notify("key_over_budget", "key", "b", "over_budget", once="day:1")
        assert _counted(registry, "poolgate_alerts_dropped", "key_over_budget") == 1
        alerts.notify("login_failed", "worker", "w", "login_failed", once="1")  # not subscribed
        assert alerts.receivers[0].queue.qsize() == 1
        await alerts.aclose()

    asyncio.run(scenario())


def test_near_budget_respects_each_receivers_threshold() -> None:
    async def scenario() -> None:
        alerts = Alerts([AlertSettings(url="http://127.0.0.1:9/x", events=("key_near_budget",),
                                       budget_warn_percent=90)], CollectorRegistry())
        alerts.notify("key_near_budget", "key", "a", "near_budget", once="day:1", percent=85)
        assert alerts.receivers[0].queue.qsize() == 0
        alerts.notify("key_near_budget", "key", "a", "near_budget", once="day:1", percent=95)
        alerts.notify("key_near_budget", "key", "a", "near_budget", once="day:1", percent=99)
        assert alerts.receivers[0].queue.qsize() == 1
        await alerts.aclose()

    asyncio.run(scenario())


def test_an_account_alerts_again_only_once_it_was_logged_in_again() -> None:
    async def scenario() -> None:
        alerts = Alerts([AlertSettings(url="http://127.0.0.1:9/x",
                                       events=("account_logged_out",))], CollectorRegistry())
        observer, queue = AccountAlerts(alerts), alerts.receivers[0].queue
        S = AccountState
        observer.account_changed("a", S.STARTING, S.LOGGED_OUT, {})
        observer.account_changed("a", S.LOGGED_OUT, S.LOGGING_IN, {})
        observer.account_changed("a", S.LOGGING_IN, S.STARTING, {})
        observer.account_changed("a", S.STARTING, S.LOGGED_OUT, {})  # the login failed
        assert queue.qsize() == 1  # a login attempt does not end the spell
        observer.account_changed("a", S.LOGGED_OUT, S.READY, {})
        observer.account_changed("a", S.READY, S.COOLING_DOWN, {})  # not subscribed
        observer.account_changed("a", S.COOLING_DOWN, S.LOGGED_OUT, {})
        assert queue.qsize() == 2
        first = queue.get_nowait()
        assert (first.event, first.subject, first.state) == ("account_logged_out", "a",
                                                              "logged_out")
        await alerts.aclose()

    asyncio.run(scenario())
