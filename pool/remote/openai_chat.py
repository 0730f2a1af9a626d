"""Canonical ⇄ OpenAI Chat Completions, for a ``remote`` worker (sans-IO).

:func:`build_body` (:mod:`pool.remote.openai_chat_request`) makes the upstream
request body; :class:`StreamParser`
turns the upstream's SSE ``data`` payloads into canonical events;
:func:`body_events` does the same for a non-streaming JSON answer.

Choices made here (see the module tests):

* ``developer`` messages are sent as ``system``: every OpenAI-compatible
  server knows ``system``, not all know ``developer``, and OpenAI treats them
  alike.
* Reasoning parts are dropped (Chat Completions has no input slot for them).
* Tool results become ``tool`` messages placed before the rest of their user
  message; images inside a tool result (a ``tool`` message can only carry
  text) move into that user message so they are not lost.
* ``max_completion_tokens`` is used when a reasoning effort is set (reasoning
  models refuse ``max_tokens``), ``max_tokens`` otherwise (older compatible
  servers only know that one).
* A custom (free-text) tool is offered as a plain ``function`` tool with one
  string argument ``input`` (its description carries any grammar): vLLM,
  SGLang and Ollama do not know the ``custom`` tool type. Earlier custom calls
  go out as function calls with ``{"input": <text>}``; a function call to a
  custom tool of the request comes back as a ``kind="custom"`` call whose
  arguments are unwrapped to the raw text (the parsers take the request's
  custom tool names, and buffer such a call's arguments until it ends). A
  ``type: custom`` call from a server that does know the type is kept as is.
"""

from __future__ import annotations

import uuid
from typing import Any

from pool.errors import UpstreamUnavailable
from pool.model import (
    Event, Finish, Logprobs, ReasoningDelta, Start, TextDelta, TokenLogprob, ToolCallDelta,
    ToolCallEnd, ToolCallStart, Usage,
)

from .anthropic_messages import unwrap_custom_input
from .chunk_shape import TextChunkShape
from .errors import error_from_object, loads_upstream
from .openai_chat_request import build_body

__all__ = ["build_body", "StreamParser", "body_events", "FINISH_REASONS", "usage_of", "finish_of"]

FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}
_NONE: tuple[Event, ...] = ()
_NO_NAMES: frozenset[str] = frozenset()


# --- answer --------------------------------------------------------------------

def usage_of(u: dict[str, Any]) -> Usage:
    prompt = u.get("prompt_tokens_details") or {}
    completion = u.get("completion_tokens_details") or {}
    return Usage(input_tokens=u.get("prompt_tokens"), output_tokens=u.get("completion_tokens"),
                 cached_tokens=prompt.get("cached_tokens"),
                 reasoning_tokens=completion.get("reasoning_tokens"))


def _logprobs(content: list[dict[str, Any]]) -> Logprobs:
    tokens = []
    for t in content:
        raw = t.get("bytes")
        top = t.get("top_logprobs")
        tokens.append(TokenLogprob(
            t.get("token", ""), t.get("logprob", 0.0),
            bytes=tuple(raw) if raw is not None else None,
            top=tuple((x.get("token", ""), x.get("logprob", 0.0)) for x in top) if top else ()))
    return Logprobs(tuple(tokens))


def finish_of(choice: dict[str, Any], reason: str) -> Finish:
    mapped = FINISH_REASONS.get(reason, "stop")
    # vLLM and SGLang name the stop string that matched: keep it, Anthropic
    # clients want ``stop_sequence``
    matched = choice.get("stop_reason")
    if mapped == "stop" and isinstance(matched, str) and matched:
        return Finish("stop_sequence", matched)
    return Finish(mapped)


class StreamParser:
    """Feed each SSE ``data`` payload; ``done`` turns true at ``[DONE]``.
    ``custom_tools``: the request's custom tool names (see the module notes)."""

    __slots__ = ("done", "_started", "_open", "_pending", "_custom_tools", "_custom", "_shape")

    def __init__(self, custom_tools: frozenset[str] = _NO_NAMES) -> None:
        self.done = False
        self._shape = TextChunkShape()  # plain text chunks are told by their bytes
        self._started = False
        self._open: dict[int, bool] = {}       # tool call index -> started
        self._pending: dict[int, str] = {}     # arguments seen before the call's name
        self._custom_tools = custom_tools
        self._custom: dict[int, list[str]] = {}  # wrapped custom call index -> arguments

    def feed_into(self, datas: list[str], out: list[Event]) -> None:
        """:meth:`feed` of each of ``datas`` (one upstream read) onto ``out``, up
        to ``[DONE]``; text chunks of the learnt shape are read here."""
        text_of = self._shape.text
        for data in datas:
            text = text_of(data)
            if text is not None:
                if text:
                    out.append(TextDelta(text))
                continue
            out.extend(self.feed(data))
            if self.done:
                return

    def feed(self, data: str) -> tuple[Event, ...] | list[Event]:
        if data == "[DONE]":
            self.done = True
            return self._close_calls([]) if self._open else _NONE
        if not data:
            return _NONE
        shape = self._shape
        if shape.prefix is not None:
            text = shape.text(data)
            if text is not None:
                return (TextDelta(text),) if text else _NONE
        chunk = loads_upstream(data)
        if not isinstance(chunk, dict):
            raise UpstreamUnavailable("upstream sent an unexpected stream chunk")
        if chunk.get("error") is not None:
            raise error_from_object(chunk)
        choices = chunk.get("choices")
        if self._started and choices and not chunk.get("usage"):
            # the hot path: a chunk of one choice whose delta is only text
            choice = choices[0]
            delta = choice.get("delta")
            if (delta and len(delta) == 1 and "content" in delta
                    and not choice.get("finish_reason") and not choice.get("logprobs")):
                content = delta["content"]
                if content:
                    shape.learn(data, chunk, content)
                return (TextDelta(content),) if content else _NONE
        out: list[Event] = []
        if not self._started:
            self._started = True
            out.append(Start(chunk.get("id"), chunk.get("model")))
        if choices:
            choice = choices[0]
            delta = choice.get("delta")
            if delta:
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning and isinstance(reasoning, str):
                    out.append(ReasoningDelta(reasoning))
                content = delta.get("content")
                if content:
                    out.append(TextDelta(content))
                calls = delta.get("tool_calls")
                if calls:
                    self._call_deltas(calls, out)
            lp = choice.get("logprobs")
            if lp and lp.get("content"):
                out.append(_logprobs(lp["content"]))
            reason = choice.get("finish_reason")
            if reason:
                self._close_calls(out)
                out.append(finish_of(choice, reason))
        usage = chunk.get("usage")
        if usage:
            out.append(usage_of(usage))
        return out

    def _call_deltas(self, calls: list[dict[str, Any]], out: list[Event]) -> None:
        for position, call in enumerate(calls):
            index = call.get("index", position)
            fn = call.get("function") or call.get("custom") or {}
            args = fn.get("arguments")
            if args is None:
                args = fn.get("input")
            if index not in self._open:
                name = fn.get("name")
                if not name:
                    if args:
                        self._pending[index] = self._pending.get(index, "") + args
                    continue
                self._open[index] = True
                kind = "custom" if call.get("type") == "custom" else "function"
                if kind == "function" and name in self._custom_tools:
                    kind = "custom"
                    self._custom[index] = []
                out.append(ToolCallStart(index, call.get("id") or _call_id(), name, kind))
                early = self._pending.pop(index, None)
                if early:
                    self._arguments(index, early, out)
            if args:
                self._arguments(index, args, out)

    def _arguments(self, index: int, args: str, out: list[Event]) -> None:
        buffered = self._custom.get(index) if self._custom else None
        if buffered is not None:
            buffered.append(args)
        else:
            out.append(ToolCallDelta(index, args))

    def _close_calls(self, out: list[Event]) -> list[Event]:
        for index in sorted(self._open):
            buffered = self._custom.pop(index, None) if self._custom else None
            if buffered is not None:
                out.append(ToolCallDelta(index, unwrap_custom_input("".join(buffered))))
            out.append(ToolCallEnd(index))
        self._open.clear()
        return out


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def body_events(body: Any, custom_tools: frozenset[str] = _NO_NAMES) -> list[Event]:
    """A whole non-streaming answer as the events a stream would have carried;
    ``custom_tools``: the request's custom tool names."""
    if not isinstance(body, dict):
        raise UpstreamUnavailable("upstream sent an unexpected response body")
    if body.get("error") is not None:
        raise error_from_object(body)
    out: list[Event] = [Start(body.get("id"), body.get("model"))]
    choices = body.get("choices") or ()
    choice: dict[str, Any] = choices[0] if choices else {}
    msg = choice.get("message") or {}
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning and isinstance(reasoning, str):
        out.append(ReasoningDelta(reasoning))
    content = msg.get("content")
    if isinstance(content, list):  # a few servers answer with text parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not content and isinstance(msg.get("refusal"), str):
        content = msg["refusal"]
    if content:
        out.append(TextDelta(content))
    for index, call in enumerate(msg.get("tool_calls") or ()):
        custom = call.get("type") == "custom"
        fn = call.get("custom" if custom else "function") or {}
        name = fn.get("name", "")
        args = fn.get("input" if custom else "arguments")
        if not custom and name in custom_tools:
            custom = True
            args = unwrap_custom_input(args) if isinstance(args, str) else args
        out.append(ToolCallStart(index, call.get("id") or _call_id(), name,
                                 "custom" if custom else "function"))
        if args:
            out.append(ToolCallDelta(index, args))
        out.append(ToolCallEnd(index))
    lp = choice.get("logprobs")
    if lp and lp.get("content"):
        out.append(_logprobs(lp["content"]))
    usage = body.get("usage")
    if usage:
        out.append(usage_of(usage))
    reason = choice.get("finish_reason")
    if reason:
        out.append(finish_of(choice, reason))
    return out
