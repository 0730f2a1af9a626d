"""Issue 15 item 4: a slow reader pauses its own request, not the worker.

Over a real worker process: the child generates at most a window ahead of
the consumer (credit frames of :mod:`pool.wire`) while another request on the
same socket and the health ping flow on. And the Transformers engine runs a
sequence at most ``AHEAD`` tokens ahead of its reader."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from pool.channel import WINDOW
from pool.local.engine import GenParams
from pool.local.transformers_engine import AHEAD, TransformersEngine
from pool.model import ChatRequest, Message, TextPart, TextDelta
from pool.process import ProcessSpec, ProcessWorker

pytestmark = pytest.mark.slow

ROOT = str(Path(__file__).resolve().parents[2])


def ask(text: str) -> ChatRequest:
    return ChatRequest(model="echo", messages=(Message("user", (TextPart(text),)),),
                       dialect="openai_chat", stream=True)


async def test_a_slow_reader_stops_its_request_in_the_child_and_nothing_else(tmp_path):
    log = tmp_path / "child.log"
    worker = ProcessWorker(ProcessSpec(
        name="echo", models=("echo",), cwd=ROOT, health_timeout=1.0, health_interval=0.5,
        command=(sys.executable, "-m", "tests.fakes.echo_worker", "--log", str(log))))
    assert await worker.start()
    try:
        slow = worker.stream(ask("[[forever]] [[sleep:0.001]]")).__aiter__()
        for _ in range(3):  # Start and two words: the request is running
            await slow.__anext__()
        await asyncio.sleep(1.5)  # unbounded, the child would make ~1,000 events by now
        made = log.read_text().count("event 1\n")
        assert made <= 2 + WINDOW + 1
        assert worker.buffered <= WINDOW
        # the same socket still serves: another request to the end, and the ping
        other = [e.text async for e in worker.stream(ask("one two three"))
                 if isinstance(e, TextDelta)]
        assert "".join(other) == "echo: one two three"
        assert await worker.health()
        # credit flows back as the slow reader reads: it gets well past the window
        for _ in range(5 * WINDOW):
            await slow.__anext__()
        assert log.read_text().count("event 1\n") >= 5 * WINDOW
        await slow.aclose()
    finally:
        await worker.aclose()


async def test_a_transformers_sequence_runs_at_most_ahead_of_its_reader(tiny_model: Any):
    engine = TransformersEngine(tiny_model.hf_dir, capacity=2, threads=1, context_length=512)
    await engine.start()
    try:
        params = GenParams(max_tokens=400, temperature=1.0, seed=1, stop_ids=frozenset())
        steps = engine.generate([1, 2, 3], params).__aiter__()
        await steps.__anext__()
        for _ in range(40):  # the scheduler has time for far more than AHEAD tokens
            await asyncio.sleep(0.05)
        assert engine.buffered <= AHEAD
        # and a second sequence is not held up by the stalled one
        other = [s async for s in engine.generate([4, 5], GenParams(max_tokens=100,
                                                                   stop_ids=frozenset()))]
        assert len(other) == 100
        rest = [s async for s in steps]
        assert len(rest) == 399
    finally:
        await engine.aclose()
