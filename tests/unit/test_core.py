"""The canonical core: SSE decoding, the accumulator, the pool's choices."""

from __future__ import annotations

from typing import Any, AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pool.accumulate import Accumulator, fold, merge_usage
from pool.errors import BadRequest, NotFound, Overloaded
from pool.model import (
    ChatRequest, Finish, ImagePart, Message, ReasoningDelta, ReasoningEnd, ReasoningPart,
    Sampling, Start, TextDelta, TextPart, ToolCallDelta, ToolCallEnd, ToolCallPart,
    ToolCallStart, Usage,
)
from pool.pool import Pool
from pool.sse import SSEDecoder, SSEEvent
from pool.worker import Capabilities, WorkerState

# --- SSE ---------------------------------------------------------------------------------

RECORDED = (
    "event: message_start\ndata: {\"a\": 1}\n\n"
    ": a comment\n\n"
    "event: content_block_delta\r\ndata: {\"text\": \"h\u00e9llo \u2603\"}\r\n\r\n"
    "data: line one\ndata: line two\n\n"
    "id: 7\ndata:no-space\r\r"
    "data: [DONE]\n\n"
).encode()
EXPECTED = [
    SSEEvent("message_start", '{"a": 1}'),
    SSEEvent("content_block_delta", '{"text": "h\u00e9llo \u2603"}'),
    SSEEvent(None, "line one\nline two"),
    SSEEvent(None, "no-space", "7"),
    SSEEvent(None, "[DONE]", "7"),
]


def _decode(chunks: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    out: list[SSEEvent] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    return out + decoder.close()


def test_sse_whole():
    assert _decode([RECORDED]) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(RECORDED)))
def test_sse_split_at_every_byte(cut):
    assert _decode([RECORDED[:cut], RECORDED[cut:]]) == EXPECTED


@given(st.lists(st.integers(min_value=1, max_value=len(RECORDED) - 1), max_size=8))
def test_sse_split_anywhere_many_times(cuts):
    points = sorted(set(cuts))
    chunks = [RECORDED[a:b] for a, b in zip([0, *points], [*points, len(RECORDED)])]
    assert _decode(chunks) == EXPECTED


def test_sse_event_without_final_blank_line_is_dispatched_at_close():
    assert _decode([b"data: tail"]) == [SSEEvent(None, "tail")]


# ``\n`` line ends only (what feed_data's fast path takes), with what must still
# go line by line: several data lines, other fields, comments, runs of blank
# lines, a bare ``data``, multi-byte and invalid UTF-8.
PLAIN = (
    b'data: {"choices":[{"delta":{"content":"h\xc3\xa9llo \xe2\x98\x83"}}]}\n\n'
    b"data: {\"a\": 1}\n\n\n\n"
    b": keep-alive\n\n"
    b"event: content_block_delta\ndata: one\n\n"
    b"data: line one\ndata:line two\n\n"
    b"\ndata: after a blank line\n\n"
    b"data\n\n"
    b"id: 7\ndata: bad \xff bytes \xc3\n\n"
    b"data: [DONE]\n\n"
)
PLAIN_DATA = ['{"choices":[{"delta":{"content":"h\u00e9llo \u2603"}}]}', '{"a": 1}', "one",
              "line one\nline two", "after a blank line", "", "bad \ufffd bytes \ufffd", "[DONE]"]


def _decode_data(chunks: list[bytes]) -> list[str]:
    decoder = SSEDecoder()
    return [data for chunk in chunks for data in decoder.feed_data(chunk)] + decoder.close_data()


@pytest.mark.parametrize("raw", [PLAIN, RECORDED], ids=["lf", "mixed"])
def test_sse_data_whole_and_split_at_every_byte(raw):
    expected = [e.data for e in _decode([raw])]
    if raw is PLAIN:
        assert expected == PLAIN_DATA
    assert _decode_data([raw]) == expected
    for cut in range(1, len(raw)):
        assert _decode_data([raw[:cut], raw[cut:]]) == expected, cut


@given(st.lists(st.integers(min_value=1, max_value=len(PLAIN) - 1), max_size=8))
def test_sse_data_split_anywhere_many_times(cuts):
    points = sorted(set(cuts))
    chunks = [PLAIN[a:b] for a, b in zip([0, *points], [*points, len(PLAIN)])]
    assert _decode_data(chunks) == PLAIN_DATA


# --- accumulator -------------------------------------------------------------------------

def test_accumulator_folds_everything_in_order():
    completion = fold([
        Start(id="m1", model="x"),
        Usage(input_tokens=10),
        ReasoningDelta("thin"), ReasoningDelta("king"), ReasoningEnd(signature="sig=="),
        ReasoningEnd(redacted_data="opaque"),
        TextDelta("Hel"), TextDelta("lo"),
        ToolCallStart(0, "call_a", "f"), ToolCallStart(1, "call_b", "g"),
        ToolCallDelta(1, '{"y"'), ToolCallDelta(0, '{"x": 1}'), ToolCallDelta(1, ": 2}"),
        ToolCallEnd(0),
        Finish("tool_calls"),
        Usage(output_tokens=5, cached_tokens=2),
    ])
    assert completion.id == "m1" and completion.model == "x"
    assert completion.parts == [
        ReasoningPart("thinking", signature="sig=="),
        ReasoningPart("", redacted_data="opaque"),
        TextPart("Hello"),
        ToolCallPart("call_a", "f", '{"x": 1}'),
        ToolCallPart("call_b", "g", '{"y": 2}'),
    ]
    assert completion.finish == Finish("tool_calls")
    assert completion.usage == Usage(input_tokens=10, output_tokens=5, cached_tokens=2)
    assert completion.text == "Hello" and len(completion.tool_calls) == 2


def test_accumulator_open_reasoning_then_redacted_keeps_both():
    completion = fold([ReasoningDelta("visible"), ReasoningEnd(redacted_data="r")])
    assert completion.parts == [ReasoningPart("visible"), ReasoningPart("", redacted_data="r")]


def test_merge_usage_latest_non_none_wins():
    assert merge_usage(Usage(1, 2, 3), Usage(None, 7)) == Usage(1, 7, 3)


@given(st.lists(st.text(max_size=5), max_size=20))
def test_text_deltas_concatenate(pieces):
    acc = Accumulator()
    for p in pieces:
        acc.feed(TextDelta(p))
    assert acc.finish().text == "".join(pieces)


# --- pool ----------------------------------------------------------------------------------

class StubWorker:
    """A worker of the test's own: the pool only reads these attributes."""

    kind = "test"

    def __init__(self, name: str, models: tuple[str, ...], aliases: dict[str, str] | None = None,
                 caps: Capabilities | None = None) -> None:
        self.name = name
        self.models = models
        self.aliases = aliases or {}
        self.capabilities = caps or Capabilities()
        self.state = WorkerState.READY

    async def stream(self, request: ChatRequest) -> AsyncIterator[Any]:  # pragma: no cover
        yield Start()

    async def start(self) -> None:
        self.state = WorkerState.READY

    async def health(self) -> bool:
        return True

    async def aclose(self) -> None:
        self.state = WorkerState.STOPPED


def _req(model: str, **kw: Any) -> ChatRequest:
    return ChatRequest(model=model, dialect="openai_chat",
                       messages=(Message("user", (TextPart("hi"),)),), **kw)


def test_pool_resolves_models_and_aliases():
    a = StubWorker("a", ("m1",), {"fast": "m1"})
    b = StubWorker("b", ("m2",))
    pool = Pool([a, b])
    assert pool.resolve("fast") == "m1" and pool.resolve("m2") == "m2"
    worker, routed = pool.pick(_req("fast"))
    assert worker is a and routed.model == "m1"
    with pytest.raises(NotFound) as err:
        pool.pick(_req("nope"))
    assert err.value.param == "model"
    assert [(e.id, e.alias_of) for e in pool.models()] == [("m1", None), ("fast", "m1"),
                                                           ("m2", None)]


def test_glob_aliases_and_the_default_model():
    a = StubWorker("a", ("sonnet",), {"claude-*": "sonnet", "claude-3-haiku": "sonnet"})
    b = StubWorker("b", ("haiku",), {"claude-*-haiku-*": "haiku"})
    pool = Pool([b, a])
    assert pool.resolve("claude-3-5-haiku-20241022") == "haiku"  # first matching glob wins
    assert pool.resolve("claude-opus-4-8") == "sonnet"
    assert pool.resolve("claude-3-haiku") == "sonnet"  # a plain alias before any glob
    assert [e.id for e in pool.models()] == ["haiku", "sonnet", "claude-3-haiku"]  # no globs
    with pytest.raises(NotFound):
        pool.resolve("gpt-4o")
    assert pool.model_label("gpt-4o") == "unknown"
    fallback = Pool([b, a], default_model="sonnet")
    assert fallback.resolve("gpt-4o") == "sonnet" and fallback.model_label("gpt-4o") == "sonnet"
    assert fallback.pick(_req("anything"))[1].model == "sonnet"
    with pytest.raises(ValueError):
        Pool([a], default_model="nope")


def test_pool_prefers_least_in_flight_and_skips_unready():
    a, b = StubWorker("a", ("m",)), StubWorker("b", ("m",))
    pool = Pool([a, b])
    pool.acquire(a)
    assert pool.pick(_req("m"))[0] is b
    b.state = WorkerState.UNHEALTHY
    assert pool.pick(_req("m"))[0] is a
    a.state = WorkerState.DRAINING
    with pytest.raises(Overloaded):
        pool.pick(_req("m"))
    assert pool.ready_models() == {"m": False}


@pytest.mark.parametrize(("caps", "request_kw", "param"), [
    (Capabilities(max_n=1), {"sampling": Sampling(n=2)}, "n"),
    (Capabilities(logprobs=False), {"logprobs": True}, "logprobs"),
    (Capabilities(images=False), {"messages": (Message("user", (ImagePart(url="http://x/i.png"),)),)},
     "messages"),
])
def test_pool_refuses_what_the_worker_cannot_honour(caps, request_kw, param):
    pool = Pool([StubWorker("a", ("m",), caps=caps)])
    kw = {"model": "m", "dialect": "openai_chat",
          "messages": (Message("user", (TextPart("hi"),)),), **request_kw}
    with pytest.raises(BadRequest) as err:
        pool.pick(ChatRequest(**kw))
    assert err.value.param == param


def test_cooldown_skips_a_failed_worker_until_it_restarts():
    a, b = StubWorker("a", ("m",)), StubWorker("b", ("m",))
    a.restarts = 0
    pool = Pool([a, b])
    pool.cool_down("a", 60)
    assert [w.name for w in pool.eligible(_req("m"))[0]] == ["b"]
    b.state = WorkerState.UNHEALTHY
    assert [w.name for w in pool.eligible(_req("m"))[0]] == ["a"]  # better than nothing
    b.state = WorkerState.READY
    a.restarts = 1  # replaced: the cooldown no longer applies
    assert [w.name for w in pool.eligible(_req("m"))[0]] == ["a", "b"]
