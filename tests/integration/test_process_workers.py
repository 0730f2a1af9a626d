"""Process workers behind a real poolgate: supervised children serve the SDKs,
survive kill -9 mid-stream, and are driven from /internal/*."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread
from tests.support.server_http import with_server_http

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ADMIN = {"authorization": "Bearer admin-token"}


def _process_worker(name: str, *args: str) -> WorkerSettings:
    return WorkerSettings(name=name, kind="process", models=("echo",), cwd=str(REPO),
                          command=(sys.executable, "-m", "tests.fakes.echo_worker", *args),
                          backoff_initial=0.2, backoff_max=2.0, health_interval=0.5,
                          health_timeout=1.0, stop_timeout=3.0)


@pytest.fixture
def gateway():
    settings = Settings(server=ServerSettings(admin_token="admin-token"),
                        workers=(_process_worker("p0"), _process_worker("p1")))
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        yield srv, http


def _workers(http: httpx.Client) -> dict[str, dict]:
    return {w["name"]: w for w in http.get("/internal/workers", headers=ADMIN).json()["workers"]}


def _wait(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sdks_through_process_workers(gateway):
    srv, http = gateway
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as oai:
        out = oai.chat.completions.create(model="echo",
                                          messages=[{"role": "user", "content": "hello child"}])
        assert out.choices[0].message.content == "echo: hello child"
    with anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0) as ant:
        with ant.messages.stream(model="echo", max_tokens=32,
                                 messages=[{"role": "user", "content": "streamed child"}]) as s:
            assert "".join(s.text_stream) == "echo: streamed child"
    workers = _workers(http)
    assert {w["kind"] for w in workers.values()} == {"process"}
    assert all(w["pid"] and w["state"] == "ready" for w in workers.values())


def test_kill_9_mid_stream_then_back_and_serving(gateway):
    srv, http = gateway
    body = {"model": "echo", "stream": True,
            "messages": [{"role": "user", "content": "[[forever]] go"}]}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        name = r.headers["x-poolgate-worker"]
        pid = _workers(http)[name]["pid"]
        lines = []
        for line in r.iter_lines():
            lines.append(line)
            if len(lines) == 4:
                os.kill(pid, signal.SIGKILL)
    # the client got an error frame in its dialect, then the terminal event
    frames = [line for line in lines if line.startswith("data: ")]
    assert '"error"' in frames[-2] and frames[-1] == "data: [DONE]"
    _wait(lambda: _workers(http)[name]["pid"] not in (None, pid)
          and _workers(http)[name]["state"] == "ready")
    assert _workers(http)[name]["restarts"] >= 1
    r = http.post("/v1/chat/completions",
                  json={"model": "echo", "messages": [{"role": "user", "content": "again"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "echo: again"


def test_sigstop_worker_is_replaced_and_requests_go_elsewhere(gateway):
    srv, http = gateway
    victim = "p0"
    pid = _workers(http)[victim]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        _wait(lambda: _workers(http)[victim]["state"] != "ready", timeout=10)
        served = {http.post("/v1/chat/completions", json={
            "model": "echo", "messages": [{"role": "user", "content": f"n{i}"}]}
        ).headers["x-poolgate-worker"] for i in range(10)}
        assert served == {"p1"}
        _wait(lambda: _workers(http)[victim]["state"] == "ready"
              and _workers(http)[victim]["pid"] != pid, timeout=20)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_crash_looping_worker_while_the_other_serves():
    settings = Settings(server=ServerSettings(admin_token="admin-token"), workers=(
        _process_worker("broken", "--crash-at-start"), _process_worker("fine")))
    with ServerThread(create_app(settings)) as srv, httpx.Client(base_url=srv.url) as http:
        _wait(lambda: _workers(http)["broken"]["crash_looping"], timeout=30)
        r = http.post("/v1/chat/completions",
                      json={"model": "echo", "messages": [{"role": "user", "content": "ok"}]})
        assert r.status_code == 200 and r.headers["x-poolgate-worker"] == "fine"
        assert http.get("/readyz").status_code == 200  # the model still has a ready worker


def test_restart_from_admin_replaces_the_process(gateway):
    srv, http = gateway
    pid = _workers(http)["p1"]["pid"]
    assert http.post("/internal/workers/p1/restart", headers=ADMIN).status_code == 200
    _wait(lambda: _workers(http)["p1"]["pid"] not in (None, pid)
          and _workers(http)["p1"]["state"] == "ready")


def test_sigkilled_gateway_leaves_no_worker_behind(tmp_path):
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "poolgate.toml"
    command = ", ".join(f'"{part}"' for part in (sys.executable, "-m", "tests.fakes.echo_worker"))
    config.write_text(f"""
[server]
port = {port}
log_level = "warning"

[[workers]]
name = "a"
kind = "process"
models = ["echo"]
cwd = "{REPO}"
command = [{command}]

[[workers]]
name = "b"
kind = "process"
models = ["echo"]
cwd = "{REPO}"
command = [{command}]
""")
    env = {**os.environ, "POOLGATE_ADMIN_TOKEN": "admin-token"}
    gateway = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--config", str(config)],
                               cwd=REPO, env=with_server_http(env), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(base + "/readyz").status_code == 200
            except httpx.TransportError:
                return False

        _wait(ready, timeout=30)
        pids = [w["pid"] for w in httpx.get(base + "/internal/workers",
                                            headers=ADMIN).json()["workers"]]
        assert len(pids) == 2 and all(pids)
        gateway.kill()  # SIGKILL: no shutdown code runs in the gateway
        gateway.wait(timeout=10)

        def gone(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            # a zombie is gone too: it no longer runs (its parent died, init reaps it)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().split(") ", 1)[1].startswith("Z")
            except FileNotFoundError:
                return True

        _wait(lambda: all(gone(pid) for pid in pids), timeout=10)
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait()


def test_the_example_worker_serves_both_dialects():
    settings = Settings(server=ServerSettings(), workers=(WorkerSettings(
        name="reverser", kind="process", models=("reverse",), cwd=str(REPO),
        command=(sys.executable, "examples/reverse_worker.py")),))
    with ServerThread(create_app(settings)) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as oai, \
            anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0) as ant:
        out = oai.chat.completions.create(model="reverse",
                                          messages=[{"role": "user", "content": "a b c"}])
        assert out.choices[0].message.content == "c b a "
        msg = ant.messages.create(model="reverse", max_tokens=2,
                                  messages=[{"role": "user", "content": "a b c"}])
        assert msg.content[0].text == "c b " and msg.stop_reason == "max_tokens"
        with pytest.raises(openai.BadRequestError) as err:  # a worker's error crosses the pipe
            oai.chat.completions.create(model="reverse",
                                        messages=[{"role": "system", "content": "x"}])
        assert err.value.body["param"] == "messages"
