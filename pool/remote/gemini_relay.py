"""A Gemini answer forwarded as the upstream's bytes (sans-IO; see :mod:`.relay`).

A Gemini client on a ``dialect = "gemini"`` worker gets the upstream's
``GenerateContentResponse`` body, or its SSE frames (``?alt=sse``), as they
came, with only ``modelVersion`` renamed to the name the client asked for.
Read on the side: ``usageMetadata`` (as :func:`.gemini.usage_of` counts it),
the ``finishReason`` (``tool_calls`` after function calls), an ``error``
object (not forwarded: the worker raises it, the gateway writes Google's
error frame), and the frames that carried parts.

A Gemini stream has no end marker: the frame holding ``finishReason`` is the
last, as for :class:`.gemini.StreamParser`. The JSON-array stream (no
``alt=sse``) is not forwarded: its client gets the translated array.
"""

from __future__ import annotations

from typing import Any

from pool.errors import UpstreamUnavailable

from .errors import error_from_object, loads_upstream
from .gemini import finish_of, usage_of
from .relay import Relay, _data, _model_field

__all__ = ["GeminiRelay"]


class GeminiRelay(Relay):
    """A Gemini ``generateContent`` answer, or its ``streamGenerateContent`` frames."""

    __slots__ = ("_seen_model", "_called")

    usage_of = staticmethod(usage_of)
    model_key = "modelVersion"
    swap_every_frame = True  # every chunk names the model

    def __init__(self, model: str, stream: bool) -> None:
        super().__init__(model, stream)
        self._seen_model = False
        self._called = False  # a functionCall came: a stop is ``tool_calls``

    def _scan_body(self, obj: dict[str, Any]) -> None:
        self._scan(obj)
        if self.finish is None:  # a body always ends the answer
            self.finish = "tool_calls" if self._called else "stop"

    def _frame(self, frame: bytes) -> bool | bytes:
        _, data = _data(frame)
        if not data:
            return True  # a comment (keep-alive) or an empty event
        chunk = loads_upstream(data)
        if not isinstance(chunk, dict):
            raise UpstreamUnavailable("upstream sent an unexpected stream chunk")
        if not self._seen_model and "modelVersion" in chunk:
            self._seen_model = True
            self._swap = _model_field(frame, chunk["modelVersion"], self.model, "modelVersion")
        self._scan(chunk)
        return True

    def _scan(self, obj: dict[str, Any]) -> None:
        if "error" in obj and "candidates" not in obj:
            raise error_from_object(obj)
        candidates = obj.get("candidates")
        candidate = candidates[0] if candidates and isinstance(candidates[0], dict) else {}
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        if parts:
            self.content_events += 1
            if not self._called:
                self._called = any(isinstance(p, dict) and "functionCall" in p for p in parts)
        reason = candidate.get("finishReason")
        usage = obj.get("usageMetadata")
        if isinstance(usage, dict) and (reason or "promptTokenCount" in usage):
            self._add_usage(usage)
        if reason:
            self.finish = finish_of(reason, self._called)
            self.done = True
