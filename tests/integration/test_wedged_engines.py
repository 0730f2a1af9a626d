"""Wedged engines are found out and replaced, and every call has a deadline
(issue 15, item 3): a real gateway, real local workers on the SGLang engine
in front of the fake SGLang server, real signals.

* ``wedge`` pings every half second: its engine server stopped with SIGSTOP
  fails the engine's health check; a stream that goes silent (the fake's
  ``hang`` switch: the server answers ``/health`` but produces no token) ends
  with a 504 after ``read_timeout`` and marks the engine wedged. Either way the
  worker is replaced.
* ``sleepy`` pings once a minute, so a SIGSTOPped worker stays "ready" long
  enough to show that ``count_tokens`` and the engine stats give up at
  ``call_timeout`` instead of hanging."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import load_settings
from tests.integration.test_engine_faults import ADMIN, HELLO, sglang_worker, worker_info
from tests.integration.test_supervisor import alive
from tests.support.server import ServerThread

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

READ_TIMEOUT = 2.0
CALL_TIMEOUT = 1.5


@pytest.fixture
def oai(srv: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                       timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wedge") / "control.json"


@pytest.fixture(scope="module")
def srv(tiny_model: Any, control: Path) -> Iterator[ServerThread]:
    wedge = {**sglang_worker("wedge", tiny_model.hf_dir, ["wedge"], "--control", str(control)),
             "health_interval": 0.5, "health_timeout": 2.0, "read_timeout": READ_TIMEOUT}
    sleepy = {**sglang_worker("sleepy", tiny_model.hf_dir, ["sleepy"]),
              "health_interval": 60.0, "call_timeout": CALL_TIMEOUT}
    settings = load_settings(None, {"POOLGATE_ADMIN_TOKEN": ADMIN},
                             {"workers": [wedge, sleepy], "routing": {"cooldown_seconds": 0}})
    with ServerThread(create_app(settings), start_timeout=180) as server:
        yield server


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError):
                pass
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode()


def wait_replaced(srv: ServerThread, name: str, before: dict[str, Any],
                  timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not ((now := worker_info(srv, name))["state"] == "ready"
               and now["restarts"] > before["restarts"] and now["pid"] != before["pid"]):
        assert time.monotonic() < deadline, now
        time.sleep(0.1)
    return now


def test_a_sigstopped_engine_server_makes_the_worker_unhealthy_and_replaced(
        srv: ServerThread, oai: openai.OpenAI) -> None:
    before = worker_info(srv, "wedge")
    assert before["state"] == "ready"
    [server] = [p for p in descendants(before["pid"]) if "tests.fakes.sglang_server" in cmdline(p)
                and "-c" not in cmdline(p).split()]
    os.kill(server, signal.SIGSTOP)  # the worker child itself still answers at once
    after = wait_replaced(srv, "wedge", before)
    assert after["last_exit"]["reason"] == "unhealthy"
    deadline = time.monotonic() + 10
    while alive(server):  # the old engine server goes with its worker
        assert time.monotonic() < deadline
        time.sleep(0.05)
    answer = oai.chat.completions.create(model="wedge", messages=HELLO, max_tokens=3)
    assert answer.choices[0].finish_reason == "length"


def test_a_silent_stream_times_out_and_the_wedged_worker_is_replaced(
        srv: ServerThread, oai: openai.OpenAI, control: Path) -> None:
    before = worker_info(srv, "wedge")
    control.write_text(json.dumps({"hang": True}))
    try:
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as info:
            oai.chat.completions.create(model="wedge", messages=HELLO, max_tokens=3)
        assert time.monotonic() - started < READ_TIMEOUT + 10
        assert info.value.status_code == 504
        assert "produced no token" in info.value.message
        after = wait_replaced(srv, "wedge", before)
        assert after["last_exit"]["reason"] == "unhealthy"
    finally:
        control.write_text("{}")
    answer = oai.chat.completions.create(model="wedge", messages=HELLO, max_tokens=3)
    assert answer.choices[0].finish_reason == "length"


def test_calls_to_a_wedged_worker_fail_within_their_deadline(srv: ServerThread) -> None:
    info = worker_info(srv, "sleepy")
    with anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0,
                             timeout=30) as claude:
        check_calls_time_out(srv, claude, info["pid"])


def check_calls_time_out(srv: ServerThread, claude: anthropic.Anthropic, pid: int) -> None:
    exact = claude.messages.count_tokens(model="sleepy", messages=HELLO)  # type: ignore[arg-type]
    assert exact.input_tokens > 0
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(anthropic.APIStatusError) as err:
            claude.messages.count_tokens(model="sleepy", messages=HELLO)  # type: ignore[arg-type]
        assert time.monotonic() - started < CALL_TIMEOUT + 5
        assert err.value.status_code == 504
        assert "did not answer count_tokens" in err.value.message
        started = time.monotonic()
        stats = httpx.get(srv.url + "/internal/workers/sleepy/engine",
                          headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)
        assert time.monotonic() - started < CALL_TIMEOUT + 5
        assert stats.status_code == 504
    finally:
        os.kill(pid, signal.SIGCONT)
    assert claude.messages.count_tokens(model="sleepy", messages=HELLO).input_tokens == \
        exact.input_tokens  # type: ignore[arg-type]
