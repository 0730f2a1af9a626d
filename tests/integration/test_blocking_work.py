"""Issue 15 item 5: slow prompt work in a local worker's child (llama.cpp's
tokenizer is an HTTP call to llama-server; the chat template is rendered by
Jinja) runs off the child's event loop, so the health ping and the other
requests of the worker are answered meanwhile. Over a real child process."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pool.errors import BadRequest
from pool.local.worker import LocalSpec, LocalWorker
from pool.model import ChatRequest, Message, TextDelta, TextPart, Sampling

pytest.importorskip("xllamacpp")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def chat(text: str, **sampling: Any) -> ChatRequest:
    return ChatRequest(model="tiny", messages=(Message("user", (TextPart(text),)),),
                       dialect="openai_chat", stream=True, sampling=Sampling(**sampling))


async def test_a_slow_tokenization_does_not_stall_the_ping_or_other_streams(tiny_model: Any):
    worker = LocalWorker(LocalSpec(name="w", engine="llamacpp", model=tiny_model.gguf,
                                   models=("tiny",), threads=1, capacity=2,
                                   context_length=4096, health_timeout=30.0))
    assert await worker.start()
    try:
        # about 1.1 M tokens: llama-server takes a second or more to tokenize them
        big = "hello world, how are you today? " * 125_000
        counting = asyncio.create_task(worker.count_tokens(chat(big)))
        await asyncio.sleep(0.2)  # the call has reached the child and is tokenizing
        assert not counting.done()
        assert await worker.health()  # the ping is answered by the child's loop...
        assert not counting.done()  # ...while the tokenization is still under way
        # and a stream of the same worker makes progress meanwhile
        events = worker.stream(chat("hi", max_tokens=4, ignore_eos=True)).__aiter__()
        await events.__anext__()
        got = 0
        async for event in events:
            got += isinstance(event, TextDelta)
        assert got >= 1 and not counting.done()
        assert await counting > 1_000_000
        # the same for a request's own prompt (rendered, then tokenized, then refused
        # as longer than the context): the ping is answered while it is prepared
        refused = asyncio.create_task(_drain(worker.stream(chat(big))))
        await asyncio.sleep(0.2)
        assert not refused.done()
        assert await worker.health()
        assert not refused.done()
        with pytest.raises(BadRequest):
            await refused
    finally:
        await worker.aclose()


async def _drain(events: Any) -> None:
    async for _ in events:
        pass
