"""app.access_log.AccessLines: a stream that cannot keep up never blocks a
request; what does not fit is dropped, counted and said; close writes the rest."""

from __future__ import annotations

import io
import json
import logging
import threading

import structlog

from app import access_log
from app.access_log import AccessLines
from app.observability import configure_logging, current_request
from app.record import RequestRecord


class StuckStream(io.StringIO):
    """A log stream whose writes wait until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, text: str) -> int:
        self.entered.set()
        assert self.release.wait(10)
        return super().write(text)


def _record(i: int, status: int = 200) -> RequestRecord:
    record = RequestRecord(f"r{i}", "POST", "/v1/chat/completions")
    record.status = status
    return record


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_a_stuck_stream_drops_lines_counts_and_says_so() -> None:
    stream = StuckStream()
    lines = AccessLines(stream, logging.INFO, capacity=4, flush_seconds=0.01)
    lines.put(_record(0))
    assert stream.entered.wait(10)  # the writer holds line 0 in a write that does not return
    for i in range(1, 11):
        lines.put(_record(i))  # returns at once: 4 buffered, 6 dropped
    assert lines.dropped == 6
    stream.release.set()
    lines.close()
    written = _lines(stream.getvalue())
    access = [r["request_id"] for r in written if r["event"] == "http.request"]
    assert access == ["r0", "r1", "r2", "r3", "r4"]
    notes = [r for r in written if r["event"] == "access_log.dropped"]
    assert [(n["dropped"], n["dropped_total"], n["level"]) for n in notes] == [(6, 6, "warning")]


def test_close_writes_what_is_buffered() -> None:
    stream = io.StringIO()
    lines = AccessLines(stream, logging.INFO, flush_seconds=60)  # no flush but close's
    for i in range(3):
        lines.put(_record(i))
    lines.close()
    assert [r["request_id"] for r in _lines(stream.getvalue())] == ["r0", "r1", "r2"]


def test_levels_follow_the_log_level() -> None:
    stream = io.StringIO()
    lines = AccessLines(stream, logging.ERROR, flush_seconds=60)
    lines.put(_record(0, 502))  # a warning: below the level
    warning = AccessLines(stream, logging.WARNING, flush_seconds=60)
    warning.put(_record(1, 502))
    warning.put(_record(2, 200))  # info: below the level
    lines.close()
    warning.close()
    assert [(r["request_id"], r["level"]) for r in _lines(stream.getvalue())] == [("r1", "warning")]


def _routed(request_id: str, status: int) -> RequestRecord:
    record = RequestRecord(request_id, "POST", "/v1/messages", 0.0)
    record.status, record.key, record.duration = status, "team-a", 0.012345
    record.dialect, record.model, record.worker = "anthropic", "mock-claude", "up"
    record.stream, record.tokens_in, record.tokens_out, record.ttft = True, 7, 9, 0.004
    record.error = "upstream_error" if status >= 500 else None
    return record


def test_the_batched_line_is_the_structlog_line() -> None:
    """The same record through structlog's pipeline (the line before the batched
    writer; still the console format's) and through the batched writer: the
    same fields in the same order, the same values but the time stamp."""
    records = [_routed("same-1", 200), _routed("same-2", 502), _record(3, 401)]
    before, after = io.StringIO(), io.StringIO()
    try:
        configure_logging("info", "json", stream=before)
        for record in records:
            token = current_request.set(record)  # as the middleware has it when a request ends
            access_log.write(record)
            current_request.reset(token)
        configure_logging("info", "json", stream=after, batch_access=True)
        for record in records:
            access_log.write(record)
        access_log.close()
    finally:
        structlog.reset_defaults()
    old, new = _lines(before.getvalue()), _lines(after.getvalue())
    assert [list(r) for r in new] == [list(r) for r in old]
    assert [{**r, "timestamp": None} for r in new] == [{**r, "timestamp": None} for r in old]
    assert [r["level"] for r in new] == ["info", "warning", "info"]


class BrokenStream(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError("the log stream is gone")


def test_a_broken_stream_loses_lines_counted_not_the_server() -> None:
    lines = AccessLines(BrokenStream(), logging.INFO, flush_seconds=60)
    for i in range(3):
        lines.put(_record(i))
    lines.close()  # does not raise
    assert (lines.dropped, lines.lost) == (0, 3)
