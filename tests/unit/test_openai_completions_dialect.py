"""The legacy OpenAI Completions dialect: decode, non-stream encode, stream encode.

Encoded output is fed to the real ``openai`` SDK through an in-memory
transport, so "valid" means "the SDK parses it".
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest

from app.dialects import openai_completions as cmpl
from pool.accumulate import fold
from pool.errors import BadRequest, UpstreamUnavailable
from pool.model import (
    Completion, Finish, Logprobs, Message, ReasoningDelta, Sampling, Start, TextDelta, TextPart,
    TokenLogprob, ToolCallDelta, ToolCallStart, Usage,
)
from pool.sse import SSEDecoder


def body(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "m", "prompt": "Say hi"}
    out.update(fields)
    return out


# --- decode ------------------------------------------------------------------------

def test_decode_minimal() -> None:
    raw = body()
    request = cmpl.decode(raw)
    assert request.raw is raw
    assert request.dialect == "openai_completions"
    assert request.model == "m" and request.stream is False
    assert request.messages == (Message("user", (TextPart("Say hi"),)),)
    assert request.prompt == "Say hi" and request.prompt_ids is None
    assert request.sampling == Sampling(max_tokens=16)  # OpenAI's default
    assert request.logprobs is False and request.top_logprobs is None
    assert request.tools == () and request.tool_choice is None


def test_decode_every_supported_field() -> None:
    request = cmpl.decode(body(
        prompt=["only one"], max_tokens=50, stop=["\n", "END"], temperature=0.5, top_p=0.9,
        seed=7, n=2, logprobs=3, stream=True, stream_options={"include_usage": True},
        user="u-1", echo=False, suffix=None, best_of=1, frequency_penalty=0.1,
        logit_bias={"50256": -100}, unknown_extension={"a": 1}),
        {"x-session-id": "sess-9"})
    assert request.messages == (Message("user", (TextPart("only one"),)),)
    assert request.sampling == Sampling(max_tokens=50, temperature=0.5, top_p=0.9,
                                        stop=("\n", "END"), seed=7, n=2)
    assert request.logprobs is True and request.top_logprobs == 3
    assert request.stream is True and request.user == "u-1" and request.session_id == "sess-9"


@pytest.mark.parametrize(("value", "top"), [(0, 0), (5, 5), (None, None)])
def test_decode_logprobs_count(value: int | None, top: int | None) -> None:
    request = cmpl.decode(body(logprobs=value))
    assert request.logprobs is (value is not None) and request.top_logprobs == top


def test_decode_stop_as_string() -> None:
    assert cmpl.decode(body(stop="###")).sampling.stop == ("###",)


BAD_BODIES = [
    ("not an object", ["m"], None, "JSON object"),
    ("no model", {"prompt": "x"}, "model", "Missing"),
    ("model not str", body(model=1), "model", "string"),
    ("empty model", body(model=""), "model", "empty"),
    ("no prompt", {"model": "m"}, "prompt", "Missing"),
    ("prompt wrong type", body(prompt={"text": "x"}), "prompt", "string"),
    ("empty prompt list", body(prompt=[]), "prompt", "empty"),
    ("two prompts", body(prompt=["a", "b"]), "prompt", "one prompt"),
    ("token id lists", body(prompt=[[1, 2], [3]]), "prompt", "one prompt"),
    ("empty token id list", body(prompt=[[1, 2], []]), "prompt", "token ids"),
    ("mixed list", body(prompt=["a", 1]), "prompt", "string"),
    ("echo", body(echo=True), "echo", "echo"),
    ("echo wrong type", body(echo="yes"), "echo", "boolean"),
    ("suffix", body(suffix="tail"), "suffix", "suffix"),
    ("suffix wrong type", body(suffix=3), "suffix", "string"),
    ("best_of", body(best_of=3), "best_of", "best-of"),
    ("best_of zero", body(best_of=0), "best_of", "between"),
    ("max_tokens zero", body(max_tokens=0), "max_tokens", "at least 1"),
    ("max_tokens str", body(max_tokens="9"), "max_tokens", "integer"),
    ("temperature high", body(temperature=2.5), "temperature", "between"),
    ("top_p wrong type", body(top_p="1"), "top_p", "number"),
    ("seed float", body(seed=1.5), "seed", "integer"),
    ("n zero", body(n=0), "n", "between"),
    ("logprobs too many", body(logprobs=6), "logprobs", "between 0 and 5"),
    ("logprobs bool", body(logprobs=True), "logprobs", "integer"),
    ("stop wrong type", body(stop=5), "stop", "string"),
    ("stop item wrong type", body(stop=["a", 2]), "stop[1]", "string"),
    ("stream wrong type", body(stream="yes"), "stream", "boolean"),
    ("stream_options wrong type", body(stream_options=[]), "stream_options", "object"),
    ("include_usage wrong type", body(stream_options={"include_usage": 1}),
     "stream_options.include_usage", "boolean"),
    ("user wrong type", body(user=5), "user", "string"),
]


@pytest.mark.parametrize(("raw", "param", "words"), [b[1:] for b in BAD_BODIES],
                         ids=[b[0] for b in BAD_BODIES])
def test_decode_rejects(raw: Any, param: str | None, words: str) -> None:
    with pytest.raises(BadRequest) as info:
        cmpl.decode(raw)
    assert info.value.param == param
    assert words in info.value.message
    assert info.value.status == 400


# --- the real SDK as the judge of our output ----------------------------------------

def sdk_client(payload: bytes, content_type: str, *, strict: bool = True) -> openai.OpenAI:
    """``strict`` off for streams: the SDK types ``finish_reason`` as never null, while
    OpenAI's own stream chunks carry ``null`` until the last one."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=payload, headers={"content-type": content_type})

    return openai.OpenAI(api_key="test", base_url="http://127.0.0.1:9/v1", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
                         _strict_response_validation=strict)


# --- encode_completion -----------------------------------------------------------------

def completion(*events: Any) -> Completion:
    return fold([Start(), *events])


def encode(c: Completion, **fields: Any) -> dict[str, Any]:
    return cmpl.encode_completion(c, cmpl.decode(body(**fields)), response_id="cmpl-1",
                                  created=99, model="m")


LOGPROBS_EVENTS = (TextDelta("Hé"), TextDelta("llo"),
                   Logprobs((TokenLogprob("Hé", -0.5, top=(("Hé", -0.5), ("He", -1.5))),
                             TokenLogprob("llo", -0.25, top=(("llo", -0.25),)))))
LOGPROBS_JSON = {"tokens": ["Hé", "llo"], "token_logprobs": [-0.5, -0.25],
                 "top_logprobs": [{"Hé": -0.5, "He": -1.5}, {"llo": -0.25}],
                 "text_offset": [0, 2]}

ENCODED = [
    ("text", completion(TextDelta("Hel"), TextDelta("lo"), Finish("stop")), {}, "Hello", "stop",
     None),
    ("stop sequence", completion(TextDelta("x"), Finish("stop_sequence", "END")), {}, "x",
     "stop", None),
    ("length", completion(TextDelta("x"), Finish("length")), {}, "x", "length", None),
    ("content filter", completion(Finish("content_filter")), {}, "", "content_filter", None),
    ("no finish", completion(TextDelta("x")), {}, "x", "stop", None),
    ("reasoning is not text", completion(ReasoningDelta("hm"), TextDelta("a"), Finish("stop")),
     {}, "a", "stop", None),
    ("logprobs", completion(*LOGPROBS_EVENTS, Finish("stop")), {"logprobs": 2}, "Héllo", "stop",
     LOGPROBS_JSON),
    ("logprobs not asked", completion(*LOGPROBS_EVENTS), {}, "Héllo", "stop", None),
]


@pytest.mark.parametrize(("c", "fields", "text", "finish", "logprobs"),
                         [e[1:] for e in ENCODED], ids=[e[0] for e in ENCODED])
def test_encode_completion(c: Completion, fields: dict[str, Any], text: str, finish: str,
                           logprobs: Any) -> None:
    out = encode(c, **fields)
    assert out["id"] == "cmpl-1" and out["object"] == "text_completion"
    assert out["created"] == 99 and out["model"] == "m"
    assert out["choices"] == [{"text": text, "index": 0, "logprobs": logprobs,
                               "finish_reason": finish}]
    parsed = sdk_client(json.dumps(out).encode(), "application/json").completions.create(
        model="m", prompt="Say hi")
    assert parsed.choices[0].text == text and parsed.choices[0].finish_reason == finish
    if logprobs is not None:
        assert parsed.choices[0].logprobs is not None
        assert parsed.choices[0].logprobs.tokens == logprobs["tokens"]


def test_encode_usage() -> None:
    out = encode(completion(TextDelta("x"), Usage(input_tokens=10, output_tokens=2)))
    assert out["usage"]["prompt_tokens"] == 10 and out["usage"]["completion_tokens"] == 2
    assert out["usage"]["total_tokens"] == 12
    parsed = sdk_client(json.dumps(out).encode(), "application/json").completions.create(
        model="m", prompt="Say hi")
    assert parsed.usage is not None and parsed.usage.total_tokens == 12


# --- stream encoder ------------------------------------------------------------------------

def run_stream(events: list[Any], *, end: Any = "close", **fields: Any) -> bytes:
    request = cmpl.decode(body(stream=True, **fields))
    enc = cmpl.StreamEncoder(request, response_id="cmpl-s", created=7, model="m")
    out = b"".join(enc.feed(e) for e in events)
    out += enc.close() if end == "close" else enc.fail(end)
    assert enc.close() == b"" and enc.feed(TextDelta("late")) == b""  # ended means ended
    return out


def payloads(stream: bytes) -> list[Any]:
    frames = stream.split(b"\n\n")
    assert frames[-1] == b""
    out: list[Any] = []
    for frame in frames[:-1]:
        assert frame.startswith(b"data: ") and b"\n" not in frame
        data = frame[6:]
        out.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return out


def choices(stream: bytes) -> list[tuple[str, Any, Any]]:
    out = []
    for p in payloads(stream)[:-1]:
        assert p["id"] == "cmpl-s" and p["object"] == "text_completion"
        assert p["created"] == 7 and p["model"] == "m"
        if p["choices"]:
            (choice,) = p["choices"]
            assert choice["index"] == 0
            out.append((choice["text"], choice["finish_reason"], choice["logprobs"]))
    return out


STREAMS = [
    ("text", [Start(), TextDelta("Hel"), TextDelta("lo"), Finish("stop")],
     [("Hel", None, None), ("lo", None, None), ("", "stop", None)]),
    ("no finish means stop", [Start(), TextDelta("x")], [("x", None, None), ("", "stop", None)]),
    ("empty stream", [], [("", "stop", None)]),
    ("length", [Start(), TextDelta("x"), Finish("length")],
     [("x", None, None), ("", "length", None)]),
    ("stop sequence", [Start(), TextDelta("x"), Finish("stop_sequence", "Z")],
     [("x", None, None), ("", "stop", None)]),
    ("double finish", [Start(), Finish("length"), Finish("stop")], [("", "length", None)]),
    ("reasoning and tool calls dropped", [Start(), ReasoningDelta("hm"), TextDelta("a"),
                                          ToolCallStart(0, "c", "f"), ToolCallDelta(0, "{}"),
                                          Finish("stop")],
     [("a", None, None), ("", "stop", None)]),
    ("logprobs ignored when not asked", [Start(), TextDelta("a"),
                                         Logprobs((TokenLogprob("a", -1.0),))],
     [("a", None, None), ("", "stop", None)]),
]


@pytest.mark.parametrize(("events", "expected"), [s[1:] for s in STREAMS],
                         ids=[s[0] for s in STREAMS])
def test_stream_frames(events: list[Any], expected: list[Any]) -> None:
    stream = run_stream(events)
    assert choices(stream) == expected
    assert stream.endswith(b"data: [DONE]\n\n")


def test_stream_logprobs_offsets_run_on_across_chunks() -> None:
    stream = run_stream([Start(), TextDelta("ab"), Logprobs((TokenLogprob("ab", -1.0),)),
                         TextDelta("c"), Logprobs((TokenLogprob("c", -2.0, top=(("c", -2.0),)),)),
                         Finish("stop")], logprobs=1)
    assert [c[2] for c in choices(stream) if c[2] is not None] == [
        {"tokens": ["ab"], "token_logprobs": [-1.0], "top_logprobs": [{}], "text_offset": [0]},
        {"tokens": ["c"], "token_logprobs": [-2.0], "top_logprobs": [{"c": -2.0}],
         "text_offset": [2]}]


@pytest.mark.parametrize("include_usage", [True, False, None])
def test_stream_usage_chunk_only_when_asked(include_usage: bool | None) -> None:
    options = {} if include_usage is None else {"stream_options": {"include_usage": include_usage}}
    stream = run_stream([Start(), Usage(input_tokens=5), TextDelta("x"), Finish("stop"),
                         Usage(output_tokens=2)], **options)
    frames = payloads(stream)
    assert frames[-1] == "[DONE]"
    if include_usage:
        assert frames[-2]["choices"] == []
        assert frames[-2]["usage"]["prompt_tokens"] == 5
        assert frames[-2]["usage"]["completion_tokens"] == 2
        assert frames[-2]["usage"]["total_tokens"] == 7
        assert frames[-3]["choices"][0]["finish_reason"] == "stop"
    else:
        assert all("usage" not in f for f in frames[:-1])
        assert frames[-2]["choices"][0]["finish_reason"] == "stop"


def test_stream_fail_sends_error_frame_then_done() -> None:
    stream = run_stream([Start(), TextDelta("par")], end=UpstreamUnavailable("worker died"))
    frames = payloads(stream)
    assert frames[-2] == {"error": {"message": "worker died", "type": "api_error", "param": None,
                                    "code": "upstream_error"}}
    assert frames[-1] == "[DONE]"
    assert [f["choices"][0]["finish_reason"] for f in frames[:-2]] == [None]


def test_ping_is_an_sse_comment() -> None:
    enc = cmpl.StreamEncoder(cmpl.decode(body()), response_id="r", created=1, model="m")
    assert enc.ping() == b": ping\n\n"


def test_sdk_reads_a_stream_with_usage_and_logprobs() -> None:
    events = [Start(), TextDelta("a"), Logprobs((TokenLogprob("a", -0.25),)), TextDelta("b"),
              Logprobs((TokenLogprob("b", -0.5),)), Finish("length"),
              Usage(input_tokens=3, output_tokens=2)]
    stream = run_stream(events, logprobs=0, stream_options={"include_usage": True})
    chunks = list(sdk_client(stream, "text/event-stream", strict=False).completions.create(
        model="m", prompt="Say hi", stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "ab"
    assert [lp for c in chunks if c.choices and c.choices[0].logprobs
            for lp in c.choices[0].logprobs.token_logprobs or ()] == [-0.25, -0.5]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 5


def test_sdk_raises_on_error_frame() -> None:
    stream = run_stream([Start(), TextDelta("x")], end=UpstreamUnavailable("worker died"))
    client = sdk_client(stream, "text/event-stream", strict=False)
    with pytest.raises(openai.APIError, match="worker died"):
        for _ in client.completions.create(model="m", prompt="Say hi", stream=True):
            pass


def test_stream_survives_any_split() -> None:
    request = cmpl.decode(body(stream=True))
    enc = cmpl.StreamEncoder(request, response_id="r", created=1, model="m")
    stream = (enc.feed(Start()) + enc.ping() + enc.feed(TextDelta("a\n\nb")) + enc.ping()
              + enc.feed(Finish("stop")) + enc.close())
    whole = [e.data for e in SSEDecoder().feed(stream)]
    assert len(whole) == 3 and whole[-1] == "[DONE]"
    assert json.loads(whole[0])["choices"][0]["text"] == "a\n\nb"
    for cut in range(1, len(stream)):
        decoder = SSEDecoder()
        events = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) + decoder.close()
        assert [e.data for e in events] == whole


def test_decode_token_id_prompts() -> None:
    one = cmpl.decode(body(prompt=[5, 6, 7]))
    assert one.prompt_ids == (5, 6, 7) and one.prompt is None and one.messages == ()
    both = cmpl.decode_all(body(prompt=[[1, 2], [3]]))
    assert [r.prompt_ids for r in both] == [(1, 2), (3,)]


def test_vllm_sampling_extensions() -> None:
    from app.dialects import openai_chat

    for decode in (cmpl.decode, openai_chat.decode):
        base = body() if decode is cmpl.decode else {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        s = decode({**base, "ignore_eos": True, "stop_token_ids": [7, 8], "top_k": 5}).sampling
        assert (s.ignore_eos, s.stop_token_ids, s.top_k) == (True, (7, 8), 5)
        with pytest.raises(BadRequest) as exc:
            decode({**base, "stop_token_ids": ["a"]})
        assert exc.value.param == "stop_token_ids"
