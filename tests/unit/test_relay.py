"""The sans-IO relays of same-dialect answers: recorded streams split at every
byte boundary come out as whole frames, the model renamed, usage kept."""

from __future__ import annotations

import orjson
import pytest

from pool.errors import UpstreamError, UpstreamUnavailable
from pool.remote.relay import AnthropicRelay, OpenAIRelay


def _openai_chunk(delta: dict, model: str = "up-model", **extra: object) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": None, **extra}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


USAGE = (b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-model",'
         b'"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,'
         b'"prompt_tokens_details":{"cached_tokens":2}}}\n\n')
OPENAI = (_openai_chunk({"role": "assistant", "content": ""})
          + _openai_chunk({"content": 'say "model":"up-model"'})
          + b": keep-alive\n\n"
          + _openai_chunk({"content": "!"})
          + _openai_chunk({}, finish_reason="length")
          + USAGE + b"data: [DONE]\n\n")


def _anthropic(name: str, data: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n"


ANTHROPIC = (
    _anthropic("message_start", {"message": {
        "id": "m1", "type": "message", "role": "assistant", "model": "up-claude", "content": [],
        "usage": {"input_tokens": 5, "cache_read_input_tokens": 4,
                  "cache_creation_input_tokens": 1, "output_tokens": 1}}})
    + _anthropic("ping", {})
    + _anthropic("content_block_start", {"index": 0, "content_block": {
        "type": "tool_use", "id": "t1", "name": "pick", "input": {"model": "up-claude"}}})
    + _anthropic("content_block_delta", {"index": 0, "delta": {
        "type": "input_json_delta", "partial_json": "{}"}})
    + _anthropic("content_block_stop", {"index": 0})
    + _anthropic("message_delta", {"delta": {"stop_reason": "tool_use"},
                                   "usage": {"output_tokens": 9}})
    + _anthropic("message_stop", {}))


def _run(relay: OpenAIRelay | AnthropicRelay, raw: bytes, split: int) -> list[bytes]:
    out = [relay.feed(raw[:split]), relay.feed(raw[split:]), relay.close()]
    return [o for o in out if o]


@pytest.mark.parametrize("split", range(len(OPENAI) + 1))
def test_openai_stream_split_anywhere(split: int) -> None:
    relay = OpenAIRelay("client", True, usage_wanted=True)
    writes = _run(relay, OPENAI, split)
    assert all(w.endswith(b"\n\n") for w in writes)  # whole frames only
    expected = OPENAI.replace(b'"model":"up-model"', b'"model":"client"')
    assert b"".join(writes) == expected
    assert b'say \\"model\\":\\"up-model\\"' in expected  # text is not renamed
    assert relay.done and relay.finish == "length" and relay.content_events == 2
    usage = relay.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (7, 3, 2)


def test_openai_usage_chunk_dropped_unless_asked() -> None:
    relay = OpenAIRelay("up-model", True, usage_wanted=False)
    out = relay.feed(OPENAI)
    assert out == OPENAI.replace(USAGE, b"") and relay.usage.output_tokens == 3


def test_openai_crlf_lines_are_forwarded_as_lf() -> None:
    relay = OpenAIRelay("up-model", True, usage_wanted=True)
    crlf = OPENAI.replace(b"\n", b"\r\n")
    writes = [relay.feed(crlf[i:i + 5]) for i in range(0, len(crlf), 5)]
    assert b"".join(writes) == OPENAI


def test_openai_error_frame_ends_the_stream() -> None:
    relay = OpenAIRelay("up-model", True, usage_wanted=True)
    error = b'data: {"error":{"message":"slow down","type":"rate_limit_error","code":429}}\n\n'
    first = _openai_chunk({"content": "a"})
    assert relay.feed(first + error + _openai_chunk({"content": "b"})) == first
    assert isinstance(relay.error, UpstreamError) and relay.error.status == 429
    assert relay.feed(b"data: [DONE]\n\n") == b""


def test_frames_taken_at_the_end_count_as_forwarded() -> None:
    """A stream whose frames all come at the end, the last without its blank
    line: they go out at close(), and count as forwarded (so the gateway adds no
    closing frames of its own after them)."""
    last = _openai_chunk({"content": "a"}) + b"data: [DONE]"
    relay = OpenAIRelay("up-model", True, usage_wanted=True)
    assert relay.feed(last) == _openai_chunk({"content": "a"}) and relay.forwarded
    relay = OpenAIRelay("up-model", True, usage_wanted=True)
    assert relay.feed(b"data: [DONE]") == b"" and not relay.forwarded
    assert relay.close() == b"data: [DONE]\n\n"
    assert relay.done and relay.forwarded


def test_openai_truncated_stream_is_an_error() -> None:
    relay = OpenAIRelay("up-model", True, usage_wanted=True)
    assert relay.feed(_openai_chunk({"content": "a"})[:-1]) == b""
    with pytest.raises(UpstreamUnavailable):
        relay.close()


@pytest.mark.parametrize("split", range(0, len(ANTHROPIC) + 1, 7))
def test_anthropic_stream_split_anywhere(split: int) -> None:
    relay = AnthropicRelay("client", True)
    writes = _run(relay, ANTHROPIC, split)
    assert all(w.endswith(b"\n\n") for w in writes)
    out = b"".join(writes)
    # message_start is renamed; a tool input naming the same model is not
    assert out == ANTHROPIC.replace(b'"model":"up-claude"', b'"model":"client"', 1)
    assert b'"input":{"model":"up-claude"}' in out
    assert relay.finish == "tool_calls" and relay.content_events == 2
    usage = relay.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (10, 9, 4)


def test_bodies() -> None:
    body = orjson.dumps({"id": "m", "type": "message", "model": "up-claude",
                         "content": [{"type": "tool_use", "input": {"model": "up-claude"}}],
                         "stop_reason": "end_turn", "usage": {"input_tokens": 3,
                                                              "output_tokens": 4}})
    relay = AnthropicRelay("client", False)
    out = orjson.loads(relay.body(body))  # two same pairs: re-encoded, the top one renamed
    assert out["model"] == "client" and out["content"][0]["input"] == {"model": "up-claude"}
    assert relay.finish == "stop" and relay.usage.output_tokens == 4
    with pytest.raises(UpstreamError):
        OpenAIRelay("x", False, usage_wanted=False).body(
            b'{"error":{"message":"no","type":"invalid_request_error","code":400}}')


THINKING = (
    _anthropic("message_start", {"message": {
        "id": "m2", "type": "message", "role": "assistant", "model": "up-claude", "content": [],
        "usage": {"input_tokens": 5, "output_tokens": 1}}})
    + _anthropic("content_block_start", {"index": 0, "content_block": {
        "type": "thinking", "thinking": "", "signature": ""}})
    + _anthropic("content_block_delta", {"index": 0, "delta": {
        "type": "thinking_delta", "thinking": "hmm"}})
    + _anthropic("content_block_delta", {"index": 0, "delta": {
        "type": "signature_delta", "signature": "EqQBsig=="}})
    + _anthropic("content_block_stop", {"index": 0})
    + _anthropic("content_block_start", {"index": 1, "content_block": {
        "type": "redacted_thinking", "data": "EmwKAhgBredacted"}})
    + _anthropic("content_block_stop", {"index": 1})
    + _anthropic("content_block_start", {"index": 2, "content_block": {"type": "text", "text": ""}})
    + _anthropic("content_block_delta", {"index": 2, "delta": {
        "type": "text_delta", "text": 'a "signature_delta" in text'}})
    + _anthropic("content_block_stop", {"index": 2})
    + _anthropic("message_delta", {"delta": {"stop_reason": "end_turn"},
                                   "usage": {"output_tokens": 9}})
    + _anthropic("message_stop", {}))


@pytest.mark.parametrize("split", range(0, len(THINKING) + 1, 11))
def test_anthropic_stream_keeps_the_signed_reasoning_it_forwards(split: int) -> None:
    relay = AnthropicRelay("client", True)
    out = b"".join(_run(relay, THINKING, split))
    assert out == THINKING.replace(b'"model":"up-claude"', b'"model":"client"', 1)
    assert relay.signed == ["EqQBsig==", "EmwKAhgBredacted"]


def test_anthropic_body_keeps_the_signed_reasoning_it_forwards() -> None:
    relay = AnthropicRelay("client", False)
    relay.body(orjson.dumps({"id": "m", "type": "message", "model": "up-claude", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "EqQBsig=="},
        {"type": "redacted_thinking", "data": "EmwKAhgBredacted"},
        {"type": "text", "text": "hi"}], "stop_reason": "end_turn"}))
    assert relay.signed == ["EqQBsig==", "EmwKAhgBredacted"]
    plain = AnthropicRelay("client", False)
    plain.body(orjson.dumps({"id": "m", "type": "message", "content": [{"type": "text",
                                                                          "text": "hi"}]}))
    assert plain.signed is None
