"""Supervised worker processes: real children running tests.fakes.echo_worker."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

from pool.accumulate import accumulate
from pool.errors import UpstreamError, UpstreamUnavailable, WorkerCrashed
from pool.model import ChatRequest, Finish, Message, Start, TextDelta, TextPart
from pool.process import ProcessSpec, ProcessWorker
from pool.supervisor import Supervisor, SupervisorPolicy
from pool.worker import Worker, WorkerState
from tests.support.procs import alive

ROOT = str(Path(__file__).resolve().parents[2])
FAST = dict(ready_timeout=15.0, health_interval=0.2, health_timeout=0.5, backoff_initial=0.05,
            backoff_max=0.4, crash_loop_threshold=3, stop_timeout=3.0)


def spec(*flags: str, **overrides: Any) -> ProcessSpec:
    return ProcessSpec(name="echo", command=(sys.executable, "-m", "tests.fakes.echo_worker",
                                             *flags),
                       models=("echo-model",), cwd=ROOT, capacity=8, **{**FAST, **overrides})


def ask(text: str) -> ChatRequest:
    return ChatRequest(model="echo-model", messages=(Message("user", (TextPart(text),)),),
                       dialect="openai_chat", stream=True)


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Bounded polling; fails the test when ``predicate`` stays false."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


@pytest.fixture
async def workers() -> Any:
    made: list[ProcessWorker] = []

    def make(s: ProcessSpec) -> ProcessWorker:
        w = ProcessWorker(s)
        made.append(w)
        return w

    yield make
    for w in made:
        await w.aclose()


async def test_start_stream_stop(workers: Any) -> None:
    worker = workers(spec())
    assert isinstance(worker, Worker)
    assert await worker.start() is True
    assert worker.state is WorkerState.READY and worker.kind == "process"
    pid = worker.pid
    assert pid is not None and alive(pid)
    completion = await accumulate(worker.stream(ask("hello   there world")))
    assert completion.text == "echo: hello there world"
    assert completion.finish == Finish("stop")
    assert worker.info()["state"] == "ready" and worker.uptime is not None
    await worker.aclose()
    assert worker.state is WorkerState.STOPPED and worker.pid is None
    assert not alive(pid)
    assert worker.last_exit is not None and worker.last_exit.code == 0
    assert worker.last_exit.reason == "stopped"
    with pytest.raises(UpstreamUnavailable):
        await accumulate(worker.stream(ask("too late")))


async def test_concurrent_requests_are_multiplexed(workers: Any) -> None:
    worker = workers(spec())
    await worker.start()
    texts = [f"request number {i} [[sleep:0.01]]" for i in range(20)]
    results = await asyncio.gather(*(accumulate(worker.stream(ask(t))) for t in texts))
    assert [c.text for c in results] == [f"echo: request number {i}" for i in range(20)]
    assert worker.in_flight == 0


@pytest.mark.parametrize("status, kind", [(429, UpstreamError), (400, UpstreamError),
                                          (503, UpstreamUnavailable)])
async def test_worker_errors_cross_as_gateway_errors(workers: Any, status: int,
                                                     kind: type) -> None:
    worker = workers(spec())
    await worker.start()
    with pytest.raises(kind) as info:
        await accumulate(worker.stream(ask(f"x [[error:{status}]]")))
    assert not isinstance(info.value, WorkerCrashed)
    if kind is UpstreamError:
        assert info.value.status == status
    assert (await accumulate(worker.stream(ask("fine")))).text == "echo: fine"
    assert worker.restarts == 0


async def test_kill9_mid_stream_fails_fast_and_the_slot_recovers(workers: Any) -> None:
    worker = workers(spec())
    await worker.start()
    old = worker.pid
    assert old is not None
    loop = asyncio.get_running_loop()
    got: list[Any] = []
    with pytest.raises(WorkerCrashed) as info:
        async with asyncio.timeout(5):
            async for event in worker.stream(ask("[[forever]]")):
                got.append(event)
                if len(got) == 3:
                    os.kill(old, signal.SIGKILL)
                    killed_at = loop.time()
    assert loop.time() - killed_at < 1.0
    assert info.value.before_first_event is False and isinstance(info.value, UpstreamUnavailable)
    assert type(got[0]) is Start and type(got[1]) is TextDelta
    await until(lambda: worker.state is WorkerState.READY and worker.pid not in (None, old))
    assert worker.restarts == 1
    assert worker.last_exit is not None and worker.last_exit.signal == signal.SIGKILL
    assert (await accumulate(worker.stream(ask("back again")))).text == "echo: back again"
    assert worker.in_flight == 0


async def test_die_after_n_events(workers: Any) -> None:
    worker = workers(spec())
    await worker.start()
    texts: list[str] = []
    with pytest.raises(WorkerCrashed) as info:
        async for event in worker.stream(ask("one two three four [[die-after:2]]")):
            if type(event) is TextDelta:
                texts.append(event.text)
    assert texts == ["echo:", " one"] and not info.value.before_first_event
    assert worker.state is not WorkerState.READY  # at once, before the supervisor reaps it
    await until(lambda: worker.state is WorkerState.READY and worker.restarts == 1)
    assert worker.last_exit is not None and worker.last_exit.code == 9


async def test_sigstopped_worker_is_unhealthy_and_replaced(workers: Any) -> None:
    worker = workers(spec())
    await worker.start()
    old = worker.pid
    assert old is not None
    os.kill(old, signal.SIGSTOP)
    seen: set[WorkerState] = set()

    def replaced() -> bool:
        seen.add(worker.state)
        return worker.state is WorkerState.READY and worker.pid not in (None, old)

    await until(replaced)
    assert WorkerState.UNHEALTHY in seen
    assert worker.last_exit is not None and worker.last_exit.reason == "hung"
    assert worker.last_exit.signal == signal.SIGKILL
    assert not alive(old)
    assert (await accumulate(worker.stream(ask("ok")))).text == "echo: ok"


async def test_hung_loop_fails_its_requests_as_retryable(workers: Any) -> None:
    # the child's event loop blocks before the first event: pings go unanswered
    worker = workers(spec("--hang-after", "0"))
    await worker.start()
    old = worker.pid
    with pytest.raises(WorkerCrashed) as info:
        async with asyncio.timeout(10):
            await accumulate(worker.stream(ask("anyone there")))
    assert info.value.before_first_event is True
    await until(lambda: worker.last_exit is not None)
    assert worker.last_exit is not None and worker.last_exit.reason == "hung"
    await until(lambda: worker.state is WorkerState.READY and worker.pid != old)


async def test_crash_loop_backs_off_and_still_stops(workers: Any) -> None:
    worker = workers(spec("--crash-at-start"))
    assert await worker.start() is False
    await until(lambda: worker.crash_looping, timeout=15)
    assert worker.state in (WorkerState.STARTING, WorkerState.UNHEALTHY)
    assert worker.last_exit is not None and worker.last_exit.code == 3
    await until(lambda: len(worker.supervisor.delays) >= 4, timeout=15)
    delays = list(worker.supervisor.delays)[:4]
    assert all(b > a for a, b in zip(delays, delays[1:])), delays
    assert delays[0] == pytest.approx(0.05, rel=0.11) and max(delays) <= 0.4 * 1.1
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await worker.aclose()
    assert loop.time() - t0 < 3.0
    assert worker.state is WorkerState.STOPPED and worker.pid is None


@pytest.mark.parametrize("failures, expected", [(1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0),
                                                (7, 30.0), (20, 30.0)])
def test_backoff_is_exponential_and_capped(failures: int, expected: float) -> None:
    async def launch() -> Any:
        raise AssertionError("not launched")

    for rng, factor in ((lambda: 0.0, 0.9), (lambda: 0.5, 1.0), (lambda: 1.0, 1.1)):
        sup = Supervisor("x", SupervisorPolicy(), launch, rng=rng)
        sup._consecutive = failures
        assert sup.next_delay() == pytest.approx(expected * factor)


async def test_not_ready_within_deadline_is_replaced(workers: Any) -> None:
    worker = workers(spec("--hang-at-start", ready_timeout=0.3))
    assert await worker.start() is False
    await until(lambda: worker.last_exit is not None)
    assert worker.last_exit.reason == "not_ready"
    assert worker.state is not WorkerState.READY


async def test_stop_escalates_to_sigkill_for_a_child_ignoring_sigterm(workers: Any) -> None:
    worker = workers(spec("--ignore-sigterm", stop_timeout=0.5))
    await worker.start()
    pid = worker.pid
    assert pid is not None
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await worker.aclose()
    elapsed = loop.time() - t0
    assert 0.5 <= elapsed < 5.0
    assert worker.last_exit is not None and worker.last_exit.signal == signal.SIGKILL
    assert not alive(pid)


async def test_drain_refuses_new_requests_and_lets_in_flight_finish(workers: Any) -> None:
    worker = workers(spec())
    await worker.start()
    stream = worker.stream(ask("a b c d e [[sleep:0.05]]"))
    first = await anext(stream)
    assert type(first) is Start
    drained = asyncio.create_task(worker.drain(timeout=10))
    await until(lambda: worker.state is WorkerState.DRAINING)
    with pytest.raises(UpstreamUnavailable):
        await accumulate(worker.stream(ask("new")))
    rest = [event async for event in stream]
    assert rest[-1] == Finish("stop")
    assert "".join(e.text for e in rest if type(e) is TextDelta) == "echo: a b c d e"
    assert await drained is True
    assert worker.state is WorkerState.DRAINING and worker.restarts == 0
    worker.resume()
    assert worker.state is WorkerState.READY
    assert (await accumulate(worker.stream(ask("new")))).text == "echo: new"


async def test_restart_replaces_the_process_gracefully(workers: Any) -> None:
    worker = workers(spec())
    await worker.start()
    old = worker.pid
    await worker.restart()
    await until(lambda: worker.state is WorkerState.READY and worker.pid not in (None, old))
    assert worker.last_exit is not None and worker.last_exit.reason == "restart"
    assert worker.last_exit.code == 0 and not worker.crash_looping
    assert worker.supervisor.delays == type(worker.supervisor.delays)(maxlen=16)


async def test_closing_a_stream_early_cancels_it_in_the_child(workers: Any,
                                                              tmp_path: Path) -> None:
    log = tmp_path / "events.log"
    worker = workers(spec("--log", str(log)))
    await worker.start()
    stream = worker.stream(ask("[[forever]]"))
    n = 0
    async for event in stream:
        n += type(event) is TextDelta
        if n == 3:
            break
    await stream.aclose()
    assert worker.in_flight == 0
    await until(lambda: log.exists() and "cancelled 1" in log.read_text())
    lines = log.read_text().splitlines()
    assert lines.index("cancelled 1") >= 3
    assert lines[lines.index("cancelled 1") + 1:] == []
    assert (await accumulate(worker.stream(ask("still here")))).text == "echo: still here"


PARENT = textwrap.dedent("""
    import asyncio, sys
    from pool.process import ProcessSpec, ProcessWorker

    async def main():
        command = (sys.executable, "-m", "tests.fakes.echo_worker", *sys.argv[2:])
        if sys.argv[1] == "shell":  # the worker's parent is sh, which outlives us: no PDEATHSIG
            command = ("sh", "-c", " ".join(command) + "; exit 0")
        worker = ProcessWorker(ProcessSpec(name="orphan-test", command=command))
        started = asyncio.ensure_future(worker.start())
        while worker.pid is None:
            await asyncio.sleep(0.01)
        if "--hang-at-start" not in command:
            assert await started
        print("PID", worker.pid, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


@pytest.mark.parametrize("flags", [("direct",), ("direct", "--ignore-sigterm"),
                                   ("direct", "--hang-at-start"), ("shell",)])
async def test_no_orphan_when_the_gateway_is_sigkilled(flags: tuple[str, ...]) -> None:
    # "shell": only the watchdog pipe can notice (sh survives and sets no death signal);
    # sh exits once its python child has
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PARENT, *flags, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert parent.stdout is not None
    try:
        async with asyncio.timeout(20):
            while not (line := await parent.stdout.readline()).startswith(b"PID "):
                assert line, "the parent exited early"
            child = int(line.split()[1])
        assert alive(child)
    finally:
        parent.kill()
        await parent.wait()
    await until(lambda: not alive(child), timeout=3)


def test_spec_is_frozen() -> None:
    s = spec()
    with pytest.raises(AttributeError):
        s.capacity = 3  # type: ignore[misc]
    assert replace(s, capacity=3).policy().stop_timeout == FAST["stop_timeout"]
