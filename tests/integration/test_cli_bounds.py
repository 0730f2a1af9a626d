"""``max_conversations`` holds under concurrent first turns, through a real
poolgate: eight first turns at once against a worker allowed four never have
more than four CLI processes (fake claude) or agent sessions (fake jsonrpc
agent) alive at one time; the turns past the limit are refused, not queued
into a fifth process."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import claude_home, fake_claude_worker, spawns, wait_for
from tests.support.cli_fakes import (LINGMA_OPTIONS, CLIENT_KEY, fake_cli_worker, pid_alive,
                                     serve, stdin_of, worker_info)

pytestmark = pytest.mark.slow

TOKEN = "sk-ant-oat01-team-account"
KEY = "sk-agent-account"


def _eight_at_once(url: str, model: str) -> list[int]:
    def one(i: int) -> int:
        with httpx.Client(base_url=url, timeout=60) as http:
            return http.post("/v1/chat/completions",
                             headers={"authorization": f"Bearer {CLIENT_KEY}"},
                             json={"model": model, "messages": [
                                 {"role": "user", "content": f"[[sleep:1]] turn {i}"}]}).status_code
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(8)))


class Peak:
    """Samples ``count()`` every 10 ms in a thread; ``value`` is the most seen."""

    def __init__(self, count) -> None:
        self.count, self.value = count, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.value = max(self.value, self.count())
            time.sleep(0.01)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_concurrent_first_turns_never_run_more_claude_processes_than_allowed(tmp_path: Path):
    log = tmp_path / "claude.log"
    with FakeUpstream(api_key=TOKEN, models=("claude-sonnet-4-6",)) as upstream:
        worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                    upstream.anthropic_url, log, max_conversations=4)
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            wait_for(lambda: worker_info(http)["claude-a"]["state"] == "ready")

            def live() -> int:
                return sum(pid_alive(e["pid"]) for e in spawns(log) if "--version" not in e["argv"])

            with Peak(live) as peak:
                codes = _eight_at_once(srv.url, "claude-sonnet-4-6")
    assert peak.value <= 4, (peak.value, codes)
    assert codes.count(200) >= 1 and set(codes) <= {200, 429}, codes


def test_concurrent_first_turns_never_open_more_agent_sessions_than_allowed(tmp_path: Path):
    log = tmp_path / "agent.log"
    with FakeUpstream(api_key=KEY, models=("agent-model",)) as upstream:
        worker = fake_cli_worker("jsonrpc", "agent-a", tmp_path / "agent-a", upstream.url, log,
                                 api_key=KEY, models=("agent-model",), args=("--dialect", "lingma"),
                                 cli_options=LINGMA_OPTIONS, max_conversations=4)
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            wait_for(lambda: worker_info(http)["agent-a"]["state"] == "ready")

            def open_sessions() -> int:
                methods = [m.get("method") for m in stdin_of(log)]
                return methods.count("chat/start") - methods.count("chat/end")

            with Peak(open_sessions) as peak:
                codes = _eight_at_once(srv.url, "agent-model")
    assert peak.value <= 4, (peak.value, codes)
    assert codes.count(200) >= 1 and set(codes) <= {200, 429}, codes
