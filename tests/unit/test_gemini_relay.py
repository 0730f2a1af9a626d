"""The sans-IO relay of a Gemini answer to a Gemini client: a stream split at
every byte boundary comes out as whole frames, ``modelVersion`` renamed in
each, usage and finish read on the side; errors are raised, not forwarded."""

from __future__ import annotations

import orjson
import pytest

from pool.errors import UpstreamError, UpstreamUnavailable
from pool.model import ChatRequest, Message, TextPart
from pool.remote.gemini_relay import GeminiRelay
from pool.remote.relay import relay_for


def _chunk(parts: list, finish: str | None = None, usage: dict | None = None) -> bytes:
    candidate: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    body: dict = {"candidates": [candidate], "modelVersion": "up-gemini", "responseId": "r1"}
    if usage:
        body["usageMetadata"] = usage
    return b"data: " + orjson.dumps(body) + b"\r\n\r\n"


USAGE = {"promptTokenCount": 7, "candidatesTokenCount": 3, "thoughtsTokenCount": 2,
         "cachedContentTokenCount": 4, "totalTokenCount": 12}
STREAM = (_chunk([{"text": "think", "thought": True, "thoughtSignature": "c2ln+/=="}])
          + _chunk([{"text": 'say "modelVersion":"up-gemini"'}])
          + b": keep-alive\r\n\r\n"
          + _chunk([{"functionCall": {"name": "pick", "args": {"modelVersion": "up-gemini"}}}])
          + _chunk([], "STOP", USAGE))


def _run(relay: GeminiRelay, raw: bytes, split: int) -> list[bytes]:
    out = [relay.feed(raw[:split]), relay.feed(raw[split:]), relay.close()]
    return [o for o in out if o]


@pytest.mark.parametrize("split", range(0, len(STREAM) + 1, 7))
def test_stream_split_anywhere(split: int) -> None:
    relay = GeminiRelay("client", True)
    writes = _run(relay, STREAM, split)
    assert all(w.endswith(b"\n\n") for w in writes)  # whole frames only
    expected = STREAM.replace(b"\r\n", b"\n").replace(b'"modelVersion":"up-gemini"',
                                                      b'"modelVersion":"client"')
    assert b"".join(writes) == expected
    # text and arguments that merely look like the pair are escaped, or not the key's value
    assert b'say \\"modelVersion\\":\\"up-gemini\\"' in expected
    assert relay.done and relay.finish == "tool_calls" and relay.content_events == 3
    assert (relay.usage.input_tokens, relay.usage.output_tokens, relay.usage.cached_tokens,
            relay.usage.reasoning_tokens) == (7, 5, 4, 2)


def test_a_body_is_renamed_once_and_read() -> None:
    raw = orjson.dumps({"candidates": [{"content": {"role": "model", "parts": [{"text": "hi"}]},
                                        "finishReason": "MAX_TOKENS"}],
                        "usageMetadata": USAGE, "modelVersion": "up-gemini"})
    relay = GeminiRelay("client", False)
    assert relay.body(raw) == raw.replace(b"up-gemini", b"client")
    assert relay.finish == "length" and relay.usage.input_tokens == 7


def test_the_same_name_leaves_the_bytes_alone() -> None:
    relay = GeminiRelay("up-gemini", True)
    assert b"".join(_run(relay, STREAM, 50)) == STREAM.replace(b"\r\n", b"\n")


def test_an_error_frame_is_raised_not_forwarded() -> None:
    error = (b'data: {"error": {"code": 429, "message": "slow down",'
             b' "status": "RESOURCE_EXHAUSTED"}}\n\n')
    relay = GeminiRelay("client", True)
    out = relay.feed(_chunk([{"text": "a"}]) + error)
    assert out.count(b"data: ") == 1 and b"error" not in out
    assert isinstance(relay.error, UpstreamError) and relay.error.status == 429


def test_a_stream_without_its_finish_is_truncated() -> None:
    relay = GeminiRelay("client", True)
    relay.feed(_chunk([{"text": "a"}]))
    with pytest.raises(UpstreamUnavailable):
        relay.close()


def test_only_a_gemini_client_on_a_gemini_upstream_is_relayed() -> None:
    hi = (Message("user", (TextPart("hi"),)),)
    gemini = ChatRequest(model="m", messages=hi, dialect="gemini", stream=True)
    openai = ChatRequest(model="m", messages=hi, dialect="openai_chat", stream=True)
    assert isinstance(relay_for("gemini", gemini, "m"), GeminiRelay)
    assert relay_for("gemini", openai, "m") is None
    assert relay_for("openai", gemini, "m") is None
