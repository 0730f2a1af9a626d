"""Canonical ⇄ Anthropic Messages, for a ``remote`` worker (sans-IO).

:func:`build_body` makes the upstream request body; :class:`StreamParser`
turns the upstream's SSE ``data`` payloads into canonical events;
:func:`body_events` does the same for a non-streaming JSON answer.

Choices made here (see the module tests):

* Every ``system``/``developer`` message, wherever it stands, becomes a block
  of the top-level ``system`` (the Messages API has no system role).
* Consecutive messages of one role are merged into one message.
* Unsigned reasoning is dropped: the API rejects thinking without a signature.
* ``response_format``: JSON is asked for with a system instruction, which
  every Anthropic-compatible server honours; when the client asked for a
  *strict* schema the schema also goes to ``output_config.format`` so the
  Anthropic API enforces it (its schema subset is narrower than OpenAI's, so
  a non-strict schema is not sent there: it could be refused).
* ``thinking`` comes from ``thinking_budget`` or, failing that, from
  ``reasoning_effort`` (:mod:`pool.remote.anthropic_thinking`: clamped below
  ``max_tokens``, at least 1024, or left off); with it on, the sampling it
  refuses is left out of a Gemini client's request.
* Tool call arguments that are not a JSON object (custom tools' free text)
  go as ``{"input": <text>}``, matching the schema given to custom tools;
  a ``tool_use`` of a custom tool of the request comes back as a
  ``kind="custom"`` call with that ``input`` string unwrapped (the parsers
  take the request's custom tool names for this, and buffer such a call's
  input until its block ends).
"""

from __future__ import annotations

from typing import Any

import orjson

from pool.errors import UpstreamUnavailable
from pool.model import (
    ChatRequest, Event, ExecutedToolPart, Finish, ImagePart, Message, ReasoningDelta, ReasoningEnd, ReasoningPart,
    Start, TextDelta, TextPart, Tool, ToolCallDelta, ToolCallEnd, ToolCallPart, ToolCallStart,
    ToolResultPart, Usage, executed_text,
)

from .anthropic_thinking import sampling_for_thinking, thinking
from .errors import error_from_object, loads_upstream
from .policy import ANTHROPIC_FIELDS, PassPolicy

__all__ = ["build_body", "StreamParser", "body_events", "usage_of", "finish_of", "STOP_REASONS",
           "DEFAULT_MAX_TOKENS",
           "JSON_INSTRUCTION", "JSON_SCHEMA_INSTRUCTION", "CUSTOM_TOOL_SCHEMA",
           "unwrap_custom_input"]

DEFAULT_MAX_TOKENS = 4096
STOP_REASONS = {
    "end_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "stop_sequence": "stop_sequence",
    "refusal": "content_filter",
    "pause_turn": "stop",
    "model_context_window_exceeded": "length",
}
JSON_INSTRUCTION = "Respond only with a valid JSON object, and no other text."
JSON_SCHEMA_INSTRUCTION = ("Respond only with a JSON value that matches this JSON schema, "
                           "and no other text:\n")
# the one-string-argument schema a custom (free-text) tool is offered with
CUSTOM_TOOL_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}},
                      "required": ["input"]}
_NO_NAMES: frozenset[str] = frozenset()
_EMPTY_SCHEMA = {"type": "object", "properties": {}}
_NONE: tuple[Event, ...] = ()
_DEFAULT_POLICY = PassPolicy()


# --- request -------------------------------------------------------------------

def build_body(request: ChatRequest, policy: PassPolicy = _DEFAULT_POLICY) -> dict[str, Any]:
    """The upstream body: the client's own body when it spoke this dialect
    (less what ``policy`` holds back)."""
    if request.dialect == "anthropic" and request.raw:
        body = policy.body(request.raw, ANTHROPIC_FIELDS)  # a copy: raw is never touched
        body["model"] = request.model
        if request.stream or "stream" in body:
            body["stream"] = request.stream
        return body
    return _translate(request)


def _translate(req: ChatRequest) -> dict[str, Any]:
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for m in req.messages:
        if m.role == "system" or m.role == "developer":
            system.extend({"type": "text", "text": p.text}
                          for p in m.parts if type(p) is TextPart and p.text)
            continue
        blocks = _user_blocks(m) if m.role == "user" else _assistant_blocks(m)
        if not blocks:
            continue
        if messages and messages[-1]["role"] == m.role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": m.role, "content": blocks})

    s = req.sampling
    think, max_tokens = thinking(req, DEFAULT_MAX_TOKENS)
    body: dict[str, Any] = {"model": req.model, "messages": messages, "max_tokens": max_tokens}
    rf = req.response_format
    if rf is not None and rf.type != "text":
        if rf.type == "json_schema" and rf.schema is not None:
            schema_text = orjson.dumps(rf.schema, default=dict).decode()
            system.append({"type": "text", "text": JSON_SCHEMA_INSTRUCTION + schema_text})
            if rf.strict:
                body["output_config"] = {"format": {"type": "json_schema", "schema": rf.schema}}
        else:
            system.append({"type": "text", "text": JSON_INSTRUCTION})
    if system:
        body["system"] = system
    if s.stop:
        body["stop_sequences"] = list(s.stop)
    if s.temperature is not None:
        body["temperature"] = s.temperature
    if s.top_p is not None:
        body["top_p"] = s.top_p
    if s.top_k is not None:
        body["top_k"] = s.top_k
    if req.tools:
        body["tools"] = [_tool(t) for t in req.tools]
        tc = req.tool_choice
        if tc is not None:
            choice: dict[str, Any] = {"type": {"required": "any", "named": "tool"}.get(tc.mode,
                                                                                        tc.mode)}
            if tc.mode == "named":
                choice["name"] = tc.name
            if tc.parallel is False and tc.mode != "none":
                choice["disable_parallel_tool_use"] = True
            body["tool_choice"] = choice
    if think is not None:
        body["thinking"] = think
        if req.dialect == "gemini":  # Gemini takes its sampling with thinking: its clients send it
            sampling_for_thinking(body)
    if req.user is not None:
        body["metadata"] = {"user_id": req.user}
    if req.stream:
        body["stream"] = True
    return body


def _image(p: ImagePart) -> dict[str, Any]:
    if p.data is not None:
        source = {"type": "base64", "media_type": p.media_type or "image/png", "data": p.data}
    else:
        source = {"type": "url", "url": p.url}
    return {"type": "image", "source": source}


def _user_blocks(m: Message) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for p in m.parts:
        t = type(p)
        if t is TextPart:
            if p.text:
                rest.append({"type": "text", "text": p.text})
        elif t is ImagePart:
            rest.append(_image(p))
        elif t is ToolResultPart:
            results.append(_tool_result(p))
    # the API wants tool results first in their user message
    return results + rest if results else rest


def _tool_result(p: ToolResultPart) -> dict[str, Any]:
    content = [{"type": "text", "text": c.text} if type(c) is TextPart else _image(c)
               for c in p.content if type(c) is not TextPart or c.text]
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": p.call_id}
    if content:
        block["content"] = content
    if p.is_error:
        block["is_error"] = True
    return block


def _assistant_blocks(m: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for p in m.parts:
        t = type(p)
        if t is TextPart:
            if p.text:
                blocks.append({"type": "text", "text": p.text})
        elif t is ExecutedToolPart:  # a tool a cli worker ran: the model sees what it did
            blocks.append({"type": "text", "text": executed_text(p)})
        elif t is ToolCallPart:
            blocks.append({"type": "tool_use", "id": p.id, "name": p.name,
                           "input": _tool_input(p.arguments)})
        elif t is ReasoningPart:
            if p.redacted_data is not None:
                blocks.append({"type": "redacted_thinking", "data": p.redacted_data})
            elif p.signature is not None:
                blocks.append({"type": "thinking", "thinking": p.text, "signature": p.signature})
    return blocks


def _tool_input(arguments: str) -> Any:
    if not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"input": arguments}
    return value if isinstance(value, dict) else {"input": arguments}


def _tool(t: Tool) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": t.name}
    if t.description is not None:
        tool["description"] = t.description
    if t.kind == "custom":
        tool["input_schema"] = CUSTOM_TOOL_SCHEMA
    else:
        tool["input_schema"] = t.parameters if t.parameters is not None else _EMPTY_SCHEMA
    return tool


# --- answer --------------------------------------------------------------------

def unwrap_custom_input(arguments: str) -> str:
    """A custom tool's raw input from the ``{"input": <text>}`` it was called with;
    text that is not such an object is already raw and comes back unchanged."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict):
        inner = value.get("input")
        if isinstance(inner, str):
            return inner
        if len(value) == 1:  # a model that renamed the one argument
            (only,) = value.values()
            if isinstance(only, str):
                return only
    return arguments


def usage_of(u: dict[str, Any]) -> Usage:
    """Anthropic counts cache reads and writes apart from ``input_tokens``;
    the canonical ``input_tokens`` is the whole prompt."""
    given = u.get("input_tokens")
    read = u.get("cache_read_input_tokens")
    created = u.get("cache_creation_input_tokens")
    total = None if given is None else given + (read or 0) + (created or 0)
    return Usage(input_tokens=total, output_tokens=u.get("output_tokens"), cached_tokens=read,
                 cache_creation_tokens=created)


def finish_of(delta: dict[str, Any]) -> Finish | None:
    reason = delta.get("stop_reason")
    if not reason:
        return None
    mapped = STOP_REASONS.get(reason, "stop")
    return Finish(mapped, delta.get("stop_sequence") if mapped == "stop_sequence" else None)


class StreamParser:
    """Feed each SSE ``data`` payload; ``done`` turns true at ``message_stop``."""

    __slots__ = ("done", "_kinds", "_signatures", "_with_args", "_custom_tools", "_custom")

    def __init__(self, custom_tools: frozenset[str] = _NO_NAMES) -> None:
        self.done = False
        self._kinds: dict[int, str] = {}        # block index -> block type
        self._signatures: dict[int, str] = {}   # thinking block index -> signature so far
        self._with_args: set[int] = set()       # tool_use blocks that got some input
        self._custom_tools = custom_tools       # names whose calls are custom tool calls
        self._custom: dict[int, list[str]] = {}  # custom tool_use block -> its input so far

    def feed(self, data: str) -> tuple[Event, ...] | list[Event]:
        if not data:
            return _NONE
        obj = loads_upstream(data)
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == "content_block_delta":  # the hot path first
            index = obj.get("index", 0)
            delta = obj.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                text = delta.get("text")
                return (TextDelta(text),) if text else _NONE
            if dtype == "thinking_delta":
                text = delta.get("thinking")
                return (ReasoningDelta(text),) if text else _NONE
            if dtype == "input_json_delta":
                partial = delta.get("partial_json")
                if not partial:
                    return _NONE
                if self._custom and index in self._custom:
                    self._custom[index].append(partial)
                    return _NONE
                self._with_args.add(index)
                return (ToolCallDelta(index, partial),)
            if dtype == "signature_delta":
                self._signatures[index] = self._signatures.get(index, "") + delta.get(
                    "signature", "")
            return _NONE
        if kind == "content_block_start":
            return self._block_start(obj.get("index", 0), obj.get("content_block") or {})
        if kind == "content_block_stop":
            return self._block_stop(obj.get("index", 0))
        if kind == "message_start":
            msg = obj.get("message") or {}
            usage = msg.get("usage")
            start = Start(msg.get("id"), msg.get("model"))
            return (start, usage_of(usage)) if usage else (start,)
        if kind == "message_delta":
            out: list[Event] = []
            finish = finish_of(obj.get("delta") or {})
            if finish is not None:
                out.append(finish)
            usage = obj.get("usage")
            if usage:
                out.append(usage_of(usage))
            return out
        if kind == "message_stop":
            self.done = True
            return _NONE
        if kind == "error":
            raise error_from_object(obj)
        if kind is None:
            raise UpstreamUnavailable("upstream sent an unexpected stream event")
        return _NONE  # ping and event types this gateway does not model

    def _block_start(self, index: int, block: dict[str, Any]) -> tuple[Event, ...]:
        btype = block.get("type")
        self._kinds[index] = btype
        if btype == "text":
            text = block.get("text")
            return (TextDelta(text),) if text else _NONE
        if btype == "thinking":
            signature = block.get("signature")
            if signature:
                self._signatures[index] = signature
            text = block.get("thinking")
            return (ReasoningDelta(text),) if text else _NONE
        if btype == "redacted_thinking":
            return (ReasoningEnd(redacted_data=block.get("data", "")),)
        if btype == "tool_use":
            name = block.get("name", "")
            given = block.get("input")
            if name in self._custom_tools:
                self._custom[index] = [orjson.dumps(given).decode()] if given else []
                return (ToolCallStart(index, block.get("id", ""), name, "custom"),)
            start = ToolCallStart(index, block.get("id", ""), name)
            if given:
                self._with_args.add(index)
                return (start, ToolCallDelta(index, orjson.dumps(given).decode()))
            return (start,)
        return _NONE

    def _block_stop(self, index: int) -> tuple[Event, ...]:
        btype = self._kinds.pop(index, None)
        if btype == "thinking":
            return (ReasoningEnd(signature=self._signatures.pop(index, None) or None),)
        if btype == "tool_use":
            chunks = self._custom.pop(index, None)
            if chunks is not None:
                return (ToolCallDelta(index, unwrap_custom_input("".join(chunks))),
                        ToolCallEnd(index))
            if index in self._with_args:
                self._with_args.discard(index)
                return (ToolCallEnd(index),)
            # a call without arguments still needs valid JSON for OpenAI clients
            return (ToolCallDelta(index, "{}"), ToolCallEnd(index))
        return _NONE


def body_events(body: Any, custom_tools: frozenset[str] = _NO_NAMES) -> list[Event]:
    """A whole non-streaming answer as the events a stream would have carried;
    ``custom_tools``: the request's custom tool names."""
    if not isinstance(body, dict):
        raise UpstreamUnavailable("upstream sent an unexpected response body")
    if body.get("type") == "error" or (body.get("error") is not None and "content" not in body):
        raise error_from_object(body)
    out: list[Event] = [Start(body.get("id"), body.get("model"))]
    usage = body.get("usage") or {}
    for index, block in enumerate(body.get("content") or ()):
        btype = block.get("type")
        if btype == "text":
            if block.get("text"):
                out.append(TextDelta(block["text"]))
        elif btype == "thinking":
            if block.get("thinking"):
                out.append(ReasoningDelta(block["thinking"]))
            out.append(ReasoningEnd(signature=block.get("signature") or None))
        elif btype == "redacted_thinking":
            out.append(ReasoningEnd(redacted_data=block.get("data", "")))
        elif btype == "tool_use":
            name = block.get("name", "")
            arguments = orjson.dumps(block.get("input") or {}).decode()
            if name in custom_tools:
                out.append(ToolCallStart(index, block.get("id", ""), name, "custom"))
                arguments = unwrap_custom_input(arguments)
            else:
                out.append(ToolCallStart(index, block.get("id", ""), name))
            out.append(ToolCallDelta(index, arguments))
            out.append(ToolCallEnd(index))
    if usage:
        out.append(usage_of(usage))
    finish = finish_of(body)
    if finish is not None:
        out.append(finish)
    return out
