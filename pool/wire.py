"""The worker protocol: how the gateway and its worker processes talk.

One stream socket (a ``socketpair``, inherited by the child) carries frames
in both directions: a 4-byte big-endian length, then one orjson object.
Requests are multiplexed by ``id`` (an int chosen by the gateway):

gateway → child: ``{"op": "request", "id", "request", "window"}``, ``{"op": "cancel",
"id"}``, ``{"op": "ping", "id"}``, ``{"op": "credit", "id", "n"}``.
child → gateway: ``{"op": "ready"}`` (once, after start-up) or ``{"op": "refused",
"reason"}`` (it cannot run as configured, and exits), ``{"op": "event", "id",
"event"}``, ``{"op": "end", "id"}``, ``{"op": "error", "id", "kind", "status",
"message", "code", "param"}``, ``{"op": "pong", "id"}``.

Flow control is per request, by credit: ``window`` is how many events the
child may send before it hears more; each ``credit`` frame gives back ``n``
events the gateway's consumer has taken. A client that reads slowly thus stops
its own request in the child (a bounded buffer in the gateway, no generation
piling up), while the other requests on the socket, and the ping, flow on.
Pausing the socket instead would stall every request on the worker behind the
slowest client and make a healthy worker fail its health check. A request
without ``window`` is not flow-controlled.

The codec below is pure: canonical dataclasses ↔ plain dicts (a ``"_t"`` tag
names the class; tuples travel as lists). Mapping fields (``raw``, schemas,
metadata, headers) travel opaque, so a client body with a ``"_t"`` key or
lists stays as it was.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Mapping

import orjson

from . import model
from .errors import (AuthenticationFailed, BadRequest, EngineFailed, EngineUnavailable,
                     GatewayError, InternalError, NotFound, Overloaded, PayloadTooLarge, PermissionDenied, UpstreamError,
                     UpstreamTimeout, UpstreamUnavailable)

#: how much of a ``refused`` frame's reason the gateway keeps (shown in /internal/workers)
REASON_MAX = 500

__all__ = ["encode", "decode", "event_to_dict", "event_from_dict", "request_to_dict",
           "request_from_dict", "frame", "FrameDecoder", "error_to_dict", "error_from_dict",
           "MAX_FRAME", "REASON_MAX"]

MAX_FRAME = 64 * 1024 * 1024  # a request with inline images can be large; beyond this is a bug
_HEADER = struct.Struct(">I")

_TAGS: dict[type, str] = {
    model.TextPart: "text_part", model.ImagePart: "image", model.ReasoningPart: "reasoning",
    model.ToolCallPart: "tool_call", model.ToolResultPart: "tool_result",
    model.ExecutedToolPart: "executed_part", model.ExecutedTool: "executed",
    model.Message: "message", model.Tool: "tool", model.ToolChoice: "tool_choice",
    model.ResponseFormat: "response_format", model.Sampling: "sampling",
    model.ChatRequest: "chat_request",
    model.Start: "start", model.TextDelta: "text", model.ReasoningDelta: "reasoning_delta",
    model.ReasoningEnd: "reasoning_end", model.ToolCallStart: "tool_start",
    model.ToolCallDelta: "tool_delta", model.ToolCallEnd: "tool_end",
    model.TokenLogprob: "token_logprob", model.Logprobs: "logprobs", model.Usage: "usage",
    model.Finish: "finish",
}
_CLASSES = {tag: cls for cls, tag in _TAGS.items()}
_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _TAGS}
# Mapping-typed fields: passed through untouched in both directions
_OPAQUE = frozenset({"raw", "metadata", "passthrough_headers", "parameters", "schema"})


def encode(obj: Any) -> Any:
    """A canonical dataclass (or tuple of them, or a scalar) as JSON-ready data."""
    cls = type(obj)
    tag = _TAGS.get(cls)
    if tag is not None:
        out: dict[str, Any] = {"_t": tag}
        for name in _FIELDS[cls]:
            value = getattr(obj, name)
            if value is None:
                continue  # every None-able field defaults to None
            out[name] = (dict(value) if name in _OPAQUE and isinstance(value, Mapping)
                         else encode(value))
        return out
    if cls is tuple or cls is list:
        return [encode(v) for v in obj]
    return obj


def decode(data: Any) -> Any:
    """The inverse of :func:`encode`."""
    if type(data) is dict:
        cls = _CLASSES[data["_t"]]
        return cls(**{k: (v if k in _OPAQUE else decode(v)) for k, v in data.items() if k != "_t"})
    if type(data) is list:
        return tuple(decode(v) for v in data)
    return data


def event_to_dict(event: model.Event) -> dict[str, Any]:
    if type(event) is model.TextDelta:  # the hot path: most events are text
        return {"_t": "text", "text": event.text}
    return encode(event)


def event_from_dict(data: dict[str, Any]) -> model.Event:
    if data["_t"] == "text":
        return model.TextDelta(data["text"])
    return decode(data)


def request_to_dict(request: model.ChatRequest) -> dict[str, Any]:
    return encode(request)


def request_from_dict(data: dict[str, Any]) -> model.ChatRequest:
    request = decode(data)
    if type(request) is not model.ChatRequest:
        raise ValueError("not a chat request")
    return request


# --- errors ---------------------------------------------------------------------

_ERRORS: dict[str, type[GatewayError]] = {
    "invalid_request": BadRequest, "authentication": AuthenticationFailed,
    "permission": PermissionDenied, "not_found": NotFound, "request_too_large": PayloadTooLarge,
    "overloaded": Overloaded, "upstream": UpstreamUnavailable, "timeout": UpstreamTimeout,
    "internal": InternalError,
}

# by class name; a child cannot claim WorkerCrashed (retry safety is the gateway's call)
_BY_NAME: dict[str, type[GatewayError]] = {
    cls.__name__: cls for cls in (*_ERRORS.values(), UpstreamError, EngineUnavailable, EngineFailed)}


def error_to_dict(exc: GatewayError) -> dict[str, Any]:
    return {"error": type(exc).__name__, "kind": exc.kind, "status": exc.status, "message": exc.message, "code": exc.code,
            "param": exc.param, "retry_after": exc.retry_after}


def error_from_dict(data: Mapping[str, Any]) -> GatewayError:
    kind = str(data.get("kind") or "upstream")
    message = str(data.get("message") or "worker failed")
    status = data.get("status")
    extra = {"param": data.get("param"), "code": data.get("code"),
             "retry_after": data.get("retry_after")}
    if type(status) is not int:
        status = None
    named = _BY_NAME.get(data.get("error"))  # type: ignore[arg-type]
    if named is UpstreamError and status is not None:
        return UpstreamError(message, status=status, kind=kind, **extra)
    if named is not None and named is not UpstreamError:
        return named(message, status=status, **extra)
    cls = _ERRORS.get(kind)
    if cls is not None and (status is None or status == cls.status or cls is Overloaded):
        return cls(message, status=status, **extra)
    if status is not None and 400 <= status < 500:
        return UpstreamError(message, status=status, kind=kind, **extra)
    return UpstreamUnavailable(message, **extra)


# --- framing ----------------------------------------------------------------------

def _default(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def frame(obj: Any) -> bytes:
    """One frame: length prefix and orjson body."""
    body = orjson.dumps(obj, default=_default)
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Sans-IO: ``feed(bytes)`` returns the complete frames (decoded objects) so far."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        buf = self._buf
        buf += data
        out: list[Any] = []
        pos = 0
        end = len(buf)
        unpack = _HEADER.unpack_from
        loads = orjson.loads
        while end - pos >= 4:
            (size,) = unpack(buf, pos)
            if size > MAX_FRAME:
                raise ValueError(f"frame of {size} bytes exceeds the limit")
            if end - pos - 4 < size:
                break
            out.append(loads(memoryview(buf)[pos + 4:pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out
