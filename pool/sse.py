"""A sans-IO Server-Sent Events decoder (the WHATWG event-stream grammar).

Feed it bytes as they arrive, split anywhere (mid-line, mid-UTF-8 sequence,
between ``\\r`` and ``\\n``); it returns the complete events so far.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEEvent", "SSEDecoder"]


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str | None
    data: str
    id: str | None = None


class SSEDecoder:
    __slots__ = ("_buf", "_event", "_data", "_id", "_pending_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._event: str | None = None
        self._data: list[str] = []
        self._id: str | None = None
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._pending_cr = False
        buf = self._buf + chunk
        out: list[SSEEvent] = []
        start = 0
        n = len(buf)
        while start < n:
            nl = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, nl if nl >= 0 else n)
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
            self._line(buf[start:end], out)
            start = nxt
        self._buf = buf[start:]
        return out

    def close(self) -> list[SSEEvent]:
        """End of stream: a final event without its blank line is dispatched
        (lenient, as the SDKs are)."""
        out: list[SSEEvent] = []
        if self._buf:
            self._line(self._buf, out)
            self._buf = b""
        self._line(b"", out)
        return out

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        if not raw:
            if self._data or self._event is not None:
                out.append(SSEEvent(self._event, "\n".join(self._data), self._id))
            self._event = None
            self._data = []
            return
        line = raw.decode("utf-8", "replace")
        if line[0] == ":":
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
