"""Remote workers joining and leaving at run time, over a real gateway with the
real SDKs: ``POST /internal/workers`` registers a worker pointing at a fake
upstream, ``DELETE /internal/workers/{name}`` drains it (its stream finishes)
and takes it out (its model 404s); ``poolgate join`` does the POST."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import load_settings
from tests.fakes.upstreams import FakeUpstream
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ADMIN_TOKEN = "admin-token-for-joins"
CLIENT_KEY = "sk-client-joins"
UPSTREAM_SECRET = "sk-upstream-joins-0123456789"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
METRICS_TOKEN = "metrics-token-for-joins"
CONFIG_MODEL = "config-model"
JOINED = {"name": "joined", "dialect": "openai", "models": ["joined-model"],
          "aliases": {"jm": "joined-model"}, "api_key_env": "UPSTREAM_SECRET"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=UPSTREAM_SECRET,
                      models=(CONFIG_MODEL, "joined-model", "claude-joined")) as upstream:
        yield upstream


@pytest.fixture
def gateway(fake: FakeUpstream) -> Iterator[tuple[httpx.Client, Any]]:
    environ = {"POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN, "POOLGATE_API_KEYS": f"team={CLIENT_KEY}",
               "POOLGATE_METRICS_TOKEN": METRICS_TOKEN,
               "UPSTREAM_SECRET": UPSTREAM_SECRET}
    settings = load_settings(None, environ, {
        "server": {"port": 0, "runtime_secret_envs": ["UPSTREAM_SECRET"]},
        "workers": [{"name": "config-worker", "dialect": "openai", "url": fake.url,
                     "models": [CONFIG_MODEL], "api_key_env": "UPSTREAM_SECRET"}]})
    app = create_app(settings)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        yield http, app.state.gateway


def _sdk(http: httpx.Client) -> openai.OpenAI:
    return closed_at_end(openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key=CLIENT_KEY,
                                       max_retries=0))


def _workers(http: httpx.Client) -> dict[str, dict[str, Any]]:
    r = http.get("/internal/workers", headers=ADMIN)
    assert r.status_code == 200
    return {w["name"]: w for w in r.json()["workers"]}


def _register(http: httpx.Client, fake: FakeUpstream, **changes: Any) -> httpx.Response:
    return http.post("/internal/workers", headers=ADMIN, json={**JOINED, "url": fake.url, **changes})


def test_a_registered_worker_serves_both_sdks_and_is_listed(gateway, fake) -> None:
    http, gw = gateway
    r = _register(http, fake)
    assert r.status_code == 201, r.text
    joined = r.json()
    assert (joined["name"], joined["kind"], joined["state"], joined["source"]) == (
        "joined", "remote", "ready", "registered")
    assert UPSTREAM_SECRET not in r.text
    workers = _workers(http)
    assert workers["joined"]["models"] == ["joined-model"]
    assert workers["config-worker"]["source"] == "config"

    sdk = _sdk(http)
    assert {"joined-model", "jm", CONFIG_MODEL} <= {m.id for m in sdk.models.list().data}
    raw = sdk.chat.completions.with_raw_response.create(
        model="jm", messages=[{"role": "user", "content": "hello joined"}])
    assert raw.headers["x-poolgate-worker"] == "joined"
    assert raw.parse().choices[0].message.content == "echo: hello joined"
    assert fake.last.headers["authorization"] == f"Bearer {UPSTREAM_SECRET}"  # api_key_env

    claude = closed_at_end(anthropic.Anthropic(base_url=str(http.base_url), api_key=CLIENT_KEY,
                                               max_retries=0))
    message = claude.messages.create(model="joined-model", max_tokens=50,
                                     messages=[{"role": "user", "content": "via anthropic"}])
    assert message.content[0].text == "echo: via anthropic"

    # the metrics see it: its state, and the requests it served
    metrics = http.get("/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"}).text
    assert 'poolgate_worker_state{state="ready",worker="joined"} 1.0' in metrics
    assert 'worker="joined"' in metrics.split("poolgate_requests_total", 1)[1]
    assert gw.admission.stats()["by_worker"] == {}


def test_bad_registrations_are_refused_naming_the_field_and_change_nothing(gateway, fake) -> None:
    http, gw = gateway
    before = _workers(http)
    cases = [
        ({"api_key": "sk-very-secret-value"}, 400, "api_key"),
        ({"command": ["rm"]}, 400, "command"),
        ({"url": "ftp://nowhere"}, 400, "url"),
        ({"api_key_env": "NOT_SET_ANYWHERE"}, 400, "api_key_env"),
        ({"kind": "cli"}, 400, "kind"),
        ({"models": []}, 400, None),
        ({"aliases": {"jm": "other"}}, 400, None),
        ({"name": "config-worker"}, 409, "name"),
        ({"aliases": {CONFIG_MODEL: "joined-model"}}, 409, "models"),
    ]
    for change, status, param in cases:
        r = _register(http, fake, **change)
        assert r.status_code == status, (change, r.text)
        error = r.json()["error"]
        if param is not None:
            assert error["param"] == param, (change, error)
        assert "sk-very-secret-value" not in r.text
    assert http.post("/internal/workers", json={**JOINED, "url": fake.url}).status_code == 401
    assert http.post("/internal/workers", headers=ADMIN, content=b"[1]").status_code == 400
    assert _workers(http).keys() == before.keys()
    assert _register(http, fake).status_code == 201
    again = _register(http, fake)
    assert again.status_code == 409 and again.json()["error"]["param"] == "name"
    assert gw.runtime_workers.store is not None
    assert len(gw.pool.workers) == 2


def test_delete_drains_a_stream_in_flight_then_its_model_is_gone(gateway, fake) -> None:
    http, gw = gateway
    assert _register(http, fake).status_code == 201
    sdk = _sdk(http)
    text: list[str] = []
    finished: list[float] = []
    reasons: list[str | None] = []

    def read_stream() -> None:
        stream = sdk.chat.completions.create(
            model="joined-model", stream=True,
            messages=[{"role": "user", "content": "[[sleep:1.5]] " + "word " * 40}])
        for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                reasons.append(chunk.choices[0].finish_reason)
        finished.append(time.monotonic())

    reader = threading.Thread(target=read_stream)
    reader.start()
    deadline = time.monotonic() + 10
    while _workers(http)["joined"]["in_flight"] != 1:
        assert time.monotonic() < deadline, "the stream never went in flight"
        time.sleep(0.02)
    asked = time.monotonic()
    gone = http.delete("/internal/workers/joined", headers=ADMIN)
    waited = time.monotonic() - asked
    reader.join(timeout=30)
    assert gone.status_code == 200 and gone.json() == {"name": "joined", "removed": True}
    # DELETE waited for the stream: the upstream holds it 1.5 s after it went in flight
    assert finished and waited > 1.0
    assert "".join(text) == "echo: " + " ".join(["word"] * 40) and reasons[-1] == "stop"

    with pytest.raises(openai.NotFoundError) as exc_info:
        sdk.chat.completions.create(model="joined-model",
                                    messages=[{"role": "user", "content": "anyone?"}])
    assert exc_info.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="jm", messages=[{"role": "user", "content": "?"}])
    assert "joined-model" not in {m.id for m in sdk.models.list().data}
    assert "joined" not in _workers(http)
    assert "joined" not in gw.pool.in_flight and gw.admission.stats()["by_worker"] == {}
    # the config worker kept serving throughout, and the name can be registered again
    assert sdk.chat.completions.create(
        model=CONFIG_MODEL, messages=[{"role": "user", "content": "still here"}]
    ).choices[0].message.content == "echo: still here"
    assert _register(http, fake).status_code == 201


def test_delete_refusals_and_a_drain_that_outlasts_the_wait(gateway, fake) -> None:
    http, _gw = gateway
    r = http.delete("/internal/workers/config-worker", headers=ADMIN)
    assert r.status_code == 409 and r.json()["error"]["code"] == "worker_read_only"
    assert http.delete("/internal/workers/nobody", headers=ADMIN).status_code == 404
    assert http.delete("/internal/workers/config-worker").status_code == 401
    assert _register(http, fake).status_code == 201
    assert http.delete("/internal/workers/joined?timeout=soon", headers=ADMIN).status_code == 400

    done = threading.Event()

    def slow() -> None:
        _sdk(http).chat.completions.create(
            model="joined-model", messages=[{"role": "user", "content": "[[sleep:1.5]] late"}])
        done.set()

    reader = threading.Thread(target=slow)
    reader.start()
    deadline = time.monotonic() + 10
    while _workers(http)["joined"]["in_flight"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = http.delete("/internal/workers/joined?timeout=0", headers=ADMIN)
    assert r.status_code == 202 and r.json()["state"] == "draining", r.text
    assert _workers(http)["joined"]["state"] == "draining"
    resumed = http.post("/internal/workers/joined/resume", headers=ADMIN)
    assert resumed.status_code == 409  # a leaving worker does not come back
    again = _register(http, fake)
    assert again.status_code == 409 and again.json()["error"]["code"] == "worker_leaving"
    with pytest.raises(openai.RateLimitError, match="is ready"):  # draining: nothing new
        _sdk(http).chat.completions.create(model="joined-model",
                                           messages=[{"role": "user", "content": "x"}])
    reader.join(timeout=30)
    assert done.is_set()
    deadline = time.monotonic() + 10
    while "joined" in _workers(http):
        assert time.monotonic() < deadline, "the drained worker never left"
        time.sleep(0.05)
    assert _register(http, fake).status_code == 201  # once it has left, the name is free


def test_poolgate_join_registers_through_the_admin_endpoint(gateway, fake) -> None:
    http, _gw = gateway
    argv = [sys.executable, "-m", "app.cli", "join", "--gateway", str(http.base_url),
            "--name", "claude-up", "--dialect", "anthropic", "--url", fake.anthropic_url,
            "--model", "claude-joined", "--alias", "cj=claude-joined",
            "--api-key-env", "UPSTREAM_SECRET", "--wait", "5"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOLGATE_")}

    def run(extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env={**env, **extra_env}, cwd=REPO, capture_output=True,
                              text=True, timeout=60)

    refused = run({})
    assert refused.returncode == 2 and "POOLGATE_ADMIN_TOKEN" in refused.stdout
    joined = run({"POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN})
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert "claude-up joined (ready)" in joined.stdout
    again = run({"POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN})
    assert again.returncode == 0 and "already registered" in again.stdout
    wrong = run({"POOLGATE_ADMIN_TOKEN": "not-the-token"})
    assert wrong.returncode == 1 and "refused (401)" in wrong.stdout
    closed = subprocess.run(
        [*argv[:argv.index("--gateway") + 1], f"http://127.0.0.1:{free_port()}",
         *argv[argv.index("--gateway") + 2:-1], "0"],
        env={**env, "POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN}, cwd=REPO, capture_output=True,
        text=True, timeout=60)
    assert closed.returncode == 1 and "cannot reach" in closed.stdout
    worker = _workers(http)["claude-up"]
    assert worker["aliases"] == {"cj": "claude-joined"} and worker["source"] == "registered"
    claude = closed_at_end(anthropic.Anthropic(base_url=str(http.base_url), api_key=CLIENT_KEY,
                                               max_retries=0))
    reply = claude.messages.create(model="cj", max_tokens=20,
                                   messages=[{"role": "user", "content": "joined by cli"}])
    assert reply.content[0].text == "echo: joined by cli"
