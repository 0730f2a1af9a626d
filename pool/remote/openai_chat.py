"""Canonical ⇄ OpenAI Chat Completions, for a ``remote`` worker (sans-IO).

:func:`build_body` makes the upstream request body; :class:`StreamParser`
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

import orjson

from pool.errors import UpstreamUnavailable
from pool.model import (
    ChatRequest, Event, ExecutedToolPart, Finish, ImagePart, Logprobs, Message, ReasoningDelta, Start, TextDelta,
    TextPart, TokenLogprob, Tool, ToolCallDelta, ToolCallEnd, ToolCallPart, ToolCallStart,
    ToolResultPart, Usage, executed_text,
)

from .anthropic_messages import CUSTOM_TOOL_SCHEMA, unwrap_custom_input
from .chunk_shape import TextChunkShape
from .errors import error_from_object, loads_upstream
from .policy import OPENAI_CHAT_FIELDS, PassPolicy

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
_DEFAULT_POLICY = PassPolicy()


# --- request -------------------------------------------------------------------

def build_body(request: ChatRequest, policy: PassPolicy = _DEFAULT_POLICY) -> dict[str, Any]:
    """The upstream body: the client's own body when it spoke this dialect
    (less what ``policy`` holds back)."""
    if request.dialect == "openai_chat" and request.raw:
        return _passthrough(request, policy)
    return _translate(request)


def _passthrough(request: ChatRequest, policy: PassPolicy) -> dict[str, Any]:
    body = policy.body(request.raw, OPENAI_CHAT_FIELDS)  # a copy: raw itself is never touched
    body["model"] = request.model
    if request.stream:
        body["stream"] = True
        opts = body.get("stream_options")
        body["stream_options"] = ({**opts, "include_usage": True} if isinstance(opts, dict)
                                  else {"include_usage": True})
    else:
        if "stream" in body:
            body["stream"] = False
        body.pop("stream_options", None)
    return body


def _translate(req: ChatRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": req.model, "messages": _messages(req.messages)}
    s = req.sampling
    if s.max_tokens is not None:
        body["max_completion_tokens" if req.reasoning_effort else "max_tokens"] = s.max_tokens
    if s.temperature is not None:
        body["temperature"] = s.temperature
    if s.top_p is not None:
        body["top_p"] = s.top_p
    if s.stop:
        body["stop"] = list(s.stop)
    if s.seed is not None:
        body["seed"] = s.seed
    if s.n != 1:
        body["n"] = s.n
    if req.tools:
        body["tools"] = [_tool(t) for t in req.tools]
        tc = req.tool_choice
        if tc is not None:
            if tc.mode == "named":
                body["tool_choice"] = {"type": "function", "function": {"name": tc.name}}
            else:
                body["tool_choice"] = tc.mode
            if tc.parallel is not None:
                body["parallel_tool_calls"] = tc.parallel
    rf = req.response_format
    if rf is not None:
        if rf.type == "json_schema":
            spec: dict[str, Any] = {"name": rf.name or "response",
                                    "schema": rf.schema if rf.schema is not None else {}}
            if rf.strict is not None:
                spec["strict"] = rf.strict
            body["response_format"] = {"type": "json_schema", "json_schema": spec}
        else:
            body["response_format"] = {"type": rf.type}
    if req.logprobs:
        body["logprobs"] = True
        if req.top_logprobs is not None:
            body["top_logprobs"] = req.top_logprobs
    if req.reasoning_effort is not None:
        body["reasoning_effort"] = req.reasoning_effort
    if req.user is not None:
        body["user"] = req.user
    if req.prompt_cache_key is not None:
        body["prompt_cache_key"] = req.prompt_cache_key
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _image(p: ImagePart) -> dict[str, Any]:
    url = p.url if p.data is None else f"data:{p.media_type or 'image/png'};base64,{p.data}"
    image: dict[str, Any] = {"url": url}
    if p.detail is not None:
        image["detail"] = p.detail
    return {"type": "image_url", "image_url": image}


def _compact(content: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A lone text part goes as a plain string, the form every server accepts."""
    if len(content) == 1 and content[0]["type"] == "text":
        return content[0]["text"]
    return content


def _messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "assistant":
            out.append(_assistant(m))
            continue
        content: list[dict[str, Any]] = []
        for p in m.parts:
            t = type(p)
            if t is TextPart:
                content.append({"type": "text", "text": p.text})
            elif t is ImagePart:
                if m.role == "user":
                    content.append(_image(p))
            elif t is ToolResultPart:
                out.append(_tool_message(p))
                content.extend(_image(c) for c in p.content if type(c) is ImagePart)
        if not content:
            continue
        msg: dict[str, Any] = {"role": "user" if m.role == "user" else "system",
                               "content": _compact(content)}
        if m.name is not None:
            msg["name"] = m.name
        out.append(msg)
    return out


def _tool_message(p: ToolResultPart) -> dict[str, Any]:
    text = "".join(c.text for c in p.content if type(c) is TextPart)
    return {"role": "tool", "tool_call_id": p.call_id, "content": text}


def _assistant(m: Message) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for p in m.parts:
        t = type(p)
        if t is TextPart:
            texts.append(p.text)
        elif t is ExecutedToolPart:  # a tool a cli worker ran: the model sees what it did
            texts.append(executed_text(p))
        elif t is ToolCallPart:
            if p.kind == "custom":
                wrapped = orjson.dumps({"input": p.arguments}).decode()
                calls.append({"id": p.id, "type": "function",
                              "function": {"name": p.name, "arguments": wrapped}})
            else:
                calls.append({"id": p.id, "type": "function",
                              "function": {"name": p.name, "arguments": p.arguments}})
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        msg["tool_calls"] = calls
    if m.name is not None:
        msg["name"] = m.name
    return msg


def _tool(t: Tool) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": t.name}
    if t.description is not None:
        fn["description"] = t.description
    if t.kind == "custom":
        fn["parameters"] = CUSTOM_TOOL_SCHEMA
        return {"type": "function", "function": fn}
    if t.parameters is not None:
        fn["parameters"] = t.parameters
    if t.strict is not None:
        fn["strict"] = t.strict
    return {"type": "function", "function": fn}


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
