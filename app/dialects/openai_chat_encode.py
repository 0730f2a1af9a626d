"""Encode canonical answers as OpenAI Chat Completions: one ``chat.completion``
body, or ``chat.completion.chunk`` SSE frames ending in ``data: [DONE]``.

Pure and sans-IO. The stream encoder pre-renders the constant JSON around each
chunk's delta once per response, so a text delta costs one ``orjson.dumps`` of
the text and a few byte concatenations.

Chat completions has no form for a tool the worker ran itself (an agent-mode
CLI's ``ExecutedTool``): it is rendered into ``content`` as
:func:`pool.model.executed_text` (``\n[Read {"file_path": ...}]\n[result: ...]\n``),
which the client sends back as assistant text; the CLI session-reuse hash
counts it as that same text, so the next turn still continues the session.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.errors import openai_error_frame
from pool.accumulate import merge_usage
from pool.errors import GatewayError
from pool.model import (
    ChatRequest, Completion, Event, ExecutedTool, ExecutedToolPart, Finish, Logprobs,
    ReasoningDelta, ReasoningPart, TextDelta, TextPart, TokenLogprob, ToolCallDelta, ToolCallPart,
    ToolCallStart, Usage, executed_text,
)

__all__ = ["encode_completion", "StreamEncoder", "ChunkStream", "usage_json", "logprobs_json",
           "finish_reason"]

_FINISH = {
    "stop": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
}
_DONE = b"data: [DONE]\n\n"
_PING = b": ping\n\n"


def finish_reason(finish: Finish | None, has_tool_calls: bool) -> str:
    """OpenAI's ``finish_reason``; a turn that called tools and stopped reports ``tool_calls``."""
    reason = _FINISH.get(finish.reason, "stop") if finish is not None else "stop"
    if reason == "stop" and has_tool_calls:
        return "tool_calls"
    return reason


def usage_json(usage: Usage) -> dict[str, Any]:
    """``input_tokens`` is read as the whole prompt (cached tokens included), as OpenAI counts."""
    prompt = usage.input_tokens or 0
    completion = usage.output_tokens or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens or 0},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
    }


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", "surrogatepass"))


def _token_json(t: TokenLogprob) -> dict[str, Any]:
    return {
        "token": t.token,
        "logprob": t.logprob,
        "bytes": list(t.bytes) if t.bytes is not None else _token_bytes(t.token),
        "top_logprobs": [{"token": tok, "logprob": lp, "bytes": _token_bytes(tok)}
                         for tok, lp in t.top],
    }


def logprobs_json(tokens: list[TokenLogprob] | tuple[TokenLogprob, ...]) -> dict[str, Any]:
    return {"content": [_token_json(t) for t in tokens], "refusal": None}


def _call_json(call: ToolCallPart) -> dict[str, Any]:
    if call.kind == "custom":
        return {"id": call.id, "type": "custom",
                "custom": {"name": call.name, "input": call.arguments}}
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def encode_completion(completion: Completion, request: ChatRequest, *, response_id: str,
                      created: int, model: str) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` body."""
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in completion.parts:
        t = type(part)
        if t is TextPart:
            texts.append(part.text)
        elif t is ExecutedToolPart:
            texts.append(executed_text(part))
        elif t is ToolCallPart:
            calls.append(_call_json(part))
        elif t is ReasoningPart and part.text:
            reasoning.append(part.text)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": logprobs_json(completion.logprobs) if request.logprobs else None,
            "finish_reason": finish_reason(completion.finish, bool(calls)),
        }],
        "usage": usage_json(completion.usage),
    }


class ChunkStream:
    """What the OpenAI chunk streams (chat and legacy completions) share: the constant
    JSON before each chunk's choice, rendered once; the usage totals and the closing
    usage chunk (with ``stream_options.include_usage``); ``data: [DONE]``. Subclasses
    render the events and the finishing chunk (:meth:`_finish`)."""

    __slots__ = ("_head", "_usage_head", "_include_usage", "_logprobs", "_finished", "_done",
                 "_usage")

    def __init__(self, request: ChatRequest, *, response_id: str, created: int, model: str,
                 object_name: bytes, choice_head: bytes) -> None:
        common = (b'data: {"id":' + orjson.dumps(response_id)
                  + b',"object":"' + object_name + b'","created":' + orjson.dumps(created)
                  + b',"model":' + orjson.dumps(model))
        self._head = common + choice_head
        self._usage_head = common + b',"choices":[],"usage":'
        options = request.raw.get("stream_options")
        self._include_usage = type(options) is dict and options.get("include_usage") is True
        self._logprobs = request.logprobs
        self._finished = False
        self._done = False
        self._usage = Usage()

    def _finish(self, finish: Finish | None) -> bytes:
        raise NotImplementedError

    def ping(self) -> bytes:
        return _PING

    def close(self) -> bytes:
        if self._done:
            return b""
        out = self._finish(None)
        if self._include_usage:
            out += self._usage_head + orjson.dumps(usage_json(self._usage)) + b"}\n\n"
        self._done = True
        return out + _DONE

    def fail(self, exc: GatewayError) -> bytes:
        if self._done:
            return b""
        self._done = True
        return openai_error_frame(exc) + _DONE


class StreamEncoder(ChunkStream):
    """Sans-IO: canonical events in, ``chat.completion.chunk`` SSE frames out."""

    __slots__ = ("_started", "_calls", "_saw_calls")

    def __init__(self, request: ChatRequest, *, response_id: str, created: int,
                 model: str) -> None:
        super().__init__(request, response_id=response_id, created=created, model=model,
                         object_name=b"chat.completion.chunk",
                         choice_head=b',"choices":[{"index":0,"delta":')
        self._started = False
        self._calls: dict[int, bytes] = {}   # worker tool-call index -> its delta prefix
        self._saw_calls = False

    def _chunk(self, delta: bytes, tail: bytes = b',"logprobs":null,"finish_reason":null}]}\n\n'
               ) -> bytes:
        if self._started:
            return self._head + delta + tail
        self._started = True
        return self._role_chunk() + self._head + delta + tail

    def _role_chunk(self) -> bytes:
        return (self._head + b'{"role":"assistant","content":""}'
                + b',"logprobs":null,"finish_reason":null}]}\n\n')

    def feed(self, event: Event) -> bytes:
        if self._done:
            return b""
        t = type(event)
        if t is TextDelta:
            return self._chunk(b'{"content":' + orjson.dumps(event.text) + b"}")
        if t is ExecutedTool:
            return self._chunk(b'{"content":' + orjson.dumps(executed_text(event)) + b"}")
        if t is ReasoningDelta:
            return self._chunk(b'{"reasoning_content":' + orjson.dumps(event.text) + b"}")
        if t is ToolCallDelta:
            head = self._calls.get(event.index)
            if head is None:
                return b""
            return self._chunk(head + orjson.dumps(event.arguments) + b"}}]}")
        if t is ToolCallStart:
            return self._tool_call_start(event)
        if t is Usage:
            self._usage = merge_usage(self._usage, event)
            return b""
        if t is Logprobs:
            if not self._logprobs or not event.tokens:
                return b""
            return self._chunk(b"{}", b',"logprobs":' + orjson.dumps(logprobs_json(event.tokens))
                               + b',"finish_reason":null}]}\n\n')
        if t is Finish:
            return self._finish(event)
        if self._started:  # Start, ReasoningEnd, ToolCallEnd: nothing on the wire
            return b""
        self._started = True
        return self._role_chunk()

    def _tool_call_start(self, event: ToolCallStart) -> bytes:
        if event.index in self._calls:  # a repeated start: keep the first
            return b""
        index = b'{"tool_calls":[{"index":' + str(len(self._calls)).encode()
        self._saw_calls = True
        if event.kind == "custom":
            # custom tool calls carry their raw input in "custom.input"
            call = {"id": event.id, "type": "custom", "custom": {"name": event.name, "input": ""}}
            self._calls[event.index] = index + b',"custom":{"input":'
        else:
            call = {"id": event.id, "type": "function",
                    "function": {"name": event.name, "arguments": ""}}
            self._calls[event.index] = index + b',"function":{"arguments":'
        return self._chunk(index + b"," + orjson.dumps(call)[1:] + b"]}")

    def _finish(self, finish: Finish | None) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        reason = finish_reason(finish, self._saw_calls)
        return self._chunk(b"{}", b',"logprobs":null,"finish_reason":"' + reason.encode()
                           + b'"}]}\n\n')
