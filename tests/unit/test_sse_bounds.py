"""The SSE decoder is linear in what it is fed and bounds a line's length
(issue 15 item 8): an over-long line is an upstream protocol error."""

from __future__ import annotations

import time

import pytest

from pool.errors import UpstreamUnavailable
from pool.sse import SSEDecoder, SSEEvent


def test_a_long_line_in_small_chunks_is_not_quadratic():
    # 16 MiB in 256-byte chunks: re-joining the buffer per chunk copies ~half a
    # terabyte (many minutes); appending in place is well under a second.
    # The deadline only detects that hang; it is not a performance target.
    decoder = SSEDecoder(max_line=32 * 1024 * 1024)
    chunk = b"x" * 256
    deadline = time.monotonic() + 60
    assert decoder.feed(b"data: ") == []
    for i in range(16 * 1024 * 1024 // 256):
        assert decoder.feed(chunk) == []
        if not i % 4096:
            assert time.monotonic() < deadline, "the decoder is quadratic"
    events = decoder.feed(b"\n\n")
    assert len(events) == 1 and len(events[0].data) == 16 * 1024 * 1024


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
@pytest.mark.parametrize("data_only", [False, True], ids=["feed", "feed_data"])
def test_a_line_over_the_bound_is_a_protocol_error(chunk, data_only):
    decoder = SSEDecoder(max_line=10_000)
    feed = decoder.feed_data if data_only else decoder.feed
    got = feed(b"event: e\ndata: ok\n\n")
    body = b"data: " + b"y" * 20_000 + b"\n\n"
    with pytest.raises(UpstreamUnavailable, match="longer than 10000 bytes"):
        for i in range(0, len(body), chunk):
            got += feed(body[i:i + chunk])
            assert len(decoder._buf) <= 10_000 + chunk  # never much more than the bound
    assert got == (["ok"] if data_only else [SSEEvent("e", "ok")])


def test_an_event_whose_data_lines_add_up_past_the_bound_is_refused():
    decoder = SSEDecoder(max_line=1000)
    with pytest.raises(UpstreamUnavailable):
        decoder.feed(b"data: " + b"z" * 600 + b"\n" + b"data: " + b"z" * 600 + b"\n")


def test_lines_at_the_bound_pass_and_the_decoder_goes_on():
    decoder = SSEDecoder(max_line=1000)
    line = b"data: " + b"a" * 994
    assert decoder.feed(line + b"\r\n\r\n" + line[:10]) == [SSEEvent(None, "a" * 994)]
    assert decoder.feed(line[10:] + b"\r") == []
    assert decoder.feed(b"\n\r\n") == [SSEEvent(None, "a" * 994)]

