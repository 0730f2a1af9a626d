"""OpenAI text chunks told by their bytes (pool.remote.chunk_shape): the parser
gives the same events whether a chunk is read through the learnt shape or parsed."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from pool.model import Finish, Start, TextDelta, Usage
from pool.remote.chunk_shape import TextChunkShape
from pool.remote.openai_chat import StreamParser

TEXTS = ["Hello", " wor", 'ld "quoted"', " back\\slash", " \u00e9t\u00e9 \U0001F600", "",
         " tab\tnew\nline", " </script>", " end"]


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1764000000,
            "model": "up", "system_fingerprint": "fp", "usage": None, **extra,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def _stream(dumps: Any = lambda c: orjson.dumps(c).decode(), **extra: Any) -> list[str]:
    head = [dumps(_chunk({"role": "assistant", "content": ""}, **extra))]
    body = [dumps(_chunk({"content": t}, **extra)) for t in TEXTS]
    tail = [dumps(_chunk({}, "stop", **extra)),
            dumps({**_chunk({}), "choices": [], "usage": {"prompt_tokens": 3,
                                                          "completion_tokens": 8}}),
            "[DONE]"]
    return head + body + tail


EXPECTED = [Start("chatcmpl-1", "up"), *(TextDelta(t) for t in TEXTS if t), Finish("stop"),
            Usage(input_tokens=3, output_tokens=8)]


def _parse(datas: list[str]) -> tuple[list[Any], StreamParser]:
    parser = StreamParser()
    events: list[Any] = []
    for data in datas:
        events.extend(parser.feed(data))
    assert parser.done
    return events, parser


def test_text_chunks_are_read_by_their_shape_with_the_same_events():
    events, parser = _parse(_stream())
    assert events == EXPECTED
    assert parser._shape.prefix is not None  # learnt from the first text chunk, then used
    assert parser._shape._tries == 2


def test_a_server_that_puts_spaces_after_colons_is_learnt_too():
    events, parser = _parse(_stream(json.dumps))  # ", " and ": ", non-ASCII as \\u escapes
    assert events == EXPECTED
    assert parser._shape.prefix is not None


def test_chunks_that_differ_elsewhere_are_parsed_and_learning_stops():
    datas = _stream()
    # a per-chunk field (as OpenAI's "obfuscation" padding): no chunk has the learnt shape
    datas[1:-3] = [d.replace('"usage":null', f'"usage":null,"pad":"{"x" * i}"')
                   for i, d in enumerate(datas[1:-3])]
    events, parser = _parse(datas)
    assert events == EXPECTED
    assert parser._shape.prefix is None and parser._shape._tries == 0


@pytest.mark.parametrize("slot, expected", [
    ("123", [TextDelta(123)]),              # not a string: parsed, as before
    ('"a"},"x":{"content":"b"', None),      # more than one string token: parsed
    ('"a" ', [TextDelta("a")]),             # a string with blanks around it
])
def test_what_is_not_one_string_in_the_slot_goes_through_the_parser(slot, expected):
    datas = _stream()
    shape_source = datas[1]  # "Hello"
    parser = StreamParser()
    for data in datas[:2]:
        parser.feed(data)
    prefix, suffix = parser._shape.prefix, parser._shape.suffix
    assert prefix is not None and shape_source == prefix + '"Hello"' + suffix
    odd = prefix + slot + suffix
    reference = StreamParser()
    reference.feed(datas[0])
    assert list(parser.feed(odd)) == (expected if expected is not None
                                      else list(reference.feed(odd)))


def test_the_pair_twice_teaches_nothing():
    chunk = _chunk({"content": "hi"}, meta={"content": "hi"})  # which one is the text?
    data = orjson.dumps(chunk).decode()
    shape = TextChunkShape()
    shape.learn(data, chunk, "hi")
    assert shape.prefix is None
    assert shape.text(data) is None


def test_a_pair_inside_a_key_fails_the_probe():
    # the key a"content ends in the pattern; the text itself is written with an escape
    data = ('{"a\\"content":"hi","choices":[{"index":0,"delta":{"content":"h\\u0069"},'
            '"logprobs":null,"finish_reason":null}]}')
    chunk = orjson.loads(data)
    assert chunk["choices"][0]["delta"] == {"content": "hi"} and data.count('"content":"hi"') == 1
    shape = TextChunkShape()
    shape.learn(data, chunk, "hi")
    assert shape.prefix is None


def test_duplicate_content_keys_learn_the_one_that_counts():
    data = _stream()[1].replace('"delta":{"content":"Hello"}',
                                '"delta":{"content":"Hi","content":"Hello"}')
    shape = TextChunkShape()
    shape.learn(data, orjson.loads(data), "Hello")  # the last key wins, in the probe too
    assert shape.prefix is not None and shape.prefix.endswith('"content":"Hi","content":')
    again = data.replace('"Hello"', '"Bye"')
    assert shape.text(again) == orjson.loads(again)["choices"][0]["delta"]["content"] == "Bye"


@pytest.mark.parametrize("size", [1, 2, 5, 100])
def test_feed_into_reads_as_feed_does_and_stops_at_done(size):
    datas = _stream() + ['{"after": "done"}']
    parser, events = StreamParser(), []
    for i in range(0, len(datas), size):
        if not parser.done:
            parser.feed_into(datas[i:i + size], events)
    assert events == EXPECTED and parser.done
