"""The supervisor outlives long crash loops and its own bugs, and an admin
restart brings back a slot whose loop has ended (issue 15, item 1)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from structlog.testing import capture_logs

from pool.accumulate import accumulate
from pool.process import ProcessSpec, ProcessWorker
from pool.supervisor import Supervisor, SupervisorPolicy
from pool.worker import WorkerState
from tests.integration.test_supervisor import FAST, ROOT, alive, ask, until


@pytest.mark.parametrize("failures", [1_025, 1_100, 10**6, 10**18])
def test_backoff_stays_capped_at_huge_failure_counts(failures: int) -> None:
    async def launch() -> Any:
        raise AssertionError("not launched")

    sup = Supervisor("x", SupervisorPolicy(backoff_max=30.0, jitter=0.0), launch)
    sup._consecutive = failures
    assert sup.next_delay() == 30.0


async def test_a_crash_loop_past_a_thousand_failures_keeps_supervising() -> None:
    # 2.0 ** 1100 overflows: before the fix the loop died at its next backoff
    launches = 0

    async def launch() -> Any:
        nonlocal launches
        launches += 1
        raise OSError("no such program")

    sup = Supervisor("long-crash-loop", SupervisorPolicy(backoff_initial=0.01, backoff_max=0.02),
                     launch)
    sup._consecutive = 1_100
    try:
        assert await sup.start() is False
        await until(lambda: launches >= 3, timeout=5)
        assert sup.state is not WorkerState.STOPPED
        assert max(sup.delays) <= 0.02 * 1.1
    finally:
        await sup.stop()
    assert sup.state is WorkerState.STOPPED


class BuggyLaunch(ProcessWorker):
    """A real process worker whose first ``bugs`` launches fail with an
    exception the supervisor does not expect (not an OSError)."""

    def __init__(self, spec: ProcessSpec, bugs: int) -> None:
        super().__init__(spec)
        self.bugs = bugs

    async def _launch(self) -> Any:
        if self.bugs:
            self.bugs -= 1
            raise RuntimeError("a bug in the launch path")
        return await super()._launch()


def echo_spec() -> ProcessSpec:
    return ProcessSpec(name="echo", command=(sys.executable, "-m", "tests.fakes.echo_worker"),
                       models=("echo-model",), cwd=ROOT, capacity=8, **FAST)


async def test_an_unexpected_exception_is_logged_and_the_slot_recovers() -> None:
    worker = BuggyLaunch(echo_spec(), bugs=2)
    try:
        with capture_logs() as logs:
            async with asyncio.timeout(10):  # the first outcome must be settled, not lost
                assert await worker.start() is False
            await until(lambda: worker.state is WorkerState.READY)
        errors = [e for e in logs if e["event"] == "worker.supervisor_error"]
        assert len(errors) == 2
        assert errors[0]["log_level"] == "error" and errors[0]["error"] == "RuntimeError"
        assert worker.last_exit is not None and worker.last_exit.reason == "supervisor_error"
        completion = await accumulate(worker.stream(ask("still supervised")))
        assert completion.text == "echo: still supervised"
    finally:
        await worker.aclose()


async def test_restart_revives_a_supervisor_whose_loop_ended() -> None:
    worker = BuggyLaunch(echo_spec(), bugs=0)
    try:
        assert await worker.start() is True
        old = worker.pid
        assert old is not None
        await worker.supervisor.stop()  # the loop is over, as after a fatal bug
        assert worker.state is WorkerState.STOPPED and not alive(old)
        await worker.restart()  # what POST /internal/workers/{name}/restart does
        await until(lambda: worker.state is WorkerState.READY and worker.pid not in (None, old))
        assert (await accumulate(worker.stream(ask("back")))).text == "echo: back"
    finally:
        await worker.aclose()
