"""Encode canonical answers as OpenAI Responses: one ``response`` object, or the
``response.*`` SSE events ending in exactly one of ``response.completed``,
``response.incomplete`` or ``response.failed``.

Pure and sans-IO. Output item ids are derived from the response id and the
item's output index (``msg_<id>_0``, ``fc_<id>_1``), so the streamed items and
the final object agree without any shared random state. The stream encoder
folds the events it sees with the same :class:`~pool.accumulate.Accumulator`
the non-streaming path uses, so :meth:`StreamEncoder.response` is exactly
:func:`encode_completion` of the same events.

Output mapping:

* each text part is one ``message`` item with one ``output_text`` part;
* each reasoning part with text or ``encrypted_content`` is one ``reasoning``
  item (its text as one ``summary_text``); Anthropic redacted thinking has no
  Responses form and is left out;
* a tool call is a ``custom_tool_call`` when the call says ``kind="custom"``
  or names a custom tool of the request, else a ``function_call``; a call to
  a flattened namespace member ``ns__t`` goes out as ``name: t, namespace: ns``;
* a tool the worker ran itself (an agent-mode CLI) is an ``mcp_call`` item
  (:mod:`app.dialects.openai_responses_mcp`), nothing for the client to answer;
* finish ``length`` -> status ``incomplete`` (reason ``max_output_tokens``),
  ``content_filter`` -> ``incomplete`` (reason ``content_filter``); a failure
  -> ``failed`` with ``error: {code, message}``.
"""

from __future__ import annotations

from typing import Any

import orjson

from pool.accumulate import Accumulator
from pool.errors import GatewayError
from pool.model import (
    ChatRequest, Completion, Event, ExecutedTool, ExecutedToolPart, Finish, ReasoningDelta,
    ReasoningEnd, ReasoningPart, TextDelta, TextPart, ToolCallDelta, ToolCallEnd, ToolCallPart,
    ToolCallStart, Usage,
)

from .openai_responses_decode import namespace_map
from .openai_responses_mcp import mcp_call_item, mcp_call_stream

__all__ = ["encode_completion", "StreamEncoder", "usage_json", "error_json"]

_PING = b": ping\n\n"
_SEQUENCE_END = b',"sequence_number":%d}\n\n'
_CREATED = b'event: response.created\ndata: {"type":"response.created","response":'
_IN_PROGRESS = b'event: response.in_progress\ndata: {"type":"response.in_progress","response":'
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_ERROR_CODE = {"rate_limit": "rate_limit_exceeded", "overloaded": "rate_limit_exceeded",
               "invalid_request": "invalid_prompt"}


def usage_json(usage: Usage) -> dict[str, Any]:
    inp = usage.input_tokens or 0
    out = usage.output_tokens or 0
    # cache_write_tokens: the openai SDK's strict validation requires it
    details = {"cached_tokens": usage.cached_tokens or 0,
               "cache_write_tokens": usage.cache_creation_tokens or 0}
    return {"input_tokens": inp, "input_tokens_details": details, "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
            "total_tokens": inp + out}


def error_json(exc: GatewayError) -> dict[str, Any]:
    return {"code": _ERROR_CODE.get(exc.kind, "server_error"), "message": exc.message}


def _shell(request: ChatRequest, response_id: str, created: int, model: str) -> dict[str, Any]:
    """The response object minus what the answer decides, echoing the request."""
    raw = request.raw
    parallel = raw.get("parallel_tool_calls")
    store = raw.get("store")
    return {
        "id": response_id, "object": "response", "created_at": created,
        "status": "in_progress", "error": None, "incomplete_details": None,
        "instructions": raw.get("instructions"), "max_output_tokens": raw.get("max_output_tokens"),
        "model": model, "output": [], "output_text": "",
        "parallel_tool_calls": parallel if type(parallel) is bool else True,
        "previous_response_id": raw.get("previous_response_id"),
        "reasoning": raw.get("reasoning") or {"effort": None, "summary": None},
        "store": store if type(store) is bool else True,
        "temperature": raw.get("temperature"),
        "text": raw.get("text") or {"format": {"type": "text"}},
        "tool_choice": raw.get("tool_choice") or "auto", "tools": raw.get("tools") or [],
        "top_p": raw.get("top_p"), "truncation": raw.get("truncation") or "disabled",
        "usage": None, "metadata": raw.get("metadata") or {}, "user": raw.get("user"),
    }


def _finished(shell: dict[str, Any], output: list[dict[str, Any]], text: str,
              finish: Finish | None, usage: Usage, error: GatewayError | None) -> dict[str, Any]:
    response = dict(shell)
    response["output"] = output
    response["output_text"] = text
    response["usage"] = usage_json(usage)
    if error is not None:
        response["status"] = "failed"
        response["error"] = error_json(error)
    elif finish is not None and finish.reason in _INCOMPLETE:
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": _INCOMPLETE[finish.reason]}
    else:
        response["status"] = "completed"
    return response


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = ([] if status == "in_progress"
               else [{"type": "output_text", "text": text, "annotations": []}])
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}


def _reasoning_item(item_id: str, text: str, encrypted: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "id": item_id,
                            "summary": [{"type": "summary_text", "text": text}] if text else []}
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


class _Names:
    """How a canonical tool call shows on the wire: kind, name and namespace."""

    __slots__ = ("custom", "namespaces")

    def __init__(self, request: ChatRequest) -> None:
        self.custom = frozenset(t.name for t in request.tools if t.kind == "custom")
        self.namespaces = namespace_map(request.raw.get("tools"))

    def item(self, item_id: str, call_id: str, name: str, kind: str, arguments: str,
             status: str = "completed") -> dict[str, Any]:
        custom = kind == "custom" or name in self.custom
        namespace = None
        if self.namespaces:
            found = self.namespaces.get(name)
            if found is not None:
                namespace, name = found
        if custom:
            item = {"type": "custom_tool_call", "id": item_id, "call_id": call_id, "name": name,
                    "input": arguments}
        else:
            item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
                    "arguments": arguments, "status": status}
        if namespace is not None:
            item["namespace"] = namespace
        return item

    def is_custom(self, name: str, kind: str) -> bool:
        return kind == "custom" or name in self.custom


def _id_base(response_id: str) -> str:
    return response_id[5:] if response_id.startswith("resp_") else response_id


def encode_completion(completion: Completion, request: ChatRequest, *, response_id: str,
                      created: int, model: str, error: GatewayError | None = None
                      ) -> dict[str, Any]:
    """The Response object; ``error`` makes it a ``failed`` one (what a stream that
    failed stores)."""
    return _response(completion, _Names(request), _id_base(response_id),
                     _shell(request, response_id, created, model), error)


def _response(completion: Completion, names: _Names, base: str, shell: dict[str, Any],
              error: GatewayError | None) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    texts: list[str] = []
    for part in completion.parts:
        t = type(part)
        if t is TextPart:
            if part.text:
                output.append(_message_item(f"msg_{base}_{len(output)}", part.text))
                texts.append(part.text)
        elif t is ToolCallPart:
            prefix = "ctc" if names.is_custom(part.name, part.kind) else "fc"
            output.append(names.item(f"{prefix}_{base}_{len(output)}", part.id, part.name,
                                     part.kind, part.arguments))
        elif t is ExecutedToolPart:
            output.append(mcp_call_item(f"mcp_{base}_{len(output)}", part))
        elif t is ReasoningPart:
            if part.redacted_data is None and (part.text or part.encrypted_content is not None):
                output.append(_reasoning_item(f"rs_{base}_{len(output)}", part.text,
                                              part.encrypted_content))
    return _finished(shell, output, "".join(texts), completion.finish, completion.usage, error)


class _Open:
    """An output item being streamed: its id, index, text so far and delta prefix."""

    __slots__ = ("id", "index", "chunks", "head", "call_id", "name", "kind")

    def __init__(self, item_id: str, index: int, head: bytes, call_id: str = "",
                 name: str = "", kind: str = "") -> None:
        self.id = item_id
        self.index = index
        self.chunks: list[str] = []
        self.head = head
        self.call_id = call_id
        self.name = name
        self.kind = kind


def _head(kind: bytes, item_id: str, index: int, extra: bytes = b"") -> bytes:
    """Pre-rendered start of a delta event, up to the ``"delta":`` value."""
    return (b"event: " + kind + b'\ndata: {"type":"' + kind + b'","item_id":'
            + orjson.dumps(item_id) + b',"output_index":' + str(index).encode() + extra
            + b',"delta":')


class StreamEncoder:
    """Sans-IO: canonical events in, ``response.*`` SSE events out."""

    __slots__ = ("_names", "_base", "_shell", "_acc", "_seq", "_started", "_done",
                 "_count", "_msg", "_rs", "_rs_open", "_calls", "_response")

    def __init__(self, request: ChatRequest, *, response_id: str, created: int,
                 model: str) -> None:
        self._names = _Names(request)
        self._base = _id_base(response_id)
        self._shell = _shell(request, response_id, created, model)
        self._acc = Accumulator()
        self._seq = 0
        self._started = False
        self._done = False
        self._count = 0                         # output items opened so far
        self._msg: _Open | None = None          # the open message item
        self._rs: _Open | None = None           # the open reasoning item, once it has text
        self._rs_open = False                   # a reasoning part is open (maybe still empty)
        self._calls: dict[int, _Open] = {}      # worker tool-call index -> open call item
        self._response: dict[str, Any] | None = None

    # --- framing ---------------------------------------------------------------------

    def _event(self, payload: dict[str, Any]) -> bytes:
        payload["sequence_number"] = self._seq
        self._seq += 1
        return (b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload)
                + b"\n\n")

    def _delta(self, head: bytes, text: str) -> bytes:
        seq = self._seq
        self._seq += 1
        return head + orjson.dumps(text) + (_SEQUENCE_END % seq)

    def _begin(self) -> bytes:
        self._started = True
        shell = orjson.dumps(self._shell)  # once for both events (what _event would write)
        seq = self._seq
        self._seq = seq + 2
        return (_CREATED + shell + (_SEQUENCE_END % seq)
                + _IN_PROGRESS + shell + (_SEQUENCE_END % (seq + 1)))

    def _added(self, item: dict[str, Any], index: int) -> bytes:
        return self._event({"type": "response.output_item.added", "output_index": index,
                            "item": item})

    def _item_done(self, item: dict[str, Any], index: int) -> bytes:
        return self._event({"type": "response.output_item.done", "output_index": index,
                            "item": item})

    def _next_index(self) -> int:
        index = self._count
        self._count += 1
        return index

    # --- items -----------------------------------------------------------------------

    def _open_message(self) -> bytes:
        index = self._next_index()
        item_id = f"msg_{self._base}_{index}"
        self._msg = _Open(item_id, index, _head(b"response.output_text.delta", item_id, index,
                                                b',"content_index":0,"logprobs":[]'))
        return (self._added(_message_item(item_id, "", "in_progress"), index)
                + self._event({"type": "response.content_part.added", "item_id": item_id,
                               "output_index": index, "content_index": 0,
                               "part": {"type": "output_text", "text": "", "annotations": []}}))

    def _close_message(self) -> bytes:
        msg, self._msg = self._msg, None
        if msg is None:
            return b""
        text = "".join(msg.chunks)
        where = {"item_id": msg.id, "output_index": msg.index, "content_index": 0}
        return (self._event({"type": "response.output_text.done", **where, "text": text,
                             "logprobs": []})
                + self._event({"type": "response.content_part.done", **where,
                               "part": {"type": "output_text", "text": text, "annotations": []}})
                + self._item_done(_message_item(msg.id, text), msg.index))

    def _open_reasoning(self) -> bytes:
        index = self._next_index()
        item_id = f"rs_{self._base}_{index}"
        self._rs = _Open(item_id, index, _head(b"response.reasoning_summary_text.delta", item_id,
                                               index, b',"summary_index":0'))
        return (self._added(_reasoning_item(item_id, "", None), index)
                + self._event({"type": "response.reasoning_summary_part.added",
                               "item_id": item_id, "output_index": index, "summary_index": 0,
                               "part": {"type": "summary_text", "text": ""}}))

    def _close_reasoning(self, encrypted: str | None = None) -> bytes:
        self._rs_open = False
        rs, self._rs = self._rs, None
        if rs is None:
            if encrypted is None:
                return b""  # an empty part: nothing to show
            index = self._next_index()
            item = _reasoning_item(f"rs_{self._base}_{index}", "", encrypted)
            return self._added(_reasoning_item(item["id"], "", None), index) + self._item_done(
                item, index)
        text = "".join(rs.chunks)
        where = {"item_id": rs.id, "output_index": rs.index, "summary_index": 0}
        return (self._event({"type": "response.reasoning_summary_text.done", **where,
                             "text": text})
                + self._event({"type": "response.reasoning_summary_part.done", **where,
                               "part": {"type": "summary_text", "text": text}})
                + self._item_done(_reasoning_item(rs.id, text, encrypted), rs.index))

    def _open_call(self, event: ToolCallStart) -> bytes:
        index = self._next_index()
        custom = self._names.is_custom(event.name, event.kind)
        item_id = f"{'ctc' if custom else 'fc'}_{self._base}_{index}"
        kind = (b"response.custom_tool_call_input.delta" if custom
                else b"response.function_call_arguments.delta")
        self._calls[event.index] = _Open(item_id, index, _head(kind, item_id, index), event.id,
                                         event.name, event.kind)
        return self._added(self._names.item(item_id, event.id, event.name, event.kind, "",
                                            "in_progress"), index)

    def _close_call(self, call: _Open) -> bytes:
        text = "".join(call.chunks)
        item = self._names.item(call.id, call.call_id, call.name, call.kind, text)
        where = {"item_id": call.id, "output_index": call.index}
        if item["type"] == "custom_tool_call":
            done = {"type": "response.custom_tool_call_input.done", **where, "input": text}
        else:
            done = {"type": "response.function_call_arguments.done", **where, "arguments": text}
        return self._event(done) + self._item_done(item, call.index)

    def _executed(self, event: ExecutedTool) -> bytes:
        index = self._next_index()
        return b"".join(self._event(payload) for payload in
                        mcp_call_stream(f"mcp_{self._base}_{index}", index, event))

    # --- the interface -----------------------------------------------------------------

    def feed(self, event: Event) -> bytes:
        if self._done:
            return b""
        self._acc.feed(event)
        out = b"" if self._started else self._begin()
        t = type(event)
        if t is TextDelta:
            if self._rs_open:
                out += self._close_reasoning()
            msg = self._msg
            if msg is None:
                if not event.text:
                    return out
                out += self._open_message()
                msg = self._msg
            msg.chunks.append(event.text)  # type: ignore[union-attr]
            return out + self._delta(msg.head, event.text)  # type: ignore[union-attr]
        if t is ToolCallDelta:
            call = self._calls.get(event.index)
            if call is None:
                return out
            call.chunks.append(event.arguments)
            return out + self._delta(call.head, event.arguments)
        if t is ReasoningDelta:
            if self._msg is not None:
                out += self._close_message()
            self._rs_open = True
            if not event.text:
                return out
            if self._rs is None:
                out += self._open_reasoning()
            rs = self._rs
            rs.chunks.append(event.text)  # type: ignore[union-attr]
            return out + self._delta(rs.head, event.text)  # type: ignore[union-attr]
        if t is ReasoningEnd:
            if self._msg is not None:
                out += self._close_message()
            if event.redacted_data is not None:  # no Responses form: close what is open
                return out + (self._close_reasoning() if self._rs_open else b"")
            return out + self._close_reasoning(event.encrypted_content)
        if t is ToolCallStart:
            if self._msg is not None:
                out += self._close_message()
            if self._rs_open:
                out += self._close_reasoning()
            return out + self._open_call(event)
        if t is ToolCallEnd:
            call = self._calls.pop(event.index, None)
            return out + self._close_call(call) if call is not None else out
        if t is ExecutedTool:
            if self._msg is not None:
                out += self._close_message()
            if self._rs_open:
                out += self._close_reasoning()
            return out + self._executed(event)
        return out  # Start, Usage, Finish, Logprobs: folded, nothing on the wire

    def feed_batch(self, events: list[Event]) -> bytes:
        """:meth:`feed` of each event, joined (one upstream read): text deltas
        into the open message, the usual run, are written here."""
        out: list[bytes] = []
        fold = self._acc.feed
        dumps = orjson.dumps
        for event in events:
            msg = self._msg
            if type(event) is TextDelta and msg is not None and not self._rs_open \
                    and not self._done:
                fold(event)
                text = event.text
                msg.chunks.append(text)
                seq = self._seq
                self._seq = seq + 1
                out.append(msg.head + dumps(text) + (_SEQUENCE_END % seq))
            else:
                out.append(self.feed(event))
        return b"".join(out)

    def ping(self) -> bytes:
        return _PING

    def _close_items(self) -> bytes:
        out = self._close_message()
        if self._rs_open:
            out += self._close_reasoning()
        for call in sorted(self._calls.values(), key=lambda c: c.index):
            out += self._close_call(call)
        self._calls.clear()
        return out

    def _terminal(self, error: GatewayError | None) -> dict[str, Any]:
        c = self._acc.finish()
        self._done = True
        # encode_completion of the same request and ids, with what the stream built
        self._response = _response(c, self._names, self._base, self._shell, error)
        return self._response

    def close(self) -> bytes:
        if self._done:
            return b""
        out = (b"" if self._started else self._begin()) + self._close_items()
        response = self._terminal(None)
        kind = "response.completed" if response["status"] == "completed" else \
            "response.incomplete"
        return out + self._event({"type": kind, "response": response})

    def fail(self, exc: GatewayError) -> bytes:
        if self._done:
            return b""
        out = b"" if self._started else self._begin()
        return out + self._event({"type": "response.failed", "response": self._terminal(exc)})

    def response(self) -> dict[str, Any]:
        """The final Response object (after :meth:`close` or :meth:`fail`), for storing."""
        if self._response is None:
            raise RuntimeError("response() is only known after close() or fail()")
        return self._response
