"""Tool calls in the model's own text format, parsed while the text streams.

Hermes / Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
Text outside the tags streams on as text at once, except a tail that could be
the start of ``<tool_call>`` (held until the next piece tells). A block that
does not hold a JSON object with a string ``name`` is given back as text, so
nothing the model wrote is lost.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Union

__all__ = ["HermesParser", "TextOut", "CallOut", "new_call_id", "OPEN", "CLOSE"]

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@dataclass(frozen=True, slots=True)
class TextOut:
    text: str


@dataclass(frozen=True, slots=True)
class CallOut:
    name: str
    arguments: str  # JSON text of the arguments object


Out = Union[TextOut, CallOut]


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class HermesParser:
    """Feed text pieces; get text and whole tool calls back in order."""

    __slots__ = ("_buf", "_inside", "calls")

    def __init__(self, *, inside: str | None = None) -> None:
        # ``inside``: the call was opened by the prompt (a forced tool choice
        # prefilled ``<tool_call>`` and maybe the start of the JSON)
        self._buf = inside or ""
        self._inside = inside is not None
        self.calls = 0

    def feed(self, text: str) -> list[Out]:
        out: list[Out] = []
        buf = self._buf + text
        while buf:
            if not self._inside:
                at = buf.find(OPEN)
                if at < 0:
                    keep = _partial_suffix(buf, OPEN)
                    if len(buf) > keep:
                        out.append(TextOut(buf[:len(buf) - keep]))
                    buf = buf[len(buf) - keep:]
                    break
                if at:
                    out.append(TextOut(buf[:at]))
                buf = buf[at + len(OPEN):]
                self._inside = True
            else:
                end = buf.find(CLOSE)
                if end < 0:
                    break
                out.append(self._call(buf[:end]))
                buf = buf[end + len(CLOSE):]
                self._inside = False
        self._buf = buf
        return out

    def close(self) -> list[Out]:
        """The end of the text: an unclosed call still counts when its JSON is whole."""
        buf, self._buf = self._buf, ""
        if not buf:
            return []
        if self._inside:
            self._inside = False
            return [self._call(buf, closed=False)]
        return [TextOut(buf)]

    def _call(self, body: str, closed: bool = True) -> Out:
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj["name"]:
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):  # some models double-encode
                try:
                    args = json.loads(args)
                except ValueError:
                    pass
            if isinstance(args, dict):
                self.calls += 1
                return CallOut(obj["name"], json.dumps(args, ensure_ascii=False))
        return TextOut(OPEN + body + (CLOSE if closed else ""))
