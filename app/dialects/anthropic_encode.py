"""Encode canonical answers as Anthropic ``/v1/messages`` responses: one JSON
body (:func:`encode_completion`) or SSE frames (:class:`StreamEncoder`).

Usage: canonical ``Usage.input_tokens`` is the *whole* prompt (the OpenAI
meaning) and ``cached_tokens`` / ``cache_creation_tokens`` the parts of it read
from / written to the prompt cache. Anthropic's ``input_tokens`` excludes both,
so it is rendered as ``input_tokens - cached_tokens - cache_creation_tokens``
(never below 0), with the two cache counts as ``cache_read_input_tokens`` and
``cache_creation_input_tokens``. A worker translating an Anthropic upstream
must therefore report the sum of the three as ``input_tokens``.

Stop reasons: stop -> ``end_turn`` (``tool_use`` when the answer holds tool
calls), length -> ``max_tokens``, tool_calls -> ``tool_use``, stop_sequence ->
``stop_sequence``, content_filter -> ``refusal``.

The stream follows Anthropic's grammar, with ``event:`` lines (Claude Code's
parser needs them): ``message_start``, then per content block
``content_block_start`` / ``content_block_delta``* / ``content_block_stop``
(indexed from 0 in order), then ``message_delta`` (stop reason and cumulative
usage, written in :meth:`StreamEncoder.close` because usage may follow
``Finish``) and ``message_stop``. ``message_start`` waits for the first
content event so that a ``Usage`` right after ``Start`` reaches it; ``ping``,
``close`` and ``fail`` send it first if it is still pending. A failure is
``message_start`` (if pending) plus one ``event: error`` frame and nothing
after it, as Anthropic does; Claude Code then retries the request.

A tool the worker ran itself (:class:`~pool.model.ExecutedTool`, an agent-mode
CLI) is two blocks, the MCP connector's executed-tool pair: ``mcp_tool_use``
``{id, name, server_name, input}`` and ``mcp_tool_result`` ``{tool_use_id,
is_error, content: [text]}``. They do not make the stop reason ``tool_use``:
the client has nothing to answer. Streamed, each is one
``content_block_start`` carrying the whole block and its
``content_block_stop``; the input is in the start rather than in an
``input_json_delta``, because the anthropic SDK's non-beta stream accumulator
only applies input deltas to ``tool_use``/``server_tool_use`` blocks.

Blocks are sequential: a new block closes the open one. A tool call's
argument delta that arrives after its block was closed (a worker interleaving
two calls) is still sent on that block's index rather than dropped.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.errors import anthropic_error_frame
from pool.accumulate import merge_usage
from pool.errors import GatewayError
from pool.model import (
    ChatRequest, Completion, Event, ExecutedTool, ExecutedToolPart, Finish, ReasoningDelta,
    ReasoningEnd, ReasoningPart, TextDelta, TextPart, ToolCallDelta, ToolCallEnd, ToolCallPart,
    ToolCallStart, Usage,
)

__all__ = ["encode_completion", "StreamEncoder", "stop_reason", "usage_fields", "executed_blocks"]

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "stop_sequence": "stop_sequence",
    "content_filter": "refusal",
}


def stop_reason(finish: Finish | None, has_tool_calls: bool) -> tuple[str, str | None]:
    """Anthropic ``(stop_reason, stop_sequence)`` for a canonical finish."""
    if finish is None:
        return ("tool_use" if has_tool_calls else "end_turn"), None
    if finish.reason == "stop" and has_tool_calls:
        return "tool_use", None
    reason = _STOP_REASONS.get(finish.reason, "end_turn")
    return reason, (finish.stop_sequence if reason == "stop_sequence" else None)


def usage_fields(usage: Usage) -> dict[str, int]:
    """Anthropic ``usage`` (input excludes cached tokens); unknown counts are 0."""
    cached = usage.cached_tokens or 0
    created = usage.cache_creation_tokens or 0
    total = usage.input_tokens
    return {
        "input_tokens": max(0, total - cached - created) if total is not None else 0,
        "output_tokens": usage.output_tokens or 0,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": cached,
    }


def _tool_input(arguments: str) -> dict[str, Any]:
    if not arguments:
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if type(value) is dict else {}


def executed_blocks(part: ExecutedTool | ExecutedToolPart) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``mcp_tool_use`` / ``mcp_tool_result`` pair of a tool the worker ran."""
    use = {"type": "mcp_tool_use", "id": part.id, "name": part.name,
           "server_name": part.server or "worker", "input": _tool_input(part.arguments)}
    result = {"type": "mcp_tool_result", "tool_use_id": part.id, "is_error": part.is_error,
              "content": [{"type": "text", "text": part.output}] if part.output else []}
    return use, result


def _content_block(part: object) -> dict[str, Any] | None:
    t = type(part)
    if t is TextPart:
        return {"type": "text", "text": part.text}  # type: ignore[attr-defined]
    if t is ToolCallPart:
        return {"type": "tool_use", "id": part.id, "name": part.name,  # type: ignore[attr-defined]
                "input": _tool_input(part.arguments)}  # type: ignore[attr-defined]
    if t is ReasoningPart:
        if part.redacted_data is not None:  # type: ignore[attr-defined]
            return {"type": "redacted_thinking", "data": part.redacted_data}  # type: ignore[attr-defined]
        if not part.text and part.signature is None:  # type: ignore[attr-defined]
            return None
        return {"type": "thinking", "thinking": part.text,  # type: ignore[attr-defined]
                "signature": part.signature or ""}  # type: ignore[attr-defined]
    return None


def encode_completion(completion: Completion, request: ChatRequest, *, response_id: str,
                      created: int, model: str) -> dict[str, Any]:
    """The non-streaming ``/v1/messages`` response body."""
    content = []
    has_tool_calls = False
    for part in completion.parts:
        if type(part) is ExecutedToolPart:
            content.extend(executed_blocks(part))
            continue
        block = _content_block(part)
        if block is not None:
            content.append(block)
            has_tool_calls = has_tool_calls or block["type"] == "tool_use"
    reason, sequence = stop_reason(completion.finish, has_tool_calls)
    return {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_fields(completion.usage),
    }


# --- streaming ------------------------------------------------------------------------

_NONE, _TEXT, _THINKING, _TOOL = 0, 1, 2, 3

_PING = b'event: ping\ndata: {"type":"ping"}\n\n'
_MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
_START = b'event: content_block_start\ndata: {"type":"content_block_start","index":%d,'
_TEXT_START = _START + b'"content_block":{"type":"text","text":""}}\n\n'
_THINKING_START = _START + b'"content_block":{"type":"thinking","thinking":"","signature":""}}\n\n'
_BLOCK_STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n'
_DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":'
_TEXT_DELTA = _DELTA + b'{"type":"text_delta","text":'
_THINKING_DELTA = _DELTA + b'{"type":"thinking_delta","thinking":'
_SIGNATURE_DELTA = _DELTA + b'{"type":"signature_delta","signature":'
_JSON_DELTA = _DELTA + b'{"type":"input_json_delta","partial_json":'
_DELTA_END = b"}}\n\n"


class StreamEncoder:
    """Sans-IO: canonical events in, Anthropic SSE frames out."""

    __slots__ = ("_id", "_model", "_usage", "_finish", "_started", "_done", "_next_index",
                 "_open", "_open_index", "_open_tool", "_prefix", "_tools", "_saw_tool")

    def __init__(self, request: ChatRequest, *, response_id: str, created: int,
                 model: str) -> None:
        self._id = response_id
        self._model = model
        self._usage = Usage()
        self._finish: Finish | None = None
        self._started = False
        self._done = False
        self._next_index = 0
        self._open = _NONE
        self._open_index = -1
        self._open_tool = -1                    # canonical index of the open tool call
        self._prefix = b""                      # delta frame prefix of the open text/thinking block
        self._tools: dict[int, bytes] = {}      # canonical tool index -> its delta frame prefix
        self._saw_tool = False

    def feed(self, event: Event) -> bytes:
        if self._done:
            return b""
        t = type(event)
        if t is TextDelta:
            if not event.text:  # type: ignore[union-attr]
                return b""
            head = b"" if self._open == _TEXT else self._open_block(_TEXT_START, _TEXT_DELTA, _TEXT)
            return head + self._prefix + orjson.dumps(event.text) + _DELTA_END  # type: ignore[union-attr]
        if t is ReasoningDelta:
            if not event.text:  # type: ignore[union-attr]
                return b""
            head = (b"" if self._open == _THINKING
                    else self._open_block(_THINKING_START, _THINKING_DELTA, _THINKING))
            return head + self._prefix + orjson.dumps(event.text) + _DELTA_END  # type: ignore[union-attr]
        if t is ToolCallDelta:
            prefix = self._tools.get(event.index)  # type: ignore[union-attr]
            if prefix is None or not event.arguments:  # type: ignore[union-attr]
                return b""
            return prefix + orjson.dumps(event.arguments) + _DELTA_END  # type: ignore[union-attr]
        if t is Usage:
            self._usage = merge_usage(self._usage, event)  # type: ignore[arg-type]
            return b""
        if t is ToolCallStart:
            return self._start_tool(event)  # type: ignore[arg-type]
        if t is ToolCallEnd:
            if self._open == _TOOL and self._open_tool == event.index:  # type: ignore[union-attr]
                return self._close_block()
            return b""
        if t is ReasoningEnd:
            return self._end_reasoning(event)  # type: ignore[arg-type]
        if t is ExecutedTool:
            return b"".join(self._whole_block(block)
                            for block in executed_blocks(event))  # type: ignore[arg-type]
        if t is Finish:
            self._finish = event  # type: ignore[assignment]
            return self._close_block()
        return b""  # Start, Logprobs

    def feed_batch(self, events: list[Event]) -> bytes:
        """:meth:`feed` of each event, joined (one upstream read): text deltas
        into the open text block, the usual run, are written here."""
        out: list[bytes] = []
        for event in events:
            if type(event) is TextDelta and self._open == _TEXT and not self._done:
                if event.text:
                    out.append(self._prefix + orjson.dumps(event.text) + _DELTA_END)
            else:
                out.append(self.feed(event))
        return b"".join(out)

    def ping(self) -> bytes:
        if self._done:
            return b""
        return self._message_start() + _PING

    def close(self) -> bytes:
        if self._done:
            return b""
        head = self._message_start() + self._close_block()
        self._done = True
        reason, sequence = stop_reason(self._finish, self._saw_tool)
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": self._delta_usage()}
        return (head + b"event: message_delta\ndata: " + orjson.dumps(delta) + b"\n\n"
                + _MESSAGE_STOP)

    def fail(self, exc: GatewayError) -> bytes:
        if self._done:
            return b""
        head = self._message_start()
        self._done = True
        return head + anthropic_error_frame(exc)

    # --- helpers ---------------------------------------------------------------------

    def _message_start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        message = {"type": "message_start",
                   "message": {"id": self._id, "type": "message", "role": "assistant",
                               "model": self._model, "content": [], "stop_reason": None,
                               "stop_sequence": None, "usage": usage_fields(self._usage)}}
        return b"event: message_start\ndata: " + orjson.dumps(message) + b"\n\n"

    def _close_block(self) -> bytes:
        if self._open == _NONE:
            return b""
        self._open = _NONE
        return _BLOCK_STOP % self._open_index

    def _begin(self) -> tuple[bytes, int]:
        """Send what must precede a new block; return it and the new block's index."""
        head = self._message_start() + self._close_block()
        index = self._next_index
        self._next_index = index + 1
        self._open_index = index
        return head, index

    def _open_block(self, start: bytes, delta: bytes, kind: int) -> bytes:
        head, index = self._begin()
        self._open = kind
        self._prefix = delta % index
        return head + start % index

    def _start_tool(self, event: ToolCallStart) -> bytes:
        head, index = self._begin()
        self._open = _TOOL
        self._open_tool = event.index
        self._saw_tool = True
        self._tools[event.index] = _JSON_DELTA % index
        block = {"type": "content_block_start", "index": index,
                 "content_block": {"type": "tool_use", "id": event.id, "name": event.name,
                                   "input": {}}}
        return head + b"event: content_block_start\ndata: " + orjson.dumps(block) + b"\n\n"

    def _whole_block(self, content_block: dict[str, Any]) -> bytes:
        """A block sent whole: its start (holding all of it) and its stop."""
        head, index = self._begin()
        block = {"type": "content_block_start", "index": index, "content_block": content_block}
        return (head + b"event: content_block_start\ndata: " + orjson.dumps(block)
                + b"\n\n" + _BLOCK_STOP % index)

    def _end_reasoning(self, event: ReasoningEnd) -> bytes:
        if event.redacted_data is not None:
            return self._whole_block({"type": "redacted_thinking", "data": event.redacted_data})
        signature = event.signature
        if self._open == _THINKING:
            head = b""
        elif signature is not None:  # a signature with no thinking text before it
            head = self._open_block(_THINKING_START, _THINKING_DELTA, _THINKING)
        else:
            return b""
        if signature is not None:
            head += (_SIGNATURE_DELTA % self._open_index) + orjson.dumps(signature) + _DELTA_END
        return head + self._close_block()

    def _delta_usage(self) -> dict[str, int]:
        """Cumulative usage for ``message_delta``; input counts only when known, so
        the client keeps ``message_start``'s values otherwise."""
        usage = self._usage
        fields = usage_fields(usage)
        out = {"output_tokens": fields["output_tokens"]}
        if usage.input_tokens is not None:
            out["input_tokens"] = fields["input_tokens"]
        if usage.cache_creation_tokens is not None:
            out["cache_creation_input_tokens"] = fields["cache_creation_input_tokens"]
        if usage.cached_tokens is not None:
            out["cache_read_input_tokens"] = fields["cache_read_input_tokens"]
        return out
