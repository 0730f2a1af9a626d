"""Encode canonical answers as Gemini ``GenerateContentResponse`` objects: one
JSON body (:func:`encode_completion`) or a stream of them (:class:`StreamEncoder`
as SSE ``data:`` frames, :class:`ArrayStreamEncoder` as one JSON array, what
``streamGenerateContent`` sends without ``?alt=sse``).

Pure and sans-IO. The answer is ``candidates[0].content`` (``role: "model"``)
with its parts in the order the model produced them: text, thought parts
(``thought: true``, the signature as ``thoughtSignature``, untouched; a
signature with no thought text goes on the part after it, as Gemini puts it
on a function call, so the client sends it back there), and
``functionCall`` parts (``id``, ``name``, ``args``), each sent whole once its
arguments are complete. A tool the worker ran itself is text
(:func:`pool.model.executed_text`).

``finishReason``: stop, stop_sequence and tool_calls -> ``STOP`` (Gemini stops
with ``STOP`` after function calls too), length -> ``MAX_TOKENS``,
content_filter -> ``SAFETY``. ``usageMetadata``: ``promptTokenCount`` is the
whole prompt, ``candidatesTokenCount`` the answer without its thoughts,
``thoughtsTokenCount`` the thoughts (canonical output tokens include them),
``cachedContentTokenCount`` the prompt's cached part, ``totalTokenCount`` the sum.

A stream's last chunk carries ``finishReason`` and ``usageMetadata`` (written
in ``close``: usage may follow ``Finish``). A failure is one more chunk holding
only the Google error envelope, which the google-genai SDK raises. Keep-alive
pings are blank lines, which SSE and JSON parsers both skip.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.errors import google_error
from pool.accumulate import merge_usage
from pool.errors import GatewayError
from pool.model import (
    ChatRequest, Completion, Event, ExecutedTool, ExecutedToolPart, Finish, ReasoningDelta,
    ReasoningEnd, ReasoningPart, TextDelta, TextPart, ToolCallDelta, ToolCallEnd, ToolCallPart,
    ToolCallStart, Usage, executed_text,
)

__all__ = ["encode_completion", "StreamEncoder", "ArrayStreamEncoder", "finish_reason",
           "usage_metadata"]

_FINISH = {"stop": "STOP", "stop_sequence": "STOP", "tool_calls": "STOP",
           "length": "MAX_TOKENS", "content_filter": "SAFETY"}


def finish_reason(finish: Finish | None) -> str:
    return _FINISH.get(finish.reason, "STOP") if finish is not None else "STOP"


def usage_metadata(usage: Usage) -> dict[str, int]:
    prompt = usage.input_tokens or 0
    output = usage.output_tokens or 0
    thoughts = min(usage.reasoning_tokens or 0, output)
    out = {"promptTokenCount": prompt, "candidatesTokenCount": output - thoughts,
           "totalTokenCount": prompt + output}
    if thoughts:
        out["thoughtsTokenCount"] = thoughts
    if usage.cached_tokens:
        out["cachedContentTokenCount"] = usage.cached_tokens
    return out


def _args(arguments: str) -> dict[str, Any]:
    try:
        value = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return value if type(value) is dict else {}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"functionCall": {"id": call_id, "name": name, "args": _args(arguments)}}


def _thought(text: str, signature: str | None) -> dict[str, Any]:
    part: dict[str, Any] = {"text": text, "thought": True}
    if signature is not None:
        part["thoughtSignature"] = signature
    return part


def _part(part: object) -> dict[str, Any] | None:
    t = type(part)
    if t is TextPart:
        return {"text": part.text}  # type: ignore[attr-defined]
    if t is ToolCallPart:
        return _call(part.id, part.name, part.arguments)  # type: ignore[attr-defined]
    if t is ReasoningPart:
        if not part.text and part.signature is None:  # type: ignore[attr-defined]
            return None  # redacted or encrypted reasoning: Gemini has no form for it
        return _thought(part.text, part.signature)  # type: ignore[attr-defined]
    if t is ExecutedToolPart:
        return {"text": executed_text(part)}  # type: ignore[arg-type]
    return None


def _response(parts: list[dict[str, Any]], response_id: str, model: str,
              finish: str | None = None, usage: Usage | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    body: dict[str, Any] = {"candidates": [candidate]}
    if usage is not None:
        body["usageMetadata"] = usage_metadata(usage)
    body["modelVersion"] = model
    body["responseId"] = response_id
    return body


def _signed(parts: list[object]) -> list[dict[str, Any]]:
    """The parts on the wire: a signature with no thought text before it is
    put on the part after it, where Gemini carries it (a function call's), so
    a client sends it back there; alone when no part follows."""
    out: list[dict[str, Any]] = []
    pending: str | None = None
    for part in parts:
        if (type(part) is ReasoningPart and not part.text and part.signature is not None
                and pending is None):
            pending = part.signature
            continue
        wire = _part(part)
        if wire is None:
            continue
        if pending is not None:
            if wire.get("thought"):
                out.append(_thought("", pending))
            else:
                wire["thoughtSignature"] = pending
            pending = None
        out.append(wire)
    if pending is not None:
        out.append(_thought("", pending))
    return out


def encode_completion(completion: Completion, request: ChatRequest, *, response_id: str,
                      created: int, model: str) -> dict[str, Any]:
    """The ``generateContent`` response body."""
    parts = _signed(completion.parts)
    return _response(parts, response_id, model, finish_reason(completion.finish),
                     completion.usage)


# --- streaming ------------------------------------------------------------------------

class StreamEncoder:
    """Sans-IO: canonical events in, ``streamGenerateContent?alt=sse`` frames out."""

    __slots__ = ("_id", "_model", "_usage", "_finish", "_done", "_calls", "_thinking",
                 "_pending", "_text_head", "_text_tail")

    def __init__(self, request: ChatRequest, *, response_id: str, created: int,
                 model: str) -> None:
        self._id = response_id
        self._model = model
        self._usage = Usage()
        self._finish: Finish | None = None
        self._done = False
        self._calls: dict[int, list[str]] = {}  # canonical index -> [id, name, arguments]
        self._thinking = False  # thought text went out that no signature closed yet
        self._pending: str | None = None  # a signature for the next part (see _signed)
        # a text chunk is these around the text's JSON (one dumps per delta, the hot path)
        self._text_head = b'{"candidates":[{"content":{"role":"model","parts":[{"text":'
        self._text_tail = (b'}]},"index":0}],"modelVersion":' + orjson.dumps(model)
                           + b',"responseId":' + orjson.dumps(response_id) + b"}")

    # framing: one SSE event per response object
    def _frame(self, body: dict[str, Any]) -> bytes:
        return self._wrap(orjson.dumps(body))

    def _wrap(self, data: bytes) -> bytes:
        return b"data: " + data + b"\n\n"

    def _chunk(self, part: dict[str, Any]) -> bytes:
        head = b""
        pending = self._pending
        if pending is not None:
            self._pending = None
            if part.get("thought"):
                head = self._frame(_response([_thought("", pending)], self._id, self._model))
            else:
                part["thoughtSignature"] = pending
        return head + self._frame(_response([part], self._id, self._model))

    def feed(self, event: Event) -> bytes:
        if self._done:
            return b""
        t = type(event)
        if t is TextDelta:
            if not event.text:  # type: ignore[union-attr]
                return b""
            if self._pending is not None:
                return self._chunk({"text": event.text})  # type: ignore[union-attr]
            return self._wrap(self._text_head + orjson.dumps(event.text)  # type: ignore[union-attr]
                              + self._text_tail)
        if t is ReasoningDelta:
            if not event.text:  # type: ignore[union-attr]
                return b""
            self._thinking = True
            return self._chunk(_thought(event.text, None))  # type: ignore[union-attr]
        if t is ReasoningEnd:
            # a signature closes the thought streamed before it, as a part of
            # its own; with no thought text, it goes on the next part
            thinking, self._thinking = self._thinking, False
            signature = event.signature  # type: ignore[union-attr]
            if signature is None:
                return b""
            if thinking or self._pending is not None:
                return self._chunk(_thought("", signature))
            self._pending = signature
            return b""
        if t is ToolCallStart:
            self._calls[event.index] = [event.id, event.name, ""]  # type: ignore[union-attr]
            return b""
        if t is ToolCallDelta:
            call = self._calls.get(event.index)  # type: ignore[union-attr]
            if call is not None:
                call[2] += event.arguments  # type: ignore[union-attr]
            return b""
        if t is ToolCallEnd:
            return self._flush_call(event.index)  # type: ignore[union-attr]
        if t is ExecutedTool:
            return self._chunk({"text": executed_text(event)})  # type: ignore[arg-type]
        if t is Usage:
            self._usage = merge_usage(self._usage, event)  # type: ignore[arg-type]
            return b""
        if t is Finish:
            self._finish = event  # type: ignore[assignment]
            return self._flush_calls()
        return b""  # Start, Logprobs

    def feed_batch(self, events: list[Event]) -> bytes:
        """:meth:`feed` of each event, joined (one upstream read); text deltas,
        the usual run, are written here."""
        out: list[bytes] = []
        wrap, head, tail = self._wrap, self._text_head, self._text_tail
        for event in events:
            if type(event) is TextDelta and self._pending is None and not self._done:
                if event.text:
                    out.append(wrap(head + orjson.dumps(event.text) + tail))
            else:
                out.append(self.feed(event))
        return b"".join(out)

    def _flush_call(self, index: int) -> bytes:
        call = self._calls.pop(index, None)
        return self._chunk(_call(*call)) if call is not None else b""

    def _flush_calls(self) -> bytes:
        return b"".join([self._flush_call(index) for index in sorted(self._calls)])

    def ping(self) -> bytes:
        return b"" if self._done else b"\n"

    def close(self) -> bytes:
        if self._done:
            return b""
        head = self._flush_calls()
        if self._pending is not None:
            head += self._chunk(_thought("", self._pending))
        self._done = True
        last = _response([{"text": ""}], self._id, self._model, finish_reason(self._finish),
                         self._usage)
        return head + self._frame(last) + self._end()

    def fail(self, exc: GatewayError) -> bytes:
        if self._done:
            return b""
        self._done = True
        return self._frame(google_error(exc)) + self._end()

    def _end(self) -> bytes:
        return b""


class ArrayStreamEncoder(StreamEncoder):
    """The same chunks as one JSON array, written as they come (``[``, then
    ``,``-separated objects, then ``]``): ``streamGenerateContent`` without
    ``alt=sse``."""

    __slots__ = ("_opened",)

    def __init__(self, request: ChatRequest, *, response_id: str, created: int,
                 model: str) -> None:
        super().__init__(request, response_id=response_id, created=created, model=model)
        self._opened = False

    def _wrap(self, data: bytes) -> bytes:
        head = b",\r\n" if self._opened else b"["
        self._opened = True
        return head + data

    def _end(self) -> bytes:
        return b"]" if self._opened else b"[]"
