"""Issue 15, items 6 and 7 over real process workers: list prompts are capped and
fail as a whole (siblings cancelled, slots back), and a drained worker gets
nothing new, whether the drain came while requests queued or during a restart."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ADMIN = {"authorization": "Bearer admin-token"}


def _worker(name: str, *args: str, capacity: int = 64) -> WorkerSettings:
    return WorkerSettings(name=name, kind="process", models=("echo",), cwd=str(REPO),
                          command=(sys.executable, "-m", "tests.fakes.echo_worker", *args),
                          max_in_flight=capacity, backoff_initial=0.2, backoff_max=2.0,
                          health_interval=0.5, health_timeout=1.0, stop_timeout=3.0)


def _serve(*workers: WorkerSettings, **server: object) -> ServerThread:
    settings = Settings(server=ServerSettings(admin_token="admin-token", **server),
                        workers=workers)
    return ServerThread(create_app(settings))


def _wait(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _admission(http: httpx.Client) -> dict:
    return http.get("/internal/stats", headers=ADMIN).json()["admission"]


def _info(http: httpx.Client, name: str) -> dict:
    workers = http.get("/internal/workers", headers=ADMIN).json()["workers"]
    return next(w for w in workers if w["name"] == name)


def _state(http: httpx.Client, name: str) -> str:
    return _info(http, name)["state"]


def _chat(text: str, **extra: object) -> dict:
    return {"model": "echo", "messages": [{"role": "user", "content": text}], **extra}


# --- item 6: fan-out -----------------------------------------------------------------


def test_a_list_prompt_over_the_cap_is_a_400_naming_prompt():
    with _serve(_worker("p0")) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model="echo", prompt=["hi"] * 129)
        assert caught.value.body["param"] == "prompt"
        assert "128" in caught.value.body["message"]
        out = client.completions.create(model="echo", prompt=["a", "b"] * 64)
        assert [c.text for c in out.choices][:2] == ["echo: a", "echo: b"]
        assert len(out.choices) == 128


def test_a_failing_prompt_cancels_its_queued_siblings(tmp_path):
    # one slot: the first prompt runs and fails, the others queue for the slot; they
    # must be cancelled with it, not admitted later to do work nobody will read
    log = tmp_path / "child.log"
    with _serve(_worker("p0", "--log", str(log), capacity=1), queue_timeout=30) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        r = http.post("/v1/completions", json={
            "model": "echo", "prompt": ["[[error:400]]", "[[sleep:0.5]] b c", "[[sleep:0.5]] d"]})
        assert r.status_code == 400
        stats = _admission(http)
        assert (stats["in_flight"], stats["waiting"]) == (0, 0)
        time.sleep(1.0)
        assert not log.exists() or "event" not in log.read_text()


# --- item 7: drained means drained ------------------------------------------------------------


def test_a_request_queued_before_a_drain_is_not_granted_the_drained_worker():
    with _serve(_worker("p0", capacity=1), _worker("p1", capacity=1),
                queue_timeout=30) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        streams, names = [], []
        for _ in range(2):
            cm = http.stream("POST", "/v1/chat/completions",
                             json=_chat("[[forever]]", stream=True))
            response = cm.__enter__()
            streams.append(cm)
            names.append(response.headers["x-poolgate-worker"])
        assert sorted(names) == ["p0", "p1"]
        admitted = _admission(http)["admitted"]
        outcome: dict = {}

        def queued() -> None:
            outcome["response"] = http.post("/v1/chat/completions", json=_chat("queued"))

        thread = threading.Thread(target=queued)
        thread.start()
        try:
            _wait(lambda: _admission(http)["waiting"] == 1)
            drained = names[0]
            assert http.post(f"/internal/workers/{drained}/drain", headers=ADMIN).status_code == 200
            streams[0].__exit__(None, None, None)  # the drained worker's slot comes free
            _wait(lambda: _admission(http)["in_flight"] == 1)
            time.sleep(0.3)
            assert thread.is_alive() and _admission(http)["waiting"] == 1
            assert _admission(http)["admitted"] == admitted  # not granted, not even once
        finally:
            streams[1].__exit__(None, None, None)
            thread.join(30)
        response = outcome["response"]
        assert response.status_code == 200
        assert response.headers["x-poolgate-worker"] == names[1]
        assert _admission(http)["admitted"] == admitted + 1


def test_a_drain_during_a_restart_holds_after_it():
    with _serve(_worker("p0"), _worker("p1")) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as http:
        # a slow answer on p0, so its restart waits for it (the window a drain can land in)
        assert http.post("/internal/workers/p1/drain", headers=ADMIN).status_code == 200
        slow: dict = {}

        def ask_slowly() -> None:
            slow["r"] = http.post("/v1/chat/completions",
                                  json=_chat("[[sleep:0.3]] a b c d e f"))

        asking = threading.Thread(target=ask_slowly)
        asking.start()
        _wait(lambda: _admission(http)["in_flight"] == 1)
        assert http.post("/internal/workers/p1/resume", headers=ADMIN).status_code == 200
        done: dict = {}

        def restart() -> None:
            done["status"] = http.post("/internal/workers/p0/restart", headers=ADMIN).status_code

        restarting = threading.Thread(target=restart)
        restarting.start()
        _wait(lambda: _state(http, "p0") == "draining")  # the restart waits for the answer
        assert http.post("/internal/workers/p0/drain", headers=ADMIN).status_code == 200
        asking.join(30)
        restarting.join(30)
        assert slow["r"].headers["x-poolgate-worker"] == "p0" and done["status"] == 200
        _wait(lambda: _state(http, "p0") in ("ready", "draining")  # the new process is up
              and _info(http, "p0")["restarts"] >= 1)
        assert _state(http, "p0") == "draining"
        served = {http.post("/v1/chat/completions", json=_chat(f"n{i}")).headers[
            "x-poolgate-worker"] for i in range(8)}
        assert served == {"p1"}
        assert http.post("/internal/workers/p0/resume", headers=ADMIN).status_code == 200
        assert _state(http, "p0") == "ready"
