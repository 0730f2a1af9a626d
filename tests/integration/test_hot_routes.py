"""The hot inference routes, served past Starlette's router (app.hot): the
same headers as any answer, and a 500 in the caller's dialect for a failure
no route turned into an answer."""

from __future__ import annotations

import time
from typing import AsyncIterator

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings
from pool.model import ChatRequest, Event, Start
from pool.worker import Capabilities, WorkerState
from tests.support.server import ServerThread

from .conftest import CLIENT_KEY, OPENAI_MODEL


class BrokenWorker:
    """A worker with a bug: its stream raises a plain exception, not a GatewayError."""

    kind = "remote"
    capacity = 4

    def __init__(self, name: str, models: tuple[str, ...]) -> None:
        self.name = name
        self.models = models
        self.aliases: dict[str, str] = {}
        self.capabilities = Capabilities()
        self.state = WorkerState.READY

    async def stream(self, request: ChatRequest) -> AsyncIterator[Event]:
        yield Start()
        raise RuntimeError("a bug in the worker")

    async def start(self) -> None:
        pass

    async def health(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


def test_answer_headers(gateway):
    body = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30,
                   headers={"authorization": f"Bearer {CLIENT_KEY}", "x-request-id": "hot-1"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert int(r.headers["content-length"]) == len(r.content)
    assert r.headers["x-request-id"] == "hot-1"
    assert r.headers["x-poolgate-worker"] == "openai-up"
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.fixture(scope="module")
def broken():
    app = create_app(Settings(server=ServerSettings(api_keys={"t": "sk-t"})))
    with ServerThread(app) as srv:
        gw = app.state.gateway
        gw.pool.add(BrokenWorker("broken", ("bug-model",)))
        yield srv, gw


def test_unhandled_error_is_500_in_openai_dialect(broken):
    srv, gw = broken
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-t", max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.with_raw_response.create(
                model="bug-model", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 500
    assert err.value.body["type"] == "api_error" and err.value.body["code"] == "internal_error"
    assert "bug" not in err.value.response.text  # the exception's text stays in the log
    assert err.value.response.headers["x-request-id"]
    _wait_released(gw, "broken")


def test_unhandled_error_is_500_in_anthropic_dialect(broken):
    srv, gw = broken
    with anthropic.Anthropic(base_url=srv.url, api_key="sk-t", max_retries=0) as client:
        with pytest.raises(anthropic.InternalServerError) as err:
            client.messages.create(model="bug-model", max_tokens=8,
                                   messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 500
    assert err.value.body == {"type": "error", "error": {
        "type": "api_error", "message": "The gateway failed to handle this request."}}
    _wait_released(gw, "broken")


def _wait_released(gw, worker: str) -> None:
    deadline = time.monotonic() + 5
    while gw.pool.in_flight.get(worker, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gw.pool.in_flight.get(worker, 0) == 0
    assert gw.admission.in_flight(worker) == 0
