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
  item (its text as one ``summary_text``); an Anthropic thinking signature or
  redacted thinking rides in ``encrypted_content``
  (:mod:`app.dialects.openai_responses_carry`);
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
    ChatRequest, Event, ExecutedTool, ReasoningDelta, ReasoningEnd, TextDelta, ToolCallDelta,
    ToolCallEnd, ToolCallStart,
)

from .openai_responses_carry import carried
from .openai_responses_mcp import mcp_call_stream
from .openai_responses_objects import (
    ToolNames, encode_completion, error_json, id_base, message_item, reasoning_item,
    response_object, response_shell, usage_json,
)

__all__ = ["encode_completion", "StreamEncoder", "usage_json", "error_json"]

_PING = b": ping\n\n"
_SEQUENCE_END = b',"sequence_number":%d}\n\n'
_CREATED = b'event: response.created\ndata: {"type":"response.created","response":'
_IN_PROGRESS = b'event: response.in_progress\ndata: {"type":"response.in_progress","response":'


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
        self._names = ToolNames(request)
        self._base = id_base(response_id)
        self._shell = response_shell(request, response_id, created, model)
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
        opening = orjson.dumps(self._shell)  # once for both events (what _event would write)
        seq = self._seq
        self._seq = seq + 2
        return (_CREATED + opening + (_SEQUENCE_END % seq)
                + _IN_PROGRESS + opening + (_SEQUENCE_END % (seq + 1)))

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
        return (self._added(message_item(item_id, "", "in_progress"), index)
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
                + self._item_done(message_item(msg.id, text), msg.index))

    def _open_reasoning(self) -> bytes:
        index = self._next_index()
        item_id = f"rs_{self._base}_{index}"
        self._rs = _Open(item_id, index, _head(b"response.reasoning_summary_text.delta", item_id,
                                               index, b',"summary_index":0'))
        return (self._added(reasoning_item(item_id, "", None), index)
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
            item = reasoning_item(f"rs_{self._base}_{index}", "", encrypted)
            return self._added(reasoning_item(item["id"], "", None), index) + self._item_done(
                item, index)
        text = "".join(rs.chunks)
        where = {"item_id": rs.id, "output_index": rs.index, "summary_index": 0}
        return (self._event({"type": "response.reasoning_summary_text.done", **where,
                             "text": text})
                + self._event({"type": "response.reasoning_summary_part.done", **where,
                               "part": {"type": "summary_text", "text": text}})
                + self._item_done(reasoning_item(rs.id, text, encrypted), rs.index))

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
            if event.redacted_data is not None:  # a part of its own, never the open one's end
                if self._rs_open:
                    out += self._close_reasoning()
                return out + self._close_reasoning(carried(None, event.redacted_data, None))
            return out + self._close_reasoning(carried(event.signature, None,
                                                       event.encrypted_content))
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
        self._response = response_object(c, self._names, self._base, self._shell, error)
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
