"""A sans-IO Server-Sent Events decoder (the WHATWG event-stream grammar).

Feed it bytes as they arrive, split anywhere (mid-line, mid-UTF-8 sequence,
between ``\\r`` and ``\\n``); it returns the complete events so far
(:meth:`SSEDecoder.feed`), or only their ``data`` (:meth:`SSEDecoder.feed_data`,
what the remote workers' parsers read: a fast path for the usual upstream
read of whole ``data: ...`` events).
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

    def feed_data(self, chunk: bytes) -> list[str]:
        """The ``data`` of each event completed by ``chunk`` (as :meth:`feed`
        would give them, event names and ids left out).

        The usual read (whole events with ``\\n`` line ends, nothing pending
        from the last read but the start of a line) is decoded at once and
        split on blank lines, each one-line ``data:`` event sliced out without
        a line-by-line parse; anything else goes line by line."""
        buf = self._buf
        if (self._data or self._event is not None or self._pending_cr
                or len(buf) + len(chunk) > self.max_line):
            return [event.data for event in self.feed(chunk)]
        whole = bytes(buf) + chunk if buf else chunk  # the buffer never holds a line end
        # Decoding whole lines at once replaces invalid bytes as decoding them
        # one by one does; a read that ends within an event is cut after its
        # last blank line first, so no UTF-8 sequence is cut either.
        text = whole.decode("utf-8", "replace")
        rest = b""
        if not text.endswith("\n\n"):
            end = whole.rfind(b"\n\n") + 2
            if end < 2 or b"\r" in whole:
                return [event.data for event in self.feed(chunk)]
            text, rest = whole[:end].decode("utf-8", "replace"), whole[end:]
        if "\r" in text:
            return [event.data for event in self.feed(chunk)]
        if buf:
            del buf[:]
            self._scan = 0
        out = None
        if text.startswith("data: "):
            # the usual read: events of one data line each (splitting on the
            # longer separator is the quicker search)
            out = text[6:-2].split("\n\ndata: ")
            for data in out:
                if "\n" in data:  # not one line each after all
                    out = None
                    break
        if out is None:
            out = []
            for block in text[:-2].split("\n\n"):
                if block.startswith("data: ") and "\n" not in block:
                    out.append(block[6:])
                else:  # several lines, other fields, comments: a blank line ends each block
                    events: list[SSEEvent] = []
                    for line in block.split("\n"):
                        self._text_line(line, events)
                    self._text_line("", events)
                    out += [event.data for event in events]
        if rest:
            self.feed(rest)  # no blank line in it: nothing completes
        return out

    def close_data(self) -> list[str]:
        """:meth:`close`, as :meth:`feed_data` gives events."""
        return [event.data for event in self.close()]

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
        self._text_line(raw.decode("utf-8", "replace"), out)

    def _text_line(self, line: str, out: list[SSEEvent]) -> None:
        if not line:
            if self._data or self._event is not None:
                out.append(SSEEvent(self._event, "\n".join(self._data), self._id))
            self._event = None
            self._data = []
            self._size = 0
            return
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
