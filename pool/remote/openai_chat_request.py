"""Canonical → OpenAI Chat Completions request bodies, for a ``remote`` worker
(sans-IO): :func:`build_body`. The choices it makes are listed in
:mod:`pool.remote.openai_chat`, which reads the answers."""

from __future__ import annotations

from typing import Any

import orjson

from pool.model import (
    ChatRequest, ExecutedToolPart, ImagePart, Message, TextPart, Tool, ToolCallPart,
    ToolResultPart, executed_text,
)

from .anthropic_messages import CUSTOM_TOOL_SCHEMA
from .policy import OPENAI_CHAT_FIELDS, PassPolicy

__all__ = ["build_body"]

_DEFAULT_POLICY = PassPolicy()


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
