"""A sans-IO Server-Sent Events decoder (the WHATWG event-stream grammar).

Feed it bytes as they arrive, split anywhere (mid-line, mid-UTF-8 sequence,
between ``\\r`` and ``\\n``); it returns the complete events so far.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UpstreamUnavailable

__all__ = ["SSEEvent", "SSEDecoder", "MAX_LINE"]

#: the longest line (and event data) accepted: an image in base64 fits many times over
MAX_LINE = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str | None
    data: str
    id: str | None = None


class SSEDecoder:
    """Linear in the bytes fed, however they are split: the buffer is appended to
    in place, and a search for the end of a line resumes where the last one
    stopped. A line (or an event's data) longer than ``max_line`` bytes is an
    upstream protocol error (:class:`~pool.errors.UpstreamUnavailable`), not a
    buffer that grows until memory runs out."""

    __slots__ = ("_buf", "_scan", "_event", "_data", "_size", "_id", "_pending_cr", "max_line")

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._buf = bytearray()
        self._scan = 0  # the buffer holds no line end before this offset
        self._event: str | None = None
        self._data: list[str] = []
        self._size = 0  # bytes of data in the event so far
        self._id: str | None = None
        self._pending_cr = False
        self.max_line = max_line

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._pending_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._pending_cr = False
        buf = self._buf
        buf += chunk
        out: list[SSEEvent] = []
        start = 0
        pos = self._scan
        n = len(buf)
        limit = self.max_line
        while pos < n:
            nl = buf.find(b"\n", pos)
            cr = buf.find(b"\r", pos, nl if nl >= 0 else n)
            if cr >= 0:
                end, nxt = cr, cr + 1
                if nxt < n and buf[nxt] == 0x0A:
                    nxt += 1
                elif nxt == n:
                    self._pending_cr = True
            elif nl >= 0:
                end, nxt = nl, nl + 1
            else:
                break
            if end - start > limit:
                raise self._too_long()
            self._line(bytes(buf[start:end]), out)
            start = pos = nxt
        if start:
            del buf[:start]
        if len(buf) > limit:
            raise self._too_long()
        self._scan = len(buf)
        return out

    def _too_long(self) -> UpstreamUnavailable:
        self._buf = bytearray()
        self._scan = 0
        return UpstreamUnavailable(
            f"The upstream sent a server-sent event line longer than {self.max_line} bytes.")

    def close(self) -> list[SSEEvent]:
        """End of stream: a final event without its blank line is dispatched
        (lenient, as the SDKs are)."""
        out: list[SSEEvent] = []
        if self._buf:
            self._line(bytes(self._buf), out)
            self._buf = bytearray()
            self._scan = 0
        self._line(b"", out)
        return out

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        if not raw:
            if self._data or self._event is not None:
                out.append(SSEEvent(self._event, "\n".join(self._data), self._id))
            self._event = None
            self._data = []
            self._size = 0
            return
        line = raw.decode("utf-8", "replace")
        if line[0] == ":":
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._size += len(value)
            if self._size > self.max_line:
                raise self._too_long()
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
