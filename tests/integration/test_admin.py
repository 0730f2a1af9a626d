"""Operators' endpoints: drain, resume, restart, stats."""

from __future__ import annotations

import threading

import httpx
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

from .conftest import ADMIN_TOKEN, UPSTREAM_KEY

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def two_workers(fake_upstream):
    workers = tuple(WorkerSettings(name=f"w{i}", dialect="openai", models=("m",),
                                   api_key=UPSTREAM_KEY, url=fake_upstream.url) for i in range(2))
    app = create_app(Settings(server=ServerSettings(admin_token=ADMIN_TOKEN), workers=workers))
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        yield http


def _ask(http: httpx.Client, text: str = "hi", **extra) -> httpx.Response:
    return http.post("/v1/chat/completions",
                     json={"model": "m", "messages": [{"role": "user", "content": text}], **extra})


def test_drained_worker_gets_nothing_new_while_its_stream_finishes(two_workers):
    http = two_workers
    lines: list[str] = []
    started = threading.Event()

    def slow_stream() -> None:
        # [[hang-after]] would never end; a long echo streams word by word
        body = {"model": "m", "stream": True,
                "messages": [{"role": "user", "content": "[[sleep:1]] " + "word " * 30}]}
        with http.stream("POST", "/v1/chat/completions", json=body,
                         headers={"x-session-id": "s"}) as r:
            lines.append(r.headers["x-poolgate-worker"])
            started.set()
            lines.extend(r.iter_lines())

    reader = threading.Thread(target=slow_stream)
    reader.start()
    assert started.wait(10)
    busy = lines[0]
    r = http.post(f"/internal/workers/{busy}/drain", headers=ADMIN)
    assert r.status_code == 200 and r.json()["state"] == "draining"
    served = {_ask(http).headers["x-poolgate-worker"] for _ in range(20)}
    assert served == {"w0", "w1"} - {busy}
    reader.join(timeout=30)
    assert "data: [DONE]" in lines  # the drained worker's stream finished
    assert http.post(f"/internal/workers/{busy}/resume", headers=ADMIN).json()["state"] == "ready"
    workers = {w["name"]: w for w in http.get("/internal/workers", headers=ADMIN).json()["workers"]}
    assert workers[busy]["state"] == "ready" and workers[busy]["in_flight"] == 0


def test_restart_unknown_and_unauthorised(two_workers):
    http = two_workers
    r = http.post("/internal/workers/w0/restart", headers=ADMIN)
    assert r.status_code == 200 and r.json()["state"] == "ready"
    assert _ask(http).status_code == 200
    assert http.post("/internal/workers/nope/drain", headers=ADMIN).status_code == 404
    assert http.post("/internal/workers/w0/explode", headers=ADMIN).status_code == 404
    assert http.post("/internal/workers/w0/drain").status_code == 401
    stats = http.get("/internal/stats", headers=ADMIN).json()
    assert stats["in_flight"] == {"w0": 0, "w1": 0}
