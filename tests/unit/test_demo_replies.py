"""What the demo upstream answers, rendered without a server."""

from __future__ import annotations

import orjson
import pytest

from app.demo_replies import Canned, Stream, render
from pool.sse import SSEDecoder

USER = {"role": "user", "content": "hi there"}


def body_of(reply: Canned) -> dict:
    return orjson.loads(reply.data.split(b"\r\n\r\n", 1)[1])


def events_of(reply: Stream) -> list:
    decoder = SSEDecoder()
    return decoder.feed(reply.head + b"".join(reply.chunks) + reply.tail) + decoder.close()


@pytest.mark.parametrize(("model", "max_tokens", "chunks", "finish"), [
    ("m", None, 17, "stop"),          # the reply's words
    ("m", 4, 4, "length"),            # max_tokens caps the chunks
    ("m", 17, 17, "stop"),            # a cap the reply fits in
    ("m-n40", None, 40, "stop"),      # -nN: the words repeated
    ("m-n40-d5", 30, 30, "length"),   # ... and still capped
    ("m-n2-t10", None, 2, "stop"),
])
def test_openai_stream_chunk_count_and_finish(model: str, max_tokens: int | None, chunks: int,
                                              finish: str) -> None:
    req = {"model": model, "stream": True, "messages": [USER]}
    if max_tokens:
        req["max_tokens"] = max_tokens
    reply = render("chat", orjson.dumps(req))
    assert isinstance(reply, Stream)
    assert len(reply.chunks) == chunks
    frames = [orjson.loads(e.data) for e in events_of(reply) if e.data != "[DONE]"]
    assert frames[-1]["choices"][0]["finish_reason"] == finish
    text = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames)
    assert len(text.split()) == chunks and not text.endswith(" ")


@pytest.mark.parametrize(("model", "delay", "ttft"), [
    ("m", 0.0, 0.0), ("m-d5", 0.005, 0.0), ("m-t100-d2.5", 0.0025, 0.1), ("m-d5x", 0.0, 0.0),
])
def test_knobs_from_model_suffix(model: str, delay: float, ttft: float) -> None:
    reply = render("messages", orjson.dumps({"model": model, "stream": True, "max_tokens": 9,
                                             "messages": [USER]}))
    assert (reply.delay, reply.ttft) == (delay, ttft)


@pytest.mark.parametrize(("messages", "expected"), [
    ([USER], "poolgate demo model: you said “hi there”."),
    ([], "poolgate demo model: hello!"),
    ([{"role": "user", "content": [{"type": "image", "source": {}}]}], "poolgate demo model: hello!"),
    ([{"role": "system", "content": "s"}, USER, {"role": "assistant", "content": "prefill"}],
     "poolgate demo model: you said “hi there”."),
    ([USER, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                          "content": "42"}]}],
     "poolgate demo model: the tool returned “42”."),
    ([{"role": "user", "content": " ".join(["w"] * 200)}], "poolgate demo model: you said “w w"),
])
def test_anthropic_reply_text(messages: list, expected: str) -> None:
    reply = render("messages", orjson.dumps({"model": "c", "max_tokens": 500,
                                             "messages": messages}))
    text = body_of(reply)["content"][0]["text"]
    assert text.startswith(expected)
    assert text.endswith("Configure a worker in poolgate.toml to reach a real model.")
    assert len(text.split()) < 110                     # long messages are quoted in part


@pytest.mark.parametrize(("extra", "tool_called"), [
    ({"tools": [{"name": "f", "input_schema": {}}]}, True),
    ({}, False),                                                   # no tools offered
    ({"tools": [{"name": "g", "input_schema": {}}]}, False),       # another tool
    ({"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "none"}}, False),
])
def test_tool_marker(extra: dict, tool_called: bool) -> None:
    req = {"model": "c", "max_tokens": 50, **extra,
           "messages": [{"role": "user", "content": 'go [[tool:f {"a": [1, 2]}]] now'}]}
    content = body_of(render("messages", orjson.dumps(req)))["content"][0]
    if tool_called:
        assert content["type"] == "tool_use" and content["input"] == {"a": [1, 2]}
    else:
        assert content["type"] == "text"


@pytest.mark.parametrize(("route", "body", "status", "param"), [
    ("chat", b"[1]", 400, None),
    ("chat", b"{", 400, None),
    ("chat", b'{"model":"m","messages":[],"max_tokens":"9"}', 400, "max_tokens"),
    ("chat", b'{"model":"m","messages":[],"max_completion_tokens":0}', 400,
     "max_completion_tokens"),
    ("messages", b'{"model":"m"}', 400, None),
    ("count_tokens", b'{"model":"m","messages":{}}', 400, None),
])
def test_bad_requests_become_envelopes(route: str, body: bytes, status: int,
                                       param: str | None) -> None:
    reply = render(route, body)
    assert reply.data.startswith(b"HTTP/1.1 %d " % status)
    error = body_of(reply)
    if route == "chat":
        assert error["error"]["param"] == param
    else:
        assert error["type"] == "error"


def test_usage_grows_with_the_prompt() -> None:
    def tokens(text: str) -> int:
        req = {"model": "c", "messages": [{"role": "user", "content": text}]}
        return body_of(render("count_tokens", orjson.dumps(req)))["input_tokens"]

    assert 0 < tokens("hi") < tokens("hi " * 100) < tokens("hi " * 1000)
