"""Both ``remote`` workers against fake upstreams on real sockets."""

from __future__ import annotations

import asyncio
import copy
import socket
import sys
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import anthropic
import openai
import orjson
import pytest
import structlog

from pool.accumulate import accumulate
from pool.errors import (
    BadRequest, GatewayError, UpstreamCredentialsRefused, UpstreamError, UpstreamTimeout,
    UpstreamUnavailable,
)
from pool.model import (
    ChatRequest, Completion, Event, Message, ReasoningPart, Sampling, Start, TextDelta, TextPart,
    ToolCallPart, ToolResultPart,
)
from pool.remote import RemoteSpec, make_remote_worker
from pool.remote.policy import PassPolicy
from pool.worker import Worker, WorkerState
from tests.fakes import FakeUpstream, reasoning_for, signature_for

KEY = "sk-fake-upstream-key-0123456789"
DIALECTS = ["openai", "anthropic"]
MODES = [pytest.param(False, id="body"), pytest.param(True, id="stream")]

MakeWorker = Callable[..., Awaitable[Worker]]


@pytest.fixture(scope="module")
def fake() -> Any:
    with FakeUpstream(api_key=KEY) as upstream:
        yield upstream


@pytest.fixture
async def make(fake: FakeUpstream) -> AsyncIterator[MakeWorker]:
    workers: list[Worker] = []

    async def build(dialect: str, *, url: str | None = None, **kw: Any) -> Worker:
        kw.setdefault("api_key", KEY)
        worker = make_remote_worker(RemoteSpec(
            name=f"{dialect}-up", dialect=dialect,
            url=url or (fake.url if dialect == "openai" else fake.anthropic_url),
            models=("fake-model",), **kw))
        await worker.start()
        workers.append(worker)
        return worker

    yield build
    for worker in workers:
        await worker.aclose()


def chat(*messages: Message | str, stream: bool = False, **kw: Any) -> ChatRequest:
    msgs = tuple(Message("user", (TextPart(m),)) if isinstance(m, str) else m for m in messages)
    kw.setdefault("dialect", "native")
    return ChatRequest(model="fake-model", messages=msgs, stream=stream, **kw)


async def collect(worker: Worker, request: ChatRequest) -> list[Event]:
    return [event async for event in worker.stream(request)]


async def complete(worker: Worker, request: ChatRequest) -> tuple[list[Event], Completion]:
    events = await collect(worker, request)

    async def replay() -> AsyncIterator[Event]:
        for event in events:
            yield event

    return events, await accumulate(replay())


def chat_path(dialect: str) -> str:
    return "/v1/chat/completions" if dialect == "openai" else "/v1/messages"


# --- answers ---------------------------------------------------------------------------

@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_text(make: MakeWorker, fake: FakeUpstream, dialect: str, stream: bool) -> None:
    worker = await make(dialect)
    assert worker.state is WorkerState.READY and worker.kind == "remote"
    events, done = await complete(worker, chat("hello   big world", stream=stream))
    assert type(events[0]) is Start and events[0].model == "fake-model" and events[0].id
    assert done.text == "echo: hello big world"
    assert done.finish is not None and done.finish.reason == "stop"
    assert done.usage.output_tokens == 4 and done.usage.input_tokens > 0
    assert sum(type(e) is TextDelta for e in events) == (4 if stream else 1)
    path, headers, body = fake.last
    assert path == chat_path(dialect) and body.get("stream", False) is stream
    assert headers["accept-encoding"] == "identity"
    if dialect == "openai":
        assert headers["authorization"] == f"Bearer {KEY}" and "x-api-key" not in headers
    else:
        assert headers["x-api-key"] == KEY and "authorization" not in headers
        assert headers["anthropic-version"] == "2023-06-01"


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_parallel_tool_calls(make: MakeWorker, dialect: str, stream: bool) -> None:
    worker = await make(dialect)
    _, done = await complete(worker, chat(
        'weather? [[tools:weather {"city": "Paris", "units": ["C"]} clock]]', stream=stream))
    calls = done.tool_calls
    assert [c.name for c in calls] == ["weather", "clock"]
    assert [orjson.loads(c.arguments) for c in calls] == [{"city": "Paris", "units": ["C"]}, {}]
    assert calls[0].id != calls[1].id
    assert done.finish is not None and done.finish.reason == "tool_calls"


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_tool_result_round(make: MakeWorker, fake: FakeUpstream, dialect: str,
                                 stream: bool) -> None:
    worker = await make(dialect)
    call = ToolCallPart("call_9", "weather", '{"city": "Paris"}')
    request = chat("weather in Paris?", Message("assistant", (TextPart("Checking."), call)),
                   Message("user", (ToolResultPart("call_9", (TextPart("sunny, 21C"),)),)),
                   stream=stream)
    _, done = await complete(worker, request)
    assert done.text == "tool said: sunny, 21C"
    sent = fake.last.body["messages"]
    if dialect == "openai":
        assert sent[-1] == {"role": "tool", "tool_call_id": "call_9", "content": "sunny, 21C"}
        assert sent[-2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    else:
        assert sent[-1]["content"][0] == {"type": "tool_result", "tool_use_id": "call_9",
                                          "content": [{"type": "text", "text": "sunny, 21C"}]}
        assert sent[-2]["content"][1]["input"] == {"city": "Paris"}


@pytest.mark.parametrize("stream", MODES)
async def test_thinking_signature_round_trips_byte_for_byte(make: MakeWorker, fake: FakeUpstream,
                                                            stream: bool) -> None:
    worker = await make("anthropic")
    _, done = await complete(worker, chat("why? [[think]]", stream=stream))
    reasoning = done.parts[0]
    assert isinstance(reasoning, ReasoningPart)
    assert reasoning.text == reasoning_for("why?")
    assert reasoning.signature == signature_for(reasoning_for("why?"))
    assert done.text == "echo: why?"
    # the next turn carries the block back untouched
    await collect(worker, chat("why?", Message("assistant", tuple(done.parts)), "go on",
                               stream=stream))
    assert fake.last.body["messages"][1]["content"][0] == {
        "type": "thinking", "thinking": reasoning.text, "signature": reasoning.signature}


@pytest.mark.parametrize("stream", MODES)
async def test_openai_reasoning_and_logprobs(make: MakeWorker, stream: bool) -> None:
    worker = await make("openai")
    _, done = await complete(worker, chat("why not [[think]]", stream=stream, logprobs=True,
                                          top_logprobs=2))
    assert isinstance(done.parts[0], ReasoningPart)
    assert done.parts[0].text == reasoning_for("why not")
    assert done.usage.reasoning_tokens == 4  # "Thinking about: why not"
    assert [t.token for t in done.logprobs] == ["echo: ", "why ", "not"]
    assert all(len(t.top) == 2 and t.bytes == tuple(t.token.encode()) for t in done.logprobs)


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_max_tokens_and_stop_sequences(make: MakeWorker, dialect: str,
                                             stream: bool) -> None:
    worker = await make(dialect)
    _, done = await complete(worker, chat("one two three", stream=stream,
                                          sampling=Sampling(max_tokens=2)))
    assert (done.text, done.finish.reason) == ("echo: one ", "length")
    _, done = await complete(worker, chat("one two three", stream=stream,
                                          sampling=Sampling(stop=("three", "two"))))
    assert done.text == "echo: one "
    assert (done.finish.reason, done.finish.stop_sequence) == ("stop_sequence", "two")


# --- same-dialect pass-through -----------------------------------------------------------

@pytest.mark.parametrize("stream", MODES)
async def test_openai_passthrough_keeps_unknown_fields(make: MakeWorker, fake: FakeUpstream,
                                                       stream: bool) -> None:
    worker = await make("openai")
    raw = {"model": "client-alias", "messages": [{"role": "user", "content": "hi there"}],
           "frequency_penalty": 0.25, "logit_bias": {"50256": -100}, "service_tier": "flex",
           "stream": stream, "prompt_cache_key": "pk"}
    before = copy.deepcopy(raw)
    _, done = await complete(worker, chat("ignored", stream=stream, dialect="openai_chat",
                                          raw=raw))
    assert done.text == "echo: hi there"
    assert done.usage.cached_tokens == done.usage.input_tokens // 2
    # service_tier would bill the operator's account differently: not passed by default
    expected = {k: v for k, v in raw.items() if k != "service_tier"} | {"model": "fake-model"}
    if stream:
        expected["stream_options"] = {"include_usage": True}
    assert fake.last.body == expected
    assert raw == before


@pytest.mark.parametrize("stream", MODES)
async def test_anthropic_passthrough_keeps_fields_and_beta_headers(
        make: MakeWorker, fake: FakeUpstream, stream: bool) -> None:
    worker = await make("anthropic")
    raw = {"model": "client-alias", "max_tokens": 64000, "stream": stream,
           "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
           "messages": [{"role": "user", "content": [{"type": "text", "text": "hi there",
                                                      "cache_control": {"type": "ephemeral"}}]}],
           "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
           "output_config": {"effort": "high"}, "thinking": {"type": "adaptive"}}
    before = copy.deepcopy(raw)
    beta = "claude-code-20250219,interleaved-thinking-2025-05-14"
    request = chat("ignored", stream=stream, dialect="anthropic", raw=raw,
                   passthrough_headers={"anthropic-beta": beta, "anthropic-version": "2099-01-01"})
    _, done = await complete(worker, request)
    assert done.text == "echo: hi there"
    # the fake reports cache reads/writes for bodies with cache_control
    usage = done.usage
    assert usage.cached_tokens == usage.input_tokens // 2
    assert usage.cache_creation_tokens == usage.input_tokens // 4
    _, headers, body = fake.last
    assert body == {**raw, "model": "fake-model"}
    assert headers["anthropic-beta"] == beta and headers["anthropic-version"] == "2099-01-01"
    assert raw == before


async def test_anthropic_version_defaults_when_client_sent_none(make: MakeWorker,
                                                                fake: FakeUpstream) -> None:
    worker = await make("anthropic", policy=PassPolicy(pass_betas=frozenset({"b1"})))
    raw = {"model": "a", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    await collect(worker, chat("x", dialect="anthropic", raw=raw,
                               passthrough_headers={"anthropic-beta": "b1,web-fetch-2025-09-10"}))
    assert fake.last.headers["anthropic-version"] == "2023-06-01"
    assert fake.last.headers["anthropic-beta"] == "b1"


async def test_a_passed_header_with_a_line_break_is_a_bad_request_and_nothing_is_sent(
        make: MakeWorker, fake: FakeUpstream) -> None:
    worker = await make("anthropic")
    raw = {"model": "a", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    before = len(fake.requests)
    request = chat("x", dialect="anthropic", raw=raw, passthrough_headers={
        "anthropic-version": "2023-06-01\r\nx-api-key: sk-someone-else"})
    with pytest.raises(BadRequest, match="anthropic-version") as refused:
        await collect(worker, request)
    assert refused.value.param == "anthropic-version"
    assert "sk-someone-else" not in str(refused.value)  # the value is not echoed
    assert len(fake.requests) == before
    await collect(worker, chat("x", dialect="anthropic", raw=raw))  # the worker goes on
    assert fake.last.headers["anthropic-version"] == "2023-06-01"


# --- failures ----------------------------------------------------------------------------

ERRORS = [
    (400, UpstreamError, 400, "invalid_request", None),
    (401, UpstreamCredentialsRefused, 502, "upstream", None),
    (403, UpstreamCredentialsRefused, 502, "upstream", None),
    (404, UpstreamError, 404, "not_found", None),
    (413, UpstreamError, 413, "request_too_large", None),
    (422, UpstreamError, 422, "invalid_request", None),
    (429, UpstreamError, 429, "rate_limit", 3.0),
    (529, UpstreamError, 529, "overloaded", 3.0),
    (500, UpstreamUnavailable, 502, "upstream", None),
    (503, UpstreamUnavailable, 502, "upstream", 3.0),
]


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("status, cls, out_status, kind, retry", ERRORS,
                         ids=[str(e[0]) for e in ERRORS])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_upstream_status_maps_to_error(make: MakeWorker, dialect: str, stream: bool,
                                             status: int, cls: type, out_status: int, kind: str,
                                             retry: float | None) -> None:
    worker = await make(dialect)
    events: list[Event] = []
    with structlog.testing.capture_logs() as logs, pytest.raises(cls) as info:
        async for event in worker.stream(chat(f"[[error:{status}]]", stream=stream)):
            events.append(event)
    exc = info.value
    assert events == []  # failed before the first event: the pool may retry elsewhere
    assert (exc.status, exc.kind, exc.retry_after) == (out_status, kind, retry)
    if status in (401, 403):  # our key refused: the client's is not at fault
        assert exc.message == "upstream credentials refused"
    elif status < 500 or status == 529:
        assert exc.message == f"fake upstream says {status}"
    else:
        assert exc.message == f"upstream {dialect}-up failed (HTTP {status})"
    if dialect == "openai" and status == 400:
        assert exc.param == "messages"
    assert KEY not in str(exc) and KEY not in repr(logs)
    assert any(log["event"] == "remote.upstream_status" for log in logs)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_wrong_key_is_refused_credentials_without_the_key(make: MakeWorker,
                                                                dialect: str) -> None:
    worker = await make(dialect, api_key="sk-wrong-key-42")
    with pytest.raises(UpstreamCredentialsRefused) as info:
        await collect(worker, chat("hi"))
    assert (info.value.status, info.value.kind) == (502, "upstream")
    assert worker.state is WorkerState.UNHEALTHY  # and the health probe keeps it so
    assert await worker.health() is False and worker.state is WorkerState.UNHEALTHY
    assert "sk-wrong-key-42" not in str(info.value)
    assert "sk-wrong-key-42" not in repr(worker)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_first_byte_timeout(make: MakeWorker, dialect: str) -> None:
    worker = await make(dialect, first_byte_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(UpstreamTimeout) as info:
        await collect(worker, chat("slow [[sleep:3]]", stream=True))
    assert info.value.status == 504 and "0.3s" in info.value.message
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_idle_timeout_mid_stream(make: MakeWorker, dialect: str) -> None:
    worker = await make(dialect, idle_timeout=0.3)
    events: list[Event] = []
    with pytest.raises(UpstreamTimeout) as info:
        async for event in worker.stream(chat("a b c d e [[hang-after:3]]", stream=True)):
            events.append(event)
    assert info.value.status == 504 and "stalled" in info.value.message
    assert type(events[0]) is Start


def _chat_answer(content: str) -> bytes:
    """An OpenAI chat completion's JSON body saying ``content``."""
    return orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                         "model": "fake-model", "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 3}})


def _chat_request() -> ChatRequest:
    """A non-stream chat request as the OpenAI dialect hands it over (its raw body too)."""
    return chat("hi", dialect="openai_chat", raw={
        "model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})


class _Trickling:
    """An OpenAI-compatible server (a fake of someone else's) that sends a JSON
    answer's headers and first half, pauses ``pause`` seconds, then the rest."""

    def __init__(self, body: bytes, pause: float) -> None:
        self.body, self.pause = body, pause
        self.handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def close(self) -> None:
        self.server.close()
        for task in self.handlers:
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        body = self.body
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET "):  # the health probe
                    listing = b'{"object":"list","data":[]}'
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(listing), listing))
                    continue
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length:")))
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(body) + body[:len(body) // 2])
                await writer.drain()
                await asyncio.sleep(self.pause)
                writer.write(body[len(body) // 2:])
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("pause", [0.05, 2.0])
async def test_a_body_that_comes_in_pieces_is_waited_for_within_the_idle_timeout(
        make: MakeWorker, pause: float) -> None:
    """A non-stream answer whose body is still coming after the headers: read
    to its end (a short pause), or a 504 once it stalls past idle_timeout."""
    answer = _chat_answer("in two pieces")
    upstream = _Trickling(answer, pause)
    url = await upstream.start()
    try:
        worker = await make("openai", url=url, idle_timeout=0.5)
        request = _chat_request()
        for relay in (None, worker.relay(request, "fake-model")):
            if pause < 0.5:
                whole = await worker.complete(request, relay)
                if relay is None:
                    assert whole.text == "in two pieces" and whole.usage.output_tokens == 3
                else:
                    assert whole == answer
            else:
                started = time.monotonic()
                with pytest.raises(UpstreamTimeout) as info:
                    await worker.complete(request, relay)
                assert "stalled" in info.value.message and time.monotonic() - started < 1.9
    finally:
        await upstream.close()


class _Flooding(_Trickling):
    """The same server, but while ``flood`` is set it answers with a
    content-length of 1 GiB and sends megabyte after megabyte of it."""

    flood = True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.flood:
            return await super()._serve(reader, writer)
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n{\"id\": \"" % 2**30)
            for _ in range(1024):  # stops when the worker hangs up
                writer.write(b"x" * 2**20)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_a_body_past_64_mib_fails_the_answer_and_drops_the_connection(
        make: MakeWorker) -> None:
    upstream = _Flooding(_chat_answer("small"), 0.0)
    url = await upstream.start()
    try:
        worker = await make("openai", url=url, max_connections=1)
        request = _chat_request()
        for relay in (None, worker.relay(request, "fake-model")):
            with pytest.raises(UpstreamUnavailable) as info:
                await worker.complete(request, relay)
            assert info.value.message == "upstream openai-up sent an answer over 64 MiB"
        upstream.flood = False  # the one connection's place is free for the next answer
        assert (await asyncio.wait_for(worker.complete(request), 10)).text == "small"
    finally:
        await upstream.close()


@pytest.mark.parametrize("marker", ["die-after", "truncate-after"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_stream_ending_early_is_a_failure(make: MakeWorker, dialect: str,
                                                marker: str) -> None:
    worker = await make(dialect)
    events: list[Event] = []
    with pytest.raises(UpstreamUnavailable) as info:
        async for event in worker.stream(chat(f"a b c d e [[{marker}:4]]", stream=True)):
            events.append(event)
    assert info.value.message == "upstream closed the stream early"
    assert info.value.status == 502
    assert type(events[0]) is Start


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_unreachable_upstream(make: MakeWorker, dialect: str) -> None:
    port = _closed_port()
    url = f"http://127.0.0.1:{port}" + ("/v1" if dialect == "openai" else "")
    worker = await make(dialect, url=url, connect_timeout=1.0)
    with pytest.raises(UpstreamUnavailable) as info:
        await collect(worker, chat("hi"))
    assert info.value.status == 502 and "cannot connect" in info.value.message
    assert await worker.health() is False
    assert worker.state is WorkerState.UNHEALTHY


@pytest.mark.skipif(sys.platform != "linux", reason="relies on Linux dropping SYNs to a full queue")
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_idle_timeout_mid_forwarded_stream(make: MakeWorker, dialect: str) -> None:
    worker = await make(dialect, idle_timeout=0.3)
    request = chat("a b c d e [[hang-after:3]]", stream=True,
                   dialect="openai_chat" if dialect == "openai" else "anthropic")
    relay = worker.relay(request, "fake-model")  # type: ignore[attr-defined]
    assert relay is not None
    items: list[Any] = []
    with pytest.raises(UpstreamTimeout) as info:
        async for item in worker.forward(request, relay):  # type: ignore[attr-defined]
            items.append(item)
    assert info.value.status == 504 and "stalled" in info.value.message
    assert items and all(type(i) is bytes and i.endswith(b"\n\n") for i in items)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_connect_timeout(make: MakeWorker, dialect: str) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = [socket.socket() for _ in range(4)]  # fill the accept queue, never accepted
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        try:
            url = f"http://127.0.0.1:{port}" + ("/v1" if dialect == "openai" else "")
            worker = await make(dialect, url=url, connect_timeout=0.2)
            with pytest.raises(UpstreamTimeout) as info:
                await collect(worker, chat("hi"))
        finally:
            for filler in fillers:
                filler.close()
    assert info.value.status == 504 and "connect" in info.value.message


async def test_a_stopped_worker_refuses_work(make: MakeWorker) -> None:
    worker = await make("openai")
    await worker.aclose()
    with pytest.raises(UpstreamUnavailable):
        await collect(worker, chat("hi"))
    assert await worker.health() is False


# --- the client going away ---------------------------------------------------------------

@pytest.mark.parametrize("dialect", DIALECTS)
async def test_closing_the_stream_disconnects_the_upstream(make: MakeWorker, fake: FakeUpstream,
                                                           dialect: str) -> None:
    worker = await make(dialect)
    before = fake.disconnects
    stream = worker.stream(chat("a b c d e f [[hang-after:4]]", stream=True))
    assert type(await anext(stream)) is Start
    await anext(stream)
    await stream.aclose()
    assert await fake.wait_disconnects(before + 1, timeout=3)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_cancelling_the_consumer_disconnects_the_upstream(make: MakeWorker,
                                                                fake: FakeUpstream,
                                                                dialect: str) -> None:
    worker = await make(dialect)
    before = fake.disconnects
    seen = asyncio.Event()

    async def consume() -> None:
        async for _ in worker.stream(chat("a b c d e f [[hang-after:4]]", stream=True)):
            seen.set()

    task = asyncio.create_task(consume())
    await seen.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await fake.wait_disconnects(before + 1, timeout=3)


# --- connections and health ----------------------------------------------------------------

@pytest.mark.parametrize("dialect", DIALECTS)
async def test_connections_are_reused(make: MakeWorker, fake: FakeUpstream, dialect: str) -> None:
    worker = await make(dialect)
    for stream in (True, True, False, True):
        await collect(worker, chat("again", stream=stream))
    assert len(set(fake.peers[-4:])) == 1


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_max_connections_queues_requests(make: MakeWorker, fake: FakeUpstream,
                                               dialect: str) -> None:
    worker = await make(dialect, max_connections=1)
    results = await asyncio.gather(*(collect(worker, chat(f"n{i}", stream=True))
                                     for i in range(4)))
    assert [[e.text for e in r if type(e) is TextDelta] for r in results] == [
        ["echo: ", f"n{i}"] for i in range(4)]
    assert len(set(fake.peers[-4:])) == 1


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_health(make: MakeWorker, fake: FakeUpstream, dialect: str) -> None:
    worker = await make(dialect)
    assert await worker.health() is True
    assert fake.requests[-1].path == "/v1/models"
    assert worker.capabilities.logprobs is (dialect == "openai")
    assert worker.capabilities.max_n == 1 and worker.capabilities.images


@pytest.mark.parametrize("forwarded", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_complete_reads_a_stream_sent_for_a_body(make: MakeWorker, fake: FakeUpstream,
                                                       dialect: str, forwarded: bool) -> None:
    """complete() of a non-stream request: the upstream's body (forwarded) or the
    folded answer; an upstream that streams anyway is read and folded all the same."""
    worker = await make(dialect)
    request = chat("hello world", dialect="openai_chat" if dialect == "openai" else "anthropic",
                   raw={"model": "fake-model", "max_tokens": 32,
                        "messages": [{"role": "user", "content": "hello world"}]})
    relay = worker.relay(request, "fake-model") if forwarded else None
    assert (relay is not None) is forwarded
    whole = await worker.complete(request, relay)
    if forwarded:
        assert type(whole) is bytes and orjson.loads(whole)["model"] == "fake-model"
        assert whole == fake.answers[-1]  # the upstream's bytes (the model name was the same)
    else:
        assert whole.text == "echo: hello world" and whole.usage.output_tokens == 3
    fake.always_stream = True
    try:
        whole = await worker.complete(request, worker.relay(request, "fake-model")
                                      if forwarded else None)
    finally:
        fake.always_stream = False
    assert whole.text == "echo: hello world"
    assert whole.finish is not None and whole.finish.reason == "stop"
    # an OpenAI stream carries usage only when asked (stream_options), which a body request is not
    assert whole.usage.output_tokens == (3 if dialect == "anthropic" else None)


async def test_a_missed_probe_does_not_take_out_a_worker_that_answers(
        make: MakeWorker, fake: FakeUpstream) -> None:
    """A probe that times out right after the upstream answered requests (a
    saturated gateway reads its answer late) leaves the worker ready; a second
    one with nothing answered in between takes it out; a good probe brings it back."""
    worker = await make("openai", first_byte_timeout=0.3)
    await complete(worker, chat("hi"))
    fake.models_delay = 1.0
    try:
        with structlog.testing.capture_logs() as logs:
            assert await worker.health() is False
        assert worker.state is WorkerState.READY
        assert [r["event"] for r in logs] == ["remote.probe_missed"]
        assert await worker.health() is False
        assert worker.state is WorkerState.UNHEALTHY
    finally:
        fake.models_delay = 0.0
    assert await worker.health() is True and worker.state is WorkerState.READY


async def test_health_follows_the_upstream(make: MakeWorker) -> None:
    other = FakeUpstream().start()
    try:
        worker = await make("anthropic", url=other.anthropic_url, api_key=None)
        assert await worker.health() is True
    finally:
        other.stop()
    assert await worker.health() is False
    assert worker.state is WorkerState.UNHEALTHY
    await worker.aclose()
    assert worker.state is WorkerState.STOPPED


# --- the fakes speak well enough for the real SDKs ---------------------------------------------

async def test_fake_serves_the_openai_sdk(fake: FakeUpstream) -> None:
    async with openai.AsyncOpenAI(base_url=fake.url, api_key=KEY, max_retries=0) as client:
        reply = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi [[tool:f {\"a\": 1}]]"}])
        assert reply.choices[0].message.tool_calls[0].function.arguments == '{"a":1}'
        stream = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi you"}], stream=True,
            stream_options={"include_usage": True})
        text = [c.choices[0].delta.content async for c in stream if c.choices]
        assert "".join(t or "" for t in text) == "echo: hi you"
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "[[error:429]]"}])


async def test_fake_serves_the_anthropic_sdk(fake: FakeUpstream) -> None:
    async with anthropic.AsyncAnthropic(base_url=fake.anthropic_url, api_key=KEY,
                                        max_retries=0) as client:
        async with client.messages.stream(
                model="fake-model", max_tokens=100,
                messages=[{"role": "user", "content": "hi [[think]]"}]) as stream:
            message = await stream.get_final_message()
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.content[0].signature == signature_for(reasoning_for("hi"))
        count = await client.messages.count_tokens(
            model="fake-model", messages=[{"role": "user", "content": "hello"}])
        assert count.input_tokens > 0
        with pytest.raises(anthropic.InternalServerError) as info:
            await client.messages.create(model="fake-model", max_tokens=10,
                                         messages=[{"role": "user", "content": "[[error:529]]"}])
        assert info.value.status_code == 529


def test_errors_are_gateway_errors() -> None:
    assert issubclass(UpstreamError, GatewayError) and issubclass(UpstreamTimeout, GatewayError)
