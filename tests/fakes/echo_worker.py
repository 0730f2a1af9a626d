"""A worker program for tests, speaking the worker protocol through
:mod:`pool.worker_main`::

    python -m tests.fakes.echo_worker [--crash-at-start] [--hang-at-start]
        [--ignore-sigterm] [--startup-delay S] [--hang-after N] [--log PATH]

It answers ``echo: <last user text>`` word by word. Markers in the last user
message script faults, like the fake upstreams:

* ``[[die-after:N]]``: stream N text events, then ``os._exit(9)``;
* ``[[error:STATUS]]``: fail the request with that status;
* ``[[sleep:S]]``: wait S seconds between words;
* ``[[forever]]``: stream words until cancelled;
* ``[[env]]``: answer the child's whole environment as one JSON object.

``--hang-after N``: after N requests, block the event loop for good (pings
stop being answered). ``--log PATH``: append ``event <rid>``/``cancelled``
lines, so a test can see what the child did.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import signal
import sys
import time
from typing import AsyncIterator

from pool import worker_main
from pool.errors import UpstreamError, UpstreamUnavailable
from pool.model import ChatRequest, Event, Finish, Start, TextDelta, TextPart, Usage

_MARK = re.compile(r"\[\[(die-after|error|sleep|forever|env)(?::([^\]]*))?\]\]")


def last_user_text(request: ChatRequest) -> str:
    for message in reversed(request.messages):
        if message.role == "user":
            return " ".join(p.text for p in message.parts if isinstance(p, TextPart))
    return ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crash-at-start", action="store_true")
    parser.add_argument("--hang-at-start", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--startup-delay", type=float, default=0.0)
    parser.add_argument("--hang-after", type=int, default=None)
    parser.add_argument("--log", default=None)
    args = parser.parse_args(argv)
    if args.crash_at_start:
        sys.exit(3)
    served = itertools.count(1)

    def note(line: str) -> None:
        if args.log:
            with open(args.log, "a") as f:
                f.write(line + "\n")

    async def setup() -> None:
        if args.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if args.hang_at_start:
            await asyncio.Event().wait()
        await asyncio.sleep(args.startup_delay)

    async def answer(request: ChatRequest) -> AsyncIterator[Event]:
        n = next(served)
        if args.hang_after is not None and n > args.hang_after:
            while True:
                time.sleep(3600)  # the loop is stuck: pings go unanswered
        text = last_user_text(request)
        marks = {m.group(1): m.group(2) for m in _MARK.finditer(text)}
        words = _MARK.sub("", text).split()
        if "error" in marks:
            status = int(marks["error"] or 500)
            if status >= 500:
                raise UpstreamUnavailable(f"scripted failure {status}")
            raise UpstreamError(f"scripted refusal {status}", status=status)
        if "env" in marks:
            yield Start(id=f"echo-{os.getpid()}-{n}", model=request.model)
            yield TextDelta(json.dumps(dict(os.environ), sort_keys=True))
            yield Finish("stop")
            return
        die_after = int(marks["die-after"]) if "die-after" in marks else None
        pause = float(marks.get("sleep") or 0)
        yield Start(id=f"echo-{os.getpid()}-{n}", model=request.model)
        try:
            sent = 0
            stream = itertools.count() if "forever" in marks else range(len(words) + 1)
            for i in stream:
                if die_after is not None and sent >= die_after:
                    os._exit(9)
                piece = "echo:" if i == 0 else " " + (words[i - 1] if words else str(i))
                yield TextDelta(piece)
                note(f"event {n}")
                sent += 1
                if pause or "forever" in marks:
                    await asyncio.sleep(pause or 0.01)
        except asyncio.CancelledError:
            note(f"cancelled {n}")
            raise
        except GeneratorExit:
            note(f"cancelled {n}")
            raise
        yield Usage(input_tokens=len(words), output_tokens=len(words) + 1)
        yield Finish("stop")

    worker_main.run(answer, setup=setup, handle_sigterm=not args.ignore_sigterm)


if __name__ == "__main__":
    main()
