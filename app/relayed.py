"""Same-dialect answers sent as the upstream's bytes (see :mod:`pool.remote.relay`).

The route asks the worker for a relay; when it gets one, the answer is the
upstream's body or frames with the model name replaced, and the relay's scan
gives usage and finish to the access record, the ledger and the metrics. A
worker whose upstream answered in the other form (a body to a stream request)
yields canonical events instead: those are encoded as usual.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from pool.errors import GatewayError
from pool.model import ChatRequest, Event

from .errors import anthropic_error_frame, openai_error_frame
from .record import RequestRecord

__all__ = ["relay_for", "RelayedEncoder", "BodyResponse", "record_body"]

_COMMENT_PING = b": ping\n\n"
_ANTHROPIC_PING = b'event: ping\ndata: {"type":"ping"}\n\n'
_DONE = b"data: [DONE]\n\n"


def relay_for(worker: Any, routed: ChatRequest, chat: ChatRequest, finalize: Any) -> Any:
    """The worker's relay for this request, or ``None`` (the canonical path):
    only workers that forward (``remote`` ones), and only when nothing needs
    the canonical answer (a stored Responses request's ``finalize``)."""
    if finalize is not None:
        return None
    relay = getattr(worker, "relay", None)
    return relay(routed, chat.model) if relay is not None else None


class RelayedEncoder:
    """The :class:`~app.streaming.Encoder` of a stream that may be forwarded.

    Forwarded frames never pass through it: it only writes what the gateway
    adds around them (pings; the error frame that replaces an upstream's). Until
    the first item came, pings are SSE comments: the upstream's own
    ``message_start`` must stay the first Anthropic event. Canonical events (an
    upstream that did not stream) go to the dialect's own encoder."""

    __slots__ = ("inner", "relay", "anthropic", "_encoding")

    def __init__(self, inner: Any, relay: Any, *, anthropic: bool) -> None:
        self.inner = inner
        self.relay = relay
        self.anthropic = anthropic
        self._encoding = False  # canonical events came: the dialect encoder writes all

    def feed(self, event: Event) -> bytes:
        self._encoding = True
        return self.inner.feed(event)

    def ping(self) -> bytes:
        if self._encoding:
            return self.inner.ping()
        if self.anthropic and self.relay.forwarded:
            return _ANTHROPIC_PING
        return _COMMENT_PING

    def close(self) -> bytes:
        # forwarded: the upstream's terminal frame went through (else the relay raised)
        return b"" if self.relay.forwarded else self.inner.close()

    def fail(self, exc: GatewayError) -> bytes:
        if not self.relay.forwarded:
            return self.inner.fail(exc)
        if self.anthropic:
            return anthropic_error_frame(exc)
        return openai_error_frame(exc) + _DONE


def record_body(record: RequestRecord, relay: Any) -> None:
    usage = relay.usage
    record.tokens_in = usage.input_tokens
    record.tokens_out = usage.output_tokens
    record.tokens_cached = usage.cached_tokens


class BodyResponse(Response):
    """The upstream's JSON body as the answer: already rendered, so none of
    ``Response``'s header building; sent as two ASGI messages."""

    def __init__(self, body: bytes, worker: str) -> None:  # noqa: super() not called
        self.body = body
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"x-poolgate-worker", worker.encode())]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body})
