"""A complete process worker: it answers with the last user message reversed,
word by word. poolgate starts it, supervises it and talks to it over the
worker protocol; `pool.worker_main.run` does the protocol part.

    [[workers]]
    name = "reverser"
    kind = "process"
    command = ["python", "examples/reverse_worker.py"]
    models = ["reverse"]

Then `curl .../v1/chat/completions -d '{"model": "reverse", ...}'` — or any
SDK, in either dialect, streaming or not.
"""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from pool import worker_main  # noqa: E402
from pool.errors import BadRequest  # noqa: E402
from pool.model import ChatRequest, Finish, Start, TextDelta, TextPart, Usage  # noqa: E402


async def answer(request: ChatRequest):
    """Yield canonical events; raise a pool.errors exception to fail the request."""
    texts = [p.text for m in request.messages if m.role == "user"
             for p in m.parts if isinstance(p, TextPart)]
    if not texts:
        raise BadRequest("Send a user message with text.", param="messages")
    words = texts[-1].split()[::-1]
    limit = request.sampling.max_tokens or len(words)
    yield Start(model=request.model)
    for word in words[:limit]:
        await asyncio.sleep(0)  # a real engine awaits its model here (in a thread)
        yield TextDelta(word + " ")
    yield Usage(input_tokens=len(texts[-1].split()), output_tokens=min(limit, len(words)))
    yield Finish("length" if limit < len(words) else "stop")


if __name__ == "__main__":
    worker_main.run(answer)
