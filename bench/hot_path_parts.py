"""Microseconds per call of the pieces every non-stream request goes through,
in this process (no server, no upstream): what the hot-path trims of issue 14
were chosen by. Run from the checkout: ``.venv/bin/python -m bench.hot_path_parts``.

Compare like with like on one machine in one run (the numbers move with the
machine's load); the end-to-end targets are the shared bench's (gateway CPU
per request against the bare Starlette + aiohttp floor).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Callable

import orjson
import uvloop

from app import access_log
from app.dialects import anthropic_messages, openai_chat
from app.observability import configure_logging, current_request
from app.record import RequestRecord
from app.streaming import until_disconnect
from pool.accumulate import fold
from pool.deadline import Deadline
from pool.remote import openai_chat as remote_openai

N = 50_000
OPENAI_BODY = orjson.dumps({"model": "m", "max_tokens": 16,
                            "messages": [{"role": "user", "content": "Say hello."}]})
ANTHROPIC_BODY = OPENAI_BODY
UPSTREAM_ANSWER = orjson.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "Hello there."}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}})


def per_call(fn: Callable[[], Any], n: int = N) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def access_line_cpu(batched: bool, n: int = N) -> float:
    """Process CPU (every thread: the writer's too) per access line of a routed
    non-stream request, written to /dev/null: through the batched writer
    (``poolgate serve``'s) or through structlog's pipeline (as before)."""
    record = RequestRecord("0f" * 16, "POST", "/v1/chat/completions", 0.0)
    record.status, record.key, record.duration = 200, "bench", 0.00123
    record.dialect, record.model, record.worker = "openai_chat", "mock-gpt", "mock-openai"
    record.tokens_in, record.tokens_out = 12, 16
    token = current_request.set(record)
    with open(os.devnull, "w") as sink:
        configure_logging("info", "json", stream=sink, cache_loggers=True, batch_access=batched)
        access_log.write(record)
        started = time.process_time()
        for _ in range(n):
            access_log.write(record)
        access_log.close()  # the writes still buffered: their CPU counts
        spent = time.process_time() - started
        configure_logging("warning", "json")
    current_request.reset(token)
    return spent / n * 1e6


async def per_await(make: Callable[[], Any], n: int = N) -> float:
    await make()
    started = time.perf_counter()
    for _ in range(n):
        await make()
    return (time.perf_counter() - started) / n * 1e6


async def main() -> None:
    rows: list[tuple[str, float]] = []

    async def in_timeout() -> None:
        async with asyncio.timeout(300):
            pass

    async def in_deadline() -> None:
        with Deadline(300):
            pass

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def answer() -> int:
        return 1

    rows.append(("asyncio.timeout (enter, exit)", await per_await(in_timeout)))
    rows.append(("Deadline (enter, exit)", await per_await(in_deadline)))
    rows.append(("until_disconnect (quick answer)",
                 await per_await(lambda: until_disconnect(receive, answer()))))
    rows.append(("openai decode (loads + decode)",
                 per_call(lambda: openai_chat.decode(orjson.loads(OPENAI_BODY), {}))))
    rows.append(("anthropic decode (loads + decode)",
                 per_call(lambda: anthropic_messages.decode(orjson.loads(ANTHROPIC_BODY), {}))))
    events = remote_openai.body_events(orjson.loads(UPSTREAM_ANSWER))
    rows.append(("upstream answer to events", per_call(
        lambda: remote_openai.body_events(orjson.loads(UPSTREAM_ANSWER)))))
    rows.append(("fold events", per_call(lambda: fold(events))))
    rows.append(("access line, batched (CPU, all threads)", access_line_cpu(True)))
    rows.append(("access line, structlog (CPU)", access_line_cpu(False)))
    for name, us in rows:
        print(f"{name:42s} {us:7.2f} us")


if __name__ == "__main__":
    uvloop.run(main())
