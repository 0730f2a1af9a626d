"""Issue 15 item 8: an upstream that sends an endless SSE line is a protocol
error the client sees in its dialect (502), not a hang or an ever-growing
buffer in the gateway. The upstream is a fake of someone else's server."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

FIRST = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"},
                      "finish_reason": None}]}


async def endless_line(scope, receive, send):
    """``/v1/models`` answers; a chat stream sends one chunk, then 64 MiB of one
    line without an end, then stays silent until the client leaves."""
    if scope["type"] != "http":
        return
    if scope["path"].endswith("/models"):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"object":"list","data":[]}'})
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "more_body": True,
                "body": b"data: " + json.dumps(FIRST).encode() + b"\n\ndata: "})
    block = b"x" * 65536
    for _ in range(1024):
        await send({"type": "http.response.body", "body": block, "more_body": True})
    await asyncio.sleep(3600)


def test_an_endless_sse_line_is_a_502_in_the_clients_dialect():
    with ServerThread(endless_line) as upstream:
        settings = Settings(server=ServerSettings(), workers=(WorkerSettings(
            name="up", dialect="openai", url=upstream.url + "/v1", api_key="k",
            models=("m",), idle_timeout=30.0),))
        with ServerThread(create_app(settings)) as gateway, \
                openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0,
                              timeout=60) as client:
            stream = client.chat.completions.create(
                model="m", stream=True, messages=[{"role": "user", "content": "go"}])
            text = ""
            with pytest.raises(openai.APIError) as caught:
                for chunk in stream:
                    text += chunk.choices[0].delta.content or "" if chunk.choices else ""
            assert text == "hi"
            assert "longer than 16777216 bytes" in str(caught.value)
