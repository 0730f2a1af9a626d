"""Same-dialect answers sent as the upstream's bytes (see :mod:`pool.remote.relay`).

The route asks the worker for a relay; when it gets one, the answer is the
upstream's body or frames with the model name replaced, and the relay's scan
gives usage and finish to the access record, the ledger and the metrics. A
worker whose upstream answered in the other form (a body to a stream request)
yields canonical events instead: those are encoded as usual.
"""

from __future__ import annotations

from typing import Any, Callable

from starlette.responses import Response

from pool.errors import GatewayError
from pool.model import ChatRequest, Event

from .errors import anthropic_error_frame, google_error_frame, openai_error_frame
from .record import RequestRecord

__all__ = ["relay_for", "RelayedEncoder", "BodyResponse", "record_body"]

_COMMENT_PING = b": ping\n\n"
_BLANK_LINE = b"\n"
_DONE = b"data: [DONE]\n\n"


def relay_for(worker: Any, routed: ChatRequest, chat: ChatRequest, finalize: Any,
              dialect: Any = None) -> Any:
    """The worker's relay for this request, or ``None`` (the canonical path):
    only workers that forward (``remote`` ones), and only when nothing needs
    the canonical answer (a stored Responses request's ``finalize``) and the
    client's ``dialect`` takes the upstream's frames (not Gemini's JSON-array
    stream: ``forwards = False``)."""
    if finalize is not None or not getattr(dialect, "forwards", True):
        return None
    relay = getattr(worker, "relay", None)
    return relay(routed, chat.model) if relay is not None else None


class RelayedEncoder:
    """The :class:`~app.streaming.Encoder` of a stream that may be forwarded.

    Forwarded frames never pass through it: it only writes what the gateway
    adds around them (keep-alive pings, as SSE comments; the error frame that
    replaces an upstream's). Canonical events (an upstream that did not stream)
    go to the dialect's own encoder, built then."""

    __slots__ = ("_make", "_inner", "relay", "dialect")

    def __init__(self, make: Callable[[], Any], relay: Any, *, dialect: str) -> None:
        self._make: Callable[[], Any] | None = make  # the dialect's encoder, built when needed
        self._inner: Any = None
        self.relay = relay
        self.dialect = dialect  # the client's (ChatRequest.dialect)

    def forwarding(self) -> None:
        """The stream is forwarded (its first frames went through): the
        dialect's encoder will not be needed, so what would build it (the
        decoded request) is let go of."""
        if self.relay.forwarded:
            self._make = None

    @property
    def inner(self) -> Any:
        if self._inner is None:
            self._inner = self._make()  # type: ignore[misc]  (None only once forwarded)
        return self._inner

    def feed(self, event: Event) -> bytes:
        return self.inner.feed(event)  # canonical events: the dialect encoder writes all

    def ping(self) -> bytes:
        # A comment, also for Anthropic: the ping timer may fire between the
        # relay taking the upstream's message_start and the pump sending it,
        # and no event may precede message_start. SSE parsers skip comments;
        # google-genai reads any line but ``data:`` as JSON: a blank line for it.
        if self._inner is not None:
            return self._inner.ping()
        return _BLANK_LINE if self.dialect == "gemini" else _COMMENT_PING

    def close(self) -> bytes:
        # forwarded: the upstream's terminal frame went through (else the relay raised)
        return b"" if self.relay.forwarded else self.inner.close()

    def fail(self, exc: GatewayError) -> bytes:
        if not self.relay.forwarded:
            return self.inner.fail(exc)
        if self.dialect == "anthropic":
            return anthropic_error_frame(exc)
        if self.dialect == "gemini":
            return google_error_frame(exc)
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
