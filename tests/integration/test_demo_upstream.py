"""The demo upstream, driven by the real OpenAI and Anthropic SDKs and by raw HTTP."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import anthropic
import httpx
import openai
import pytest

from app.demo_upstream import DemoUpstream, start_demo_upstream
from pool.sse import SSEDecoder

ROOT = Path(__file__).resolve().parents[2]
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Weather in a city",
                  "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
ASK_TOOL = 'What is the weather? [[tool:get_weather {"city": "Paris"}]]'
ADVICE = "Configure a worker in poolgate.toml to reach a real model."


@pytest.fixture(scope="module")
def upstream() -> Iterator[DemoUpstream]:
    """One server on its own loop thread, so sync SDK clients can block on it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(start_demo_upstream(), loop).result(5)
    yield server
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def oai(up: DemoUpstream) -> openai.OpenAI:
    return openai.OpenAI(base_url=up.openai_url, api_key="sk-demo", max_retries=0)


def ant(up: DemoUpstream) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=up.anthropic_url, api_key="sk-demo", max_retries=0)


# ---------------------------------------------------------------- OpenAI SDK
def test_openai_sync_reply_quotes_the_last_user_message(upstream: DemoUpstream) -> None:
    with oai(upstream) as client:
        r = client.chat.completions.create(model="demo", messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "Hello  there,\nfriend"}]}])
    assert r.choices[0].message.content == (
        f"poolgate demo model: you said “Hello there, friend”. {ADVICE}")
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == len(r.choices[0].message.content.split())
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


async def test_openai_async_stream_matches_non_stream(upstream: DemoUpstream) -> None:
    messages = [{"role": "user", "content": "stream me"}]
    async with openai.AsyncOpenAI(base_url=upstream.openai_url, api_key="k",
                                  max_retries=0) as client:
        whole = await client.chat.completions.create(model="demo", messages=messages)
        stream = await client.chat.completions.create(
            model="demo", messages=messages, stream=True,
            stream_options={"include_usage": True})
        chunks = [c async for c in stream]
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(content) == whole.choices[0].message.content
    assert len(content) == whole.usage.completion_tokens       # one word per chunk
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(content)


@pytest.mark.parametrize(("stream", "limit"), [(False, 3), (True, 3), (True, 1)])
def test_openai_max_tokens_is_a_chunk_limit(upstream: DemoUpstream, stream: bool,
                                            limit: int) -> None:
    with oai(upstream) as client:
        args = dict(model="demo", max_tokens=limit,
                    messages=[{"role": "user", "content": "a long enough message"}])
        if not stream:
            r = client.chat.completions.create(**args)
            assert r.choices[0].finish_reason == "length"
            assert r.choices[0].message.content.split() == ["poolgate", "demo", "model:"][:limit]
            assert r.usage.completion_tokens == limit
            return
        chunks = list(client.chat.completions.create(**args, stream=True))
    content = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert len(content) == limit
    assert chunks[-1].choices[0].finish_reason == "length"


def test_openai_tool_round_trip(upstream: DemoUpstream) -> None:
    with oai(upstream) as client:
        first = client.chat.completions.create(
            model="demo", tools=[TOOL], messages=[{"role": "user", "content": ASK_TOOL}])
        call = first.choices[0].message.tool_calls[0]
        streamed = list(client.chat.completions.create(
            model="demo", tools=[TOOL], stream=True,
            messages=[{"role": "user", "content": ASK_TOOL}]))
        second = client.chat.completions.create(model="demo", tools=[TOOL], messages=[
            {"role": "user", "content": ASK_TOOL},
            {"role": "assistant", "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}])
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    deltas = [c.choices[0].delta.tool_calls[0] for c in streamed if c.choices[0].delta.tool_calls]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments for d in deltas)) == {"city": "Paris"}
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
    assert second.choices[0].message.content.startswith(
        "poolgate demo model: the tool returned “sunny, 21 C”.")


def test_tool_marker_without_that_tool_offered_is_quoted(upstream: DemoUpstream) -> None:
    with oai(upstream) as client:
        r = client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": ASK_TOOL}])
    assert r.choices[0].message.tool_calls is None
    assert "[[tool:get_weather" in r.choices[0].message.content


def test_openai_models_list(upstream: DemoUpstream) -> None:
    with oai(upstream) as client:
        assert [m.id for m in client.models.list()] == ["poolgate-demo"]


# ---------------------------------------------------------------- Anthropic SDK
def test_anthropic_sync_reply_and_usage(upstream: DemoUpstream) -> None:
    with ant(upstream) as client:
        r = client.messages.create(model="demo-claude", max_tokens=100, system="be brief",
                                   messages=[{"role": "user", "content": [
                                       {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                       {"type": "text", "text": "Hi Claude"}]}])
        tokens = client.messages.count_tokens(model="demo-claude", messages=[
            {"role": "user", "content": "Hi Claude"}])
        models = [m.id for m in client.models.list()]
    assert r.content[0].text == f"poolgate demo model: you said “Hi Claude”. {ADVICE}"
    assert r.stop_reason == "end_turn" and r.model == "demo-claude"
    assert r.usage.output_tokens == len(r.content[0].text.split()) and r.usage.input_tokens > 0
    assert tokens.input_tokens > 0
    assert models == ["poolgate-demo"]


async def test_anthropic_async_stream_matches_non_stream(upstream: DemoUpstream) -> None:
    messages = [{"role": "user", "content": "stream me please"}]
    async with anthropic.AsyncAnthropic(base_url=upstream.anthropic_url, api_key="k",
                                        max_retries=0) as client:
        whole = await client.messages.create(model="c", max_tokens=64, messages=messages)
        async with client.messages.stream(model="c", max_tokens=64, messages=messages) as s:
            pieces = [t async for t in s.text_stream]
            final = await s.get_final_message()
    assert "".join(pieces) == whole.content[0].text == final.content[0].text
    assert len(pieces) == final.usage.output_tokens
    assert final.stop_reason == "end_turn"


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_max_tokens_stops_early(upstream: DemoUpstream, stream: bool) -> None:
    with ant(upstream) as client:
        args = dict(model="c", max_tokens=2, messages=[{"role": "user", "content": "hello"}])
        if stream:
            with client.messages.stream(**args) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**args)
    assert msg.stop_reason == "max_tokens"
    assert msg.content[0].text == "poolgate demo" and msg.usage.output_tokens == 2


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_round_trip(upstream: DemoUpstream, stream: bool) -> None:
    ask = [{"role": "user", "content": ASK_TOOL}]
    with ant(upstream) as client:
        if stream:
            with client.messages.stream(model="c", max_tokens=100, tools=[ANTHROPIC_TOOL],
                                        messages=ask) as s:
                first = s.get_final_message()
        else:
            first = client.messages.create(model="c", max_tokens=100, tools=[ANTHROPIC_TOOL],
                                           messages=ask)
        use = first.content[0]
        second = client.messages.create(model="c", max_tokens=100, tools=[ANTHROPIC_TOOL],
                                        messages=[*ask, {"role": "assistant", "content": [use.model_dump()]},
                                                  {"role": "user", "content": [{
                                                      "type": "tool_result", "tool_use_id": use.id,
                                                      "content": [{"type": "text", "text": "rain"}]}]}])
    assert first.stop_reason == "tool_use"
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert second.content[0].text.startswith("poolgate demo model: the tool returned “rain”.")


# ---------------------------------------------------------------- raw HTTP
ANTHROPIC_GRAMMAR = ["message_start", "content_block_start", "ping", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]


async def test_anthropic_sse_grammar(upstream: DemoUpstream) -> None:
    body = {"model": "c-n5", "max_tokens": 50, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    decoder = SSEDecoder()
    async with httpx.AsyncClient() as client:
        async with client.stream("POST", upstream.anthropic_url + "/v1/messages?beta=true",
                                 json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [e async for raw in r.aiter_raw() for e in decoder.feed(raw)]
    events += decoder.close()
    names = [e.event for e in events]
    assert all(json.loads(e.data)["type"] == e.event for e in events)
    assert [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n] == ANTHROPIC_GRAMMAR
    assert names.count("content_block_delta") == 5                     # the -n5 knob


async def test_openai_sse_ends_with_usage_then_done(upstream: DemoUpstream) -> None:
    body = {"model": "demo", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}]}
    decoder = SSEDecoder()
    async with aiohttp.ClientSession() as session:
        async with session.post(upstream.openai_url + "/chat/completions", json=body) as r:
            events = [e async for raw in r.content.iter_any() for e in decoder.feed(raw)]
    assert all(e.event is None for e in events)
    assert events[-1].data == "[DONE]"
    chunks = [json.loads(e.data) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])


async def test_keep_alive_reuses_one_connection(upstream: DemoUpstream) -> None:
    created = []
    trace = aiohttp.TraceConfig()

    async def on_create(session, ctx, params) -> None:
        created.append(params)

    trace.on_connection_create_end.append(on_create)
    body = {"model": "demo", "messages": [{"role": "user", "content": "again"}]}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1),
                                     trace_configs=[trace]) as session:
        for stream in (False, True, False, True, False):
            async with session.post(upstream.openai_url + "/chat/completions",
                                    json={**body, "stream": stream}) as r:
                assert r.status == 200
                await r.read()
    assert len(created) == 1


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response: content-length or chunked."""
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        headers[name.lower()] = value.strip()
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while size := int((await reader.readline()).strip(), 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readexactly(2)
    return status, headers, body


def post(path: str, body: dict | bytes, extra: str = "") -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n{extra}\r\n").encode() + data


async def test_pipelined_requests_are_answered_in_order(upstream: DemoUpstream) -> None:
    msg = {"model": "c-d2", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    reader, writer = await asyncio.open_connection("127.0.0.1", upstream.port)
    writer.write(post("/v1/messages", {**msg, "stream": True}) + post("/v1/messages", msg)
                 + post("/v1/messages/count_tokens", msg) + b"GET /v1/models HTTP/1.1\r\n\r\n")
    first, second, third, fourth = [await read_response(reader) for _ in range(4)]
    writer.close()
    await writer.wait_closed()
    assert first[1]["content-type"].startswith("text/event-stream")
    assert first[2].rstrip().endswith(b'data: {"type":"message_stop"}')
    assert json.loads(second[2])["content"][0]["text"].startswith("poolgate demo model:")
    assert json.loads(third[2])["input_tokens"] > 0
    assert json.loads(fourth[2])["data"][0]["id"] == "poolgate-demo"


async def test_request_split_into_single_bytes(upstream: DemoUpstream) -> None:
    raw = post("/v1/chat/completions",
               {"model": "demo", "messages": [{"role": "user", "content": "split ü"}]})
    reader, writer = await asyncio.open_connection("127.0.0.1", upstream.port)
    for i in range(len(raw)):
        writer.write(raw[i:i + 1])
        if i % 16 == 0:
            await writer.drain()
            await asyncio.sleep(0)
    status, _, body = await read_response(reader)
    writer.close()
    await writer.wait_closed()
    assert status == 200
    assert "“split ü”" in json.loads(body)["choices"][0]["message"]["content"]


@pytest.mark.parametrize(("request_bytes", "status", "envelope"), [
    (post("/v1/chat/completions", b"{nope"), 400, "openai"),
    (post("/v1/messages", {"model": "c", "messages": "hi"}), 400, "anthropic"),
    (post("/v1/chat/completions", {"model": "m", "max_tokens": 0, "messages": []}), 400, "openai"),
    (post("/v1/embeddings", {}), 404, "openai"),
    (b"GET /v1/messages HTTP/1.1\r\n\r\n", 405, "anthropic"),
])
async def test_errors_use_the_dialect_envelope(upstream: DemoUpstream, request_bytes: bytes,
                                               status: int, envelope: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", upstream.port)
    writer.write(request_bytes)
    got, _, body = await read_response(reader)
    writer.close()
    await writer.wait_closed()
    error = json.loads(body)
    assert got == status
    if envelope == "anthropic":
        assert error["type"] == "error" and error["error"]["message"]
    else:
        assert error["error"]["type"] and error["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_connection_close_is_honoured(upstream: DemoUpstream, stream: bool) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", upstream.port)
    writer.write(post("/v1/messages", {"model": "c", "max_tokens": 3, "stream": stream,
                                       "messages": []}, "connection: close\r\n"))
    data = await asyncio.wait_for(reader.read(), 5)                 # until the server closes
    writer.close()
    await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"connection: close" in head and b"keep-alive" not in head
    assert body.endswith(b"0\r\n\r\n" if stream else b"}")


async def test_http_1_0_stream_is_close_delimited(upstream: DemoUpstream) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", upstream.port)
    raw = post("/v1/chat/completions", {"model": "m", "stream": True, "messages": []})
    writer.write(raw.replace(b"HTTP/1.1", b"HTTP/1.0", 1))
    data = await asyncio.wait_for(reader.read(), 5)                 # until the server closes
    writer.close()
    await writer.wait_closed()
    assert b"transfer-encoding" not in data.split(b"\r\n\r\n")[0]
    assert data.endswith(b"data: [DONE]\n\n")


async def test_delay_knob_paces_chunks() -> None:
    up = await start_demo_upstream()
    try:
        async with openai.AsyncOpenAI(base_url=up.openai_url, api_key="k", max_retries=0) as c:
            start = time.perf_counter()
            stream = await c.chat.completions.create(model="m-d20-n5", stream=True,
                                                     messages=[{"role": "user", "content": "x"}])
            stamps = [time.perf_counter() async for ch in stream
                      if ch.choices and ch.choices[0].delta.content]
    finally:
        await up.close()
    assert len(stamps) == 5
    assert stamps[-1] - stamps[0] >= 4 * 0.020 * 0.9
    assert stamps[0] - start < 0.5


async def test_close_stops_listening_and_drops_streams() -> None:
    up = await start_demo_upstream()
    reader, writer = await asyncio.open_connection("127.0.0.1", up.port)
    writer.write(post("/v1/messages", {"model": "c-d1000", "stream": True, "max_tokens": 9,
                                       "messages": [{"role": "user", "content": "slow"}]}))
    await reader.readuntil(b"event: ping")
    await up.close()
    assert await asyncio.wait_for(reader.read(), 5) == b"" or reader.at_eof()
    writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", up.port)
    assert up.stats["messages_stream"] == 1


def test_standalone_module_serves_until_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "app.demo_upstream", "--port", "0",
                             "--model", "a", "--model", "b"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = line.split()[3]
        models = httpx.get(url + "/v1/models", timeout=5).json()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert line.startswith("demo upstream on http://127.0.0.1:")
    assert [m["id"] for m in models["data"]] == ["a", "b"]
