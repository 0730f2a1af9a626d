"""Retry-After estimated from the queue, through a real gateway and both SDKs:
behind slow requests a refusal says to come back later than 1 s."""

from __future__ import annotations

import threading
import time

import anthropic
import httpx
import openai

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

from .conftest import UPSTREAM_KEY

HOLD = 2.5  # seconds each slow request holds its slot


def test_a_saturated_pool_refuses_with_a_retry_after_from_its_hold_times(fake_upstream):
    settings = Settings(
        server=ServerSettings(api_keys={"team-a": "sk-a"}, queue_timeout=0.2, admin_token="adm",
                              metrics_public=True),
        workers=(WorkerSettings(name="w0", dialect="openai", models=("m",), api_key=UPSTREAM_KEY,
                                url=fake_upstream.url, max_in_flight=1),))
    slow = [{"role": "user", "content": f"[[sleep:{HOLD}]] hi"}]
    with ServerThread(create_app(settings)) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-a", max_retries=0) as oai, \
            anthropic.Anthropic(base_url=srv.url, api_key="sk-a", max_retries=0) as ant, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        # one slow request finishes: the gateway has now seen how long a slot is held
        oai.chat.completions.create(model="m", messages=slow)
        # the next one holds the only slot while the others arrive
        holder = threading.Thread(target=lambda: oai.chat.completions.create(model="m",
                                                                             messages=slow))
        holder.start()
        try:
            _until_in_flight(http, 1)
            try:
                oai.chat.completions.create(model="m", messages=slow)
                raise AssertionError("the OpenAI request was admitted past a full worker")
            except openai.RateLimitError as exc:
                openai_retry = int(exc.response.headers["retry-after"])
            try:
                ant.messages.create(model="m", max_tokens=16, messages=slow)
                raise AssertionError("the Anthropic request was admitted past a full worker")
            except anthropic.OverloadedError as exc:
                assert exc.status_code == 529
                anthropic_retry = int(exc.response.headers["retry-after"])
        finally:
            holder.join(timeout=30)
        held = [line for line in http.get("/metrics").text.splitlines()
                if line.startswith('poolgate_slot_hold_seconds{worker="w0"}')]
        assert held and HOLD - 0.1 <= float(held[0].rsplit(" ", 1)[1]) <= HOLD + 2, held
    # one slot turning over every ~2.5 s, nobody else queued: come back in ~3 s, not 1
    for retry in (openai_retry, anthropic_retry):
        assert 2 <= retry <= 60, retry
        assert retry <= HOLD + 2


def _until_in_flight(http: httpx.Client, n: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = http.get("/internal/stats", headers={"authorization": "Bearer adm"}).json()
        if stats["admission"]["in_flight"] >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"never saw {n} in flight")
