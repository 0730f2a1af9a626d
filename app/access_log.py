"""The access log: one JSON line per HTTP request, at almost no cost to the request.

The line has the fields structlog's pipeline gave it (``access_fields``, then
``event``, ``request_id``, ``level`` and ``timestamp``), but the hot path does not
run that pipeline: ``AccessLines.put`` builds the record and serialises it with
one ``orjson.dumps`` into a bounded buffer, and a writer thread writes the
buffer to the log stream in batches (every ``FLUSH_SECONDS``, or sooner when the
buffer fills up), off the event loop. A request never waits for the log: when
the stream cannot keep up and the buffer is full, the line is dropped and
counted (``dropped``: the ``poolgate_access_log_dropped_total`` counter, with the
lines a failing stream did not take), and the writer says so in the log
(``access_log.dropped``). ``close`` writes what is
left; the server calls it once it has stopped.

The redaction of the log pipeline has nothing to do here: the record's field
names are fixed and none is secret-looking, its values are scalars.

Only ``configure_logging(..., batch_access=True)`` (``poolgate serve``, JSON
format) installs a writer; otherwise (console format, tests capturing structlog
events) ``write`` goes through structlog as every other line does.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections import deque
from typing import Any, TextIO

import orjson
import structlog

from .record import RequestRecord

__all__ = ["AccessLines", "FLUSH_SECONDS", "CAPACITY", "access_fields", "write", "install",
           "close", "dropped_total"]

FLUSH_SECONDS = 0.5  # the longest a line waits in the buffer (a quiet server)
CAPACITY = 16_384  # lines buffered at most (about 5 MiB): then dropped, and counted

_now = datetime.datetime.now
_UTC = datetime.timezone.utc
_OPTIONS = orjson.OPT_UTC_Z | orjson.OPT_APPEND_NEWLINE
_log = structlog.get_logger("poolgate.access")


def _ms(seconds: float) -> float:
    """Milliseconds to the hundredth (``round(seconds * 1000, 2)`` but for exact
    halves, in a quarter of its time)."""
    return int(seconds * 100_000 + 0.5) / 100


def access_fields(record: RequestRecord) -> dict[str, Any]:
    """The access line's own fields, in their order (both writers)."""
    if record.dialect is None:
        fields: dict[str, Any] = {
            "method": record.method, "path": record.path, "status": record.status,
            "latency_ms": _ms(record.duration), "key": record.key}
    else:
        fields = {
            "method": record.method, "path": record.path, "status": record.status,
            "latency_ms": _ms(record.duration), "key": record.key,
            "dialect": record.dialect, "model": record.model, "worker": record.worker,
            "stream": record.stream, "tokens_in": record.tokens_in, "tokens_out": record.tokens_out}
        if record.ttft is not None:
            fields["ttft_ms"] = _ms(record.ttft)
    if record.error is not None:
        fields["error"] = record.error
    return fields


class AccessLines:
    """A bounded buffer of serialised access lines and the thread writing them to ``stream``."""

    def __init__(self, stream: TextIO, level_no: int, *, capacity: int = CAPACITY,
                 flush_seconds: float = FLUSH_SECONDS) -> None:
        self.level_no = level_no
        self.capacity = capacity
        self.flush_seconds = flush_seconds
        self.dropped = 0  # lines dropped since start, the buffer full (the event loop thread adds)
        self.lost = 0  # lines a failing stream did not take (the flushing thread adds)
        self._reported = 0
        self._stream = stream
        self._binary = getattr(stream, "buffer", None)  # stdout: write bytes, no re-encoding
        self._lines: deque[bytes] = deque()
        self._soon = max(1, capacity // 4)  # this many waiting: wake the writer now
        self._wake = threading.Event()
        self._flushing = threading.Lock()  # the thread's flush and close's flush
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="poolgate-access-log", daemon=True)
        self._thread.start()

    def put(self, record: RequestRecord) -> None:
        """Queue ``record``'s line (a 5xx at level warning); never blocks."""
        if record.status >= 500:
            level = "warning"
            if self.level_no > logging.WARNING:
                return
        else:
            level = "info"
            if self.level_no > logging.INFO:
                return
        lines = self._lines
        if len(lines) >= self.capacity:
            self.dropped += 1
            return
        fields = access_fields(record)
        fields["event"] = "http.request"
        fields["request_id"] = record.request_id
        fields["level"] = level
        fields["timestamp"] = _now(_UTC)
        lines.append(orjson.dumps(fields, default=repr, option=_OPTIONS))
        if len(lines) == self._soon:
            self._wake.set()

    def flush(self, timeout: float = -1) -> None:
        """Write every queued line (and a note of lines dropped since the last one);
        give up after ``timeout`` seconds waiting for a flush under way."""
        if not self._flushing.acquire(timeout=timeout):
            return
        try:
            lines = self._lines
            batch = [lines.popleft() for _ in range(len(lines))]
            queued = len(batch)
            dropped = self.dropped
            if dropped != self._reported:
                batch.append(orjson.dumps({
                    "dropped": dropped - self._reported, "dropped_total": dropped,
                    "event": "access_log.dropped", "level": "warning", "timestamp": _now(_UTC),
                }, option=_OPTIONS))
                self._reported = dropped
            if batch:
                try:
                    self._write(b"".join(batch))
                except (OSError, ValueError):  # a closed or broken stream: count, carry on
                    self.lost += queued
        finally:
            self._flushing.release()

    def close(self) -> None:
        """Stop the writer and write what is left: nothing is lost on a clean stop."""
        self._closed = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.flush(timeout=5)  # a stream that blocks for good loses the rest, not the exit

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_seconds)
            self._wake.clear()
            self.flush()

    def _write(self, data: bytes) -> None:
        if self._binary is not None:
            self._binary.write(data)
            self._binary.flush()
        else:
            self._stream.write(data.decode())
            self._stream.flush()


# The process's writer: logging is process-wide (like structlog's configuration).
_lines: AccessLines | None = None


def write(record: RequestRecord) -> None:
    """The access line of a finished request."""
    lines = _lines
    if lines is not None:
        lines.put(record)
    elif record.status >= 500:
        _log.warning("http.request", **access_fields(record))
    else:
        _log.info("http.request", **access_fields(record))


def install(lines: AccessLines | None) -> None:
    """Make ``lines`` the process's access writer (``None``: structlog), closing the old one."""
    global _lines
    old, _lines = _lines, lines
    if old is not None:
        old.close()


def close() -> None:
    """Write out and stop the access writer (at shutdown); later lines go through structlog."""
    install(None)


def dropped_total() -> int:
    """Access lines the current writer dropped (buffer full) or lost (stream failed)."""
    lines = _lines
    return lines.dropped + lines.lost if lines is not None else 0
