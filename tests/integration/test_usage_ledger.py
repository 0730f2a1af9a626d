"""The usage ledger through ``GET /internal/usage`` and ``/metrics``, and its
survival of a SIGKILL of a real ``poolgate serve`` process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.key_settings import KeySettings
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.ports import free_port
from tests.support.server import ServerThread
from tests.support.server_http import with_server_http

from .conftest import ADMIN_TOKEN, ANTHROPIC_MODEL, METRICS_TOKEN, OPENAI_MODEL, UPSTREAM_KEY

REPO = Path(__file__).resolve().parents[2]
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
ROW_FIELDS = {"requests", "input_tokens", "output_tokens", "cached_tokens", "errors"}


@pytest.fixture(scope="module")
def gateway(fake_upstream):
    settings = Settings(
        server=ServerSettings(keys={"a": KeySettings(secret="sk-a"),
                                    "b": KeySettings(secret="sk-b", models=("claude-*",)),
                                    "c": KeySettings(secret="sk-c")},
                              admin_token=ADMIN_TOKEN, metrics_token=METRICS_TOKEN),
        workers=(WorkerSettings(name="openai-up", dialect="openai", url=fake_upstream.url,
                                api_key=UPSTREAM_KEY, models=(OPENAI_MODEL,)),
                 WorkerSettings(name="anthropic-up", dialect="anthropic",
                                url=fake_upstream.anthropic_url, api_key=UPSTREAM_KEY,
                                models=(ANTHROPIC_MODEL,))))
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        yield srv.url, http


def _chat(http: httpx.Client, key: str, model: str, text: str = "hi", **extra) -> httpx.Response:
    return http.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                     json={"model": model, "messages": [{"role": "user", "content": text}],
                           **extra})


def _usage(http: httpx.Client, **params) -> dict:
    r = http.get("/internal/usage", params=params, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def test_usage_rows_grouped_and_filtered(gateway):
    url, http = gateway
    since = int(time.time())
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-a", max_retries=0) as a:
        first = a.chat.completions.create(model=OPENAI_MODEL,
                                          messages=[{"role": "user", "content": "one two"}])
        streamed = list(a.chat.completions.create(
            model=ANTHROPIC_MODEL, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "three"}]))
    assert _chat(http, "sk-b", OPENAI_MODEL).status_code == 404  # outside b's models
    assert _chat(http, "sk-b", ANTHROPIC_MODEL).status_code == 200

    body = _usage(http, since=since)
    assert body["since"] == since and body["until"] is None
    assert body["group_by"] == ["key", "model", "day"]
    today = time.strftime("%Y-%m-%d", time.gmtime())
    rows = {(r["key"], r["model"]): r for r in body["rows"]}
    for row in rows.values():
        assert set(row) == {"key", "key_id", "model", "day"} | ROW_FIELDS and row["day"] == today
    a_openai = rows[("a", OPENAI_MODEL)]
    assert a_openai["requests"] == 1 and a_openai["errors"] == 0
    assert a_openai["input_tokens"] == first.usage.prompt_tokens
    assert a_openai["output_tokens"] == first.usage.completion_tokens
    usage = streamed[-1].usage
    a_claude = rows[("a", ANTHROPIC_MODEL)]
    assert (a_claude["input_tokens"], a_claude["output_tokens"]) == (
        usage.prompt_tokens, usage.completion_tokens)
    assert rows[("b", OPENAI_MODEL)]["errors"] == 1
    assert rows[("b", OPENAI_MODEL)]["requests"] == 1
    assert rows[("b", ANTHROPIC_MODEL)]["errors"] == 0

    by_key = _usage(http, since=since, group_by="key")
    assert by_key["group_by"] == ["key"]
    assert {r["key"]: r["requests"] for r in by_key["rows"]} == {"a": 2, "b": 2}
    assert all(set(r) == {"key", "key_id"} | ROW_FIELDS for r in by_key["rows"])
    only = _usage(http, since=since, key="b", model=ANTHROPIC_MODEL, group_by="model,key")
    assert only["group_by"] == ["key", "model"]
    assert [(r["key"], r["model"], r["requests"]) for r in only["rows"]] == [
        ("b", ANTHROPIC_MODEL, 1)]
    assert _usage(http, until=since - 86400)["rows"] == []

    metrics = http.get("/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"}).text
    line = (f'poolgate_tokens_total{{direction="input",key="a",model="{OPENAI_MODEL}"}} '
            f'{float(first.usage.prompt_tokens)}')
    assert line in metrics


def test_usage_errors_and_admin(gateway):
    _, http = gateway
    assert http.get("/internal/usage").status_code == 401
    r = http.get("/internal/usage", params={"group_by": "key,team"}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "group_by"
    r = http.get("/internal/usage", params={"since": "yesterday"}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "since"


def test_a_stream_cut_early_is_charged_what_it_used(gateway):
    _, http = gateway
    since = time.time()
    body = {"model": OPENAI_MODEL, "stream": True,
            "messages": [{"role": "user", "content": "[[hang-after:4]] a b c d e f g h"}]}
    with http.stream("POST", "/v1/chat/completions", json=body,
                     headers={"authorization": "Bearer sk-a"}) as r:
        frames = 0
        for line in r.iter_lines():
            frames += line.startswith("data: ")
            if frames == 4:
                break
    deadline = time.monotonic() + 10
    while True:  # the gateway notices the client left, then records the request
        rows = _usage(http, since=since, key="a", group_by="key")["rows"]
        if rows:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert rows[0]["requests"] == 1 and rows[0]["output_tokens"] >= 3
    assert rows[0]["input_tokens"] > 0 and rows[0]["errors"] == 0


def test_translated_streams_are_charged_what_their_clients_were_told(gateway):
    # an Anthropic and a Responses client streaming from the OpenAI upstream: the
    # gateway encodes all events of one upstream read at once (feed_batch) and
    # must still keep the usage it told each client
    url, http = gateway
    since = time.time()
    with anthropic.Anthropic(base_url=url, api_key="sk-c", max_retries=0) as client:
        with client.messages.stream(model=OPENAI_MODEL, max_tokens=64, messages=[
                {"role": "user", "content": "tell me a few words"}]) as stream:
            message = stream.get_final_message()
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-c", max_retries=0) as client:
        events = list(client.responses.create(model=OPENAI_MODEL, input="a few more words",
                                              stream=True))
    told = events[-1].response.usage
    assert events[-1].type == "response.completed" and message.content[0].text
    deadline = time.monotonic() + 10
    while True:  # the last frame may reach the client before the request is recorded
        rows = _usage(http, since=since, key="c", group_by="key")["rows"]
        if rows and rows[0]["requests"] == 2:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert rows[0]["errors"] == 0
    assert rows[0]["input_tokens"] == message.usage.input_tokens + told.input_tokens > 0
    assert rows[0]["output_tokens"] == message.usage.output_tokens + told.output_tokens > 0


def _start(config: Path, env: dict[str, str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--config", str(config)],
                            cwd=REPO, env=with_server_http(env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, "poolgate did not start"
        time.sleep(0.05)


@pytest.mark.slow
def test_usage_survives_sigkill(tmp_path, fake_upstream):
    port = free_port()
    config = tmp_path / "poolgate.toml"
    config.write_text(f"""
[server]
port = {port}
log_level = "warning"
state_dir = "{tmp_path / 'state'}"

[server.keys.team-a]
secret_env = "TEAM_A_KEY"

[server.keys.team-b]
secret_env = "TEAM_B_KEY"

[server.keys.team-d]
secret_env = "TEAM_D_KEY"
budget_tokens = {{ day = 10 }}

[[workers]]
name = "up"
dialect = "openai"
url = "{fake_upstream.url}"
api_key_env = "UPSTREAM_KEY"
models = ["{OPENAI_MODEL}"]
""")
    env = {**os.environ, "TEAM_A_KEY": "sk-a", "TEAM_B_KEY": "sk-b", "TEAM_D_KEY": "sk-d",
           "UPSTREAM_KEY": UPSTREAM_KEY, "POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN}
    env.pop("POOLGATE_STATE_DIR", None)
    base = f"http://127.0.0.1:{port}"
    proc = _start(config, env, port)
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            for key, n in (("sk-a", 3), ("sk-b", 2)):
                for _ in range(n):
                    assert _chat(http, key, OPENAI_MODEL).status_code == 200
            assert _chat(http, "sk-d", OPENAI_MODEL).status_code == 200  # spends the budget
            created = http.post("/internal/keys", json={"name": "team-c", "rpm": 5},
                                headers=ADMIN)
            assert created.status_code == 201
            time.sleep(1.0)  # older than a second: must survive
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc = _start(config, env, port)
        with httpx.Client(base_url=base, timeout=30) as http:
            rows = _usage(http, group_by="key")["rows"]
            assert {r["key"]: r["requests"] for r in rows} == {"team-a": 3, "team-b": 2,
                                                                "team-d": 1}
            assert all(r["output_tokens"] > 0 for r in rows)
            # the run-time key survived too, hashed, and still works
            keys = {k["name"]: k for k in http.get("/internal/keys", headers=ADMIN).json()["keys"]}
            assert keys["team-c"]["source"] == "runtime" and keys["team-c"]["rpm"] == 5
            assert keys["team-a"]["usage_today"]["requests"] == 3
            # today's budget starts at what the ledger has: still spent after the restart
            spent = _chat(http, "sk-d", OPENAI_MODEL)
            assert spent.status_code == 429 and spent.json()["error"]["code"] == "budget_exceeded"
            secret = created.json()["secret"]
            assert _chat(http, secret, OPENAI_MODEL).status_code == 200
        state = (tmp_path / "state" / "poolgate.sqlite3").read_bytes()
        assert secret.encode() not in state
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
