"""``[[alerts]]`` through a real poolgate to a real HTTP receiver on
127.0.0.1: a key over budget alerts once however many requests it refuses,
signed with the secret; a cli account that is logged out alerts once while it
stays so; a receiver that is down for a while gets the alert once it is back,
exactly once."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from app.alert_settings import AlertSettings
from app.factory import create_app
from app.key_settings import BudgetSettings, KeySettings
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.idp import FakeIdP
from tests.fakes.upstreams import FakeUpstream
from tests.support.alert_receiver import AlertReceiver, verify
from tests.support.cli_accounts import claude_home, fake_claude_worker
from tests.support.server import ServerThread

from .conftest import ADMIN_TOKEN, OPENAI_MODEL, UPSTREAM_KEY

REPO = Path(__file__).resolve().parents[2]

SECRET = "whsec-test-secret"
KEYS = {"capped": KeySettings(secret="sk-capped", budget_tokens=BudgetSettings(day=5))}


@pytest.fixture
def receiver() -> Iterator[AlertReceiver]:
    hook = AlertReceiver()
    try:
        yield hook
    finally:
        hook.close()


def _gateway(receiver: AlertReceiver, workers: tuple[WorkerSettings, ...],
             events: tuple[str, ...], **alert: object) -> ServerThread:
    return ServerThread(create_app(Settings(
        server=ServerSettings(keys=KEYS, metrics_public=True, admin_token=ADMIN_TOKEN),
        workers=workers,
        alerts=(AlertSettings(url=receiver.url, events=events, secret=SECRET,
                              secret_env="UNUSED_IN_TESTS", **alert),))))


def _upstream(fake: FakeUpstream) -> tuple[WorkerSettings, ...]:
    return (WorkerSettings(name="openai-up", dialect="openai", url=fake.url,
                           api_key=UPSTREAM_KEY, models=(OPENAI_MODEL,)),)


def _spend_and_be_refused(url: str, refusals: int) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-capped", max_retries=0)
    try:
        client.chat.completions.create(model=OPENAI_MODEL, messages=[
            {"role": "user", "content": "spend the whole budget " * 5}])
        for _ in range(refusals):
            with pytest.raises(openai.RateLimitError):
                client.chat.completions.create(model=OPENAI_MODEL,
                                               messages=[{"role": "user", "content": "hi"}])
    finally:
        client.close()


def _metric(url: str, name: str, event: str) -> float:
    text = httpx.get(url + "/metrics").text
    found = re.search(rf'^{name}_total\{{event="{event}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_key_over_budget_alerts_once_signed(fake_upstream: FakeUpstream,
                                              receiver: AlertReceiver) -> None:
    receiver.listen()
    with _gateway(receiver, _upstream(fake_upstream),
                  ("key_over_budget", "key_near_budget")) as srv:
        _spend_and_be_refused(srv.url, refusals=5)
        receiver.wait(lambda: len(receiver.alerts("key_over_budget")) >= 1
                      and len(receiver.alerts("key_near_budget")) >= 1)
        time.sleep(1.0)  # room for any duplicate to arrive
        over = receiver.alerts("key_over_budget")
        assert len(over) == 1, over  # five refusals, one alert
        assert over[0]["key"] == "capped" and over[0]["state"] == "over_budget"
        assert over[0]["details"]["budget"] == "daily"
        assert over[0]["details"]["budget_tokens"] == 5
        assert len(receiver.alerts("key_near_budget")) == 1
        for headers, body in receiver.posts():
            assert verify(SECRET, headers, body), headers
            assert not verify("another-secret", headers, body)
            assert SECRET.encode() not in body and b"sk-capped" not in body
            assert headers["content-type"] == "application/json"
        assert _metric(srv.url, "poolgate_alerts_sent", "key_over_budget") == 1
        assert _metric(srv.url, "poolgate_alerts_failed", "key_over_budget") == 0


def test_a_receiver_down_for_a_while_gets_the_alert_once_back(
        fake_upstream: FakeUpstream, receiver: AlertReceiver) -> None:
    # not listening yet: every attempt is refused until it is
    with _gateway(receiver, _upstream(fake_upstream), ("key_over_budget",),
                  retry_initial=0.2, retry_max=0.5, max_attempts=30) as srv:
        _spend_and_be_refused(srv.url, refusals=3)
        time.sleep(1.5)  # several attempts refused meanwhile
        assert receiver.posts() == []
        assert _metric(srv.url, "poolgate_alerts_sent", "key_over_budget") == 0
        receiver.listen()
        receiver.wait(lambda: len(receiver.alerts()) >= 1)
        time.sleep(1.5)  # a second delivery would have come by now
        alerts = receiver.alerts()
        assert [a["event"] for a in alerts] == ["key_over_budget"], alerts
        assert verify(SECRET, *receiver.posts()[0])  # signed at the attempt that got through
        assert _metric(srv.url, "poolgate_alerts_sent", "key_over_budget") == 1
        assert _metric(srv.url, "poolgate_alerts_failed", "key_over_budget") == 0


@pytest.mark.slow
def test_a_logged_out_account_alerts_once_while_it_stays_so(
        tmp_path: Path, receiver: AlertReceiver) -> None:
    receiver.listen()
    with FakeUpstream(models=("claude-sonnet-4-6",)) as upstream:
        # an empty home: the fake Claude Code has no credentials, the account is logged out
        worker = fake_claude_worker("claude-a", tmp_path / "a", upstream.anthropic_url,
                                    tmp_path / "a.log")
        with _gateway(receiver, (worker,), ("account_logged_out", "account_cooling_down")):
            receiver.wait(lambda: len(receiver.alerts("account_logged_out")) >= 1, timeout=60)
            time.sleep(5)  # several ticks and a probe of the refused account meanwhile
            alerts = receiver.alerts()
            assert len(alerts) == 1, alerts
            assert alerts[0]["worker"] == "claude-a" and alerts[0]["state"] == "logged_out"
            assert verify(SECRET, *receiver.posts()[0])


@pytest.mark.slow
def test_a_crash_looping_worker_alerts_once(receiver: AlertReceiver) -> None:
    receiver.listen()
    broken = WorkerSettings(
        name="broken", kind="process", models=("echo",), cwd=str(REPO),
        command=(sys.executable, "-m", "tests.fakes.echo_worker", "--crash-at-start"),
        backoff_initial=0.2, backoff_max=0.5, health_interval=0.5, health_timeout=1.0,
        stop_timeout=3.0)
    with _gateway(receiver, (broken,), ("worker_crash_looping",)):
        receiver.wait(lambda: len(receiver.alerts()) >= 1, timeout=60)
        time.sleep(4)  # it goes on crashing meanwhile
        alerts = receiver.alerts()
        assert len(alerts) == 1, alerts
        assert alerts[0]["event"] == "worker_crash_looping" and alerts[0]["worker"] == "broken"


@pytest.mark.slow
def test_a_login_that_ends_at_its_deadline_alerts_login_failed(
        tmp_path: Path, receiver: AlertReceiver) -> None:
    receiver.listen()
    with FakeUpstream(models=("claude-sonnet-4-6",)) as upstream, \
            FakeIdP({"alice@example.com": "pw-alice"}) as idp:
        worker = fake_claude_worker("claude-a", tmp_path / "a", upstream.anthropic_url,
                                    tmp_path / "a.log", env={"FAKE_CLAUDE_OAUTH_URL": idp.url},
                                    login_timeout=2)
        with _gateway(receiver, (worker,), ("login_failed",)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http:
            admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
            receiver.wait(lambda: http.get("/internal/workers/claude-a/login", headers=admin)
                          .json()["login"] == "logged_out", timeout=60)
            started = http.post("/internal/workers/claude-a/login", headers=admin,
                                json={"auto": False})
            assert started.status_code == 202, started.text
            receiver.wait(lambda: len(receiver.alerts()) >= 1, timeout=30)
            time.sleep(1)
            alerts = receiver.alerts()
            assert [(a["event"], a["worker"]) for a in alerts] == [("login_failed", "claude-a")]
            assert alerts[0]["details"]["reason"] == "timeout"
            # an operator's cancel is not a failure
            again = http.post("/internal/workers/claude-a/login", headers=admin,
                              json={"auto": False})
            assert again.status_code == 202, again.text
            assert http.delete("/internal/workers/claude-a/login", headers=admin).status_code == 200
            time.sleep(1)
            assert len(receiver.alerts()) == 1, receiver.alerts()


@pytest.mark.slow
def test_a_rate_limited_account_alerts_cooling_down_once(tmp_path: Path,
                                                          receiver: AlertReceiver) -> None:
    receiver.listen()
    with FakeUpstream(models=("claude-sonnet-4-6",)) as upstream:
        worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", "sk-ant-oat01-fake"),
                                    upstream.anthropic_url, tmp_path / "a.log",
                                    env={"FAKE_CLAUDE_FAULT": "rate-limited"})
        with _gateway(receiver, (worker,), ("account_cooling_down", "account_logged_out")) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-capped", max_retries=0)
            try:
                for n in range(4):  # the first meets the vendor's limit, the rest the cool-down
                    with pytest.raises(openai.APIStatusError):
                        client.chat.completions.create(model="claude-sonnet-4-6", messages=[
                            {"role": "user", "content": f"question {n}"}])
            finally:
                client.close()
            receiver.wait(lambda: len(receiver.alerts()) >= 1, timeout=30)
            time.sleep(3)  # ticks meanwhile
            alerts = receiver.alerts()
            assert [(a["event"], a["worker"], a["state"]) for a in alerts] == [
                ("account_cooling_down", "claude-a", "cooling_down")], alerts
            assert alerts[0]["details"]["cooldown_until"] > time.time() + 1700
