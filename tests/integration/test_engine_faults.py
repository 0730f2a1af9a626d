"""Engine faults as the client sees them (issue 15, item 2): a real gateway,
real local workers (``python -m pool.local``) on the SGLang engine in front
of the fake SGLang server, made to fail through its ``--control`` file, and
the real OpenAI and Anthropic SDKs.

The worker ``flaky`` serves ``flaky`` alone and ``tiny`` beside ``steady``: a
request for ``flaky`` shows the status a fault maps to; one for ``tiny`` shows
the fault counted as the worker's (retried on ``steady``, ``flaky`` cooled
down), while bad input stays the client's 400."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import load_settings
from tests.support.paths import REPO
from tests.support.server import ServerThread

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

HELLO = [{"role": "user", "content": "Hello there"}]
ADMIN = "admin-secret"


def sglang_worker(name: str, model_dir: str, models: list[str], *extra: str) -> dict[str, Any]:
    return {"name": name, "kind": "local", "engine": "sglang", "model": model_dir,
            "models": models, "capacity": 2, "health_interval": 1.0,
            "engine_args": {"launcher": ["-m", "tests.fakes.sglang_server"],
                            "extra_args": list(extra), "env": {"PYTHONPATH": str(REPO)},
                            "ready_timeout": 60}}


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fault") / "control.json"


@pytest.fixture(scope="module")
def srv(tiny_model: Any, control: Path) -> Iterator[ServerThread]:
    workers = [sglang_worker("flaky", tiny_model.hf_dir, ["flaky", "tiny"], "--control", str(control)),
               sglang_worker("steady", tiny_model.hf_dir, ["tiny"])]
    settings = load_settings(None, {"POOLGATE_ADMIN_TOKEN": ADMIN}, {"workers": workers, "server": {"metrics_public": True},
                                        "routing": {"cooldown_seconds": 60}})
    with ServerThread(create_app(settings), start_timeout=180) as server:
        yield server


@pytest.fixture
def fault(control: Path) -> Iterator[Any]:
    def set_fault(**how: Any) -> None:
        control.write_text(json.dumps(how))

    yield set_fault
    control.write_text("{}")


@pytest.fixture
def oai(srv: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                       timeout=60) as client:
        yield client


@pytest.fixture
def claude(srv: ServerThread) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0,
                             timeout=60) as client:
        yield client


def worker_info(srv: ServerThread, name: str) -> dict[str, Any]:
    answer = httpx.get(srv.url + "/internal/workers", headers={"authorization": f"Bearer {ADMIN}"})
    return next(w for w in answer.json()["workers"] if w["name"] == name)


def restart(srv: ServerThread, name: str) -> None:
    """Restart ``name`` through the admin API and wait until its new process is ready
    (a restarted worker owes nothing to the old one: no cooldown)."""
    before = worker_info(srv, name)
    httpx.post(srv.url + f"/internal/workers/{name}/restart",
               headers={"authorization": f"Bearer {ADMIN}"}, timeout=60).raise_for_status()
    deadline = time.monotonic() + 60
    while not ((now := worker_info(srv, name))["state"] == "ready"
               and now["restarts"] > before["restarts"]):
        assert time.monotonic() < deadline, now
        time.sleep(0.1)


def upstream_errors(srv: ServerThread, worker: str) -> float:
    text = httpx.get(srv.url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("poolgate_upstream_errors_total{") and f'worker="{worker}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("how, status, words", [
    ({"status": 503}, 503, "injected failure"),      # the engine's server cannot serve now
    ({"status": 500}, 502, "injected failure"),      # its server failed: a bad gateway
    ({"abort": 500}, 500, "injected abort"),         # generation failed
    ({"break": True}, 502, "broke off the stream"),  # the server dropped the connection
])
@pytest.mark.parametrize("stream", [False, True])
def test_engine_faults_reach_openai_clients_as_5xx(oai: openai.OpenAI, fault: Any,
                                                   how: dict[str, Any], status: int, words: str,
                                                   stream: bool) -> None:
    fault(**how)
    with pytest.raises(openai.APIStatusError) as info:
        oai.chat.completions.create(model="flaky", messages=HELLO, max_tokens=4, stream=stream)
    assert info.value.status_code == status
    error = info.value.body
    assert isinstance(error, dict)
    assert error["type"] == "api_error" and words in error["message"]
    assert info.value.response.headers["x-poolgate-worker"] == "flaky"


def test_engine_fault_reaches_anthropic_clients_as_5xx(claude: anthropic.Anthropic,
                                                       fault: Any) -> None:
    fault(status=503)
    with pytest.raises(anthropic.APIStatusError) as info:
        claude.messages.create(model="flaky", max_tokens=4, messages=HELLO)
    assert info.value.status_code == 503
    assert info.value.body["error"]["type"] == "api_error"  # type: ignore[index]


def test_engine_faults_are_retried_elsewhere_and_cool_the_worker_down(
        srv: ServerThread, oai: openai.OpenAI, fault: Any) -> None:
    restart(srv, "flaky")  # not cooling down after the tests before this one
    fault(status=503)
    before = upstream_errors(srv, "flaky")
    for i in range(8):  # different conversations: some hash to flaky, all are served
        raw = oai.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=4)
        assert raw.headers["x-poolgate-worker"] == "steady"
        assert raw.parse().choices[0].finish_reason == "length"
    # tried once, then cooled down: never again
    assert upstream_errors(srv, "flaky") - before == 1


def test_bad_input_the_engine_refuses_stays_a_400_naming_the_parameter(
        oai: openai.OpenAI, fault: Any) -> None:
    fault(status=400)
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="flaky", messages=HELLO, max_tokens=4)
    body = info.value.body
    assert isinstance(body, dict)
    assert body["type"] == "invalid_request_error" and body["param"] == "messages"
    assert info.value.response.headers["x-poolgate-worker"] == "flaky"
    # the client's fault: no retry on another worker, no cooldown
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="flaky", messages=HELLO, max_tokens=4)
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="flaky", messages=HELLO, max_tokens=10**6)
    assert info.value.body["param"] == "max_tokens"  # type: ignore[index]
    assert re.search(r"context", info.value.message)
