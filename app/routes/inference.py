"""The path every inference request takes once decoded: pick, stream, encode.

A route reads like a sentence: decode the wire body into a ``ChatRequest``,
then ``serve`` it — choose a worker, open its event stream, and either stream
SSE frames of the client's dialect or fold the events into one body.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache, partial
from types import ModuleType
from typing import Any, Awaitable, Callable, TypeVar

import structlog
from starlette.requests import Request
from starlette.responses import Response

from pool.accumulate import fold_answer
from pool.errors import GatewayError, UpstreamUnavailable
from pool.model import ChatRequest, Completion, Event, ReasoningPart
from pool.signatures import opaque_value
from pool.tokens import estimate_tokens

from ..gateway import Gateway
from ..http import error_response, json_response, new_id, now
from ..record import RequestRecord
from ..relayed import BodyResponse, RelayedEncoder, record_body, relay_for
from ..streaming import ClientGone, EventStreamResponse, StreamOutcome, until_disconnect

__all__ = ["serve", "complete", "count_input", "ERROR_DIALECT"]

T = TypeVar("T")

log = structlog.get_logger("poolgate.request")

# client dialect -> error envelope dialect and response id prefix
ERROR_DIALECT = {"openai_chat": "openai", "anthropic": "anthropic",
                 "openai_responses": "openai", "openai_completions": "openai", "native": "openai",
                 "gemini": "gemini"}
ID_PREFIX = {"openai_chat": "chatcmpl-", "anthropic": "msg_", "openai_responses": "resp_",
             "openai_completions": "cmpl-", "native": "gen-", "gemini": ""}


Finalize = Callable[[dict[str, Any], str], Awaitable[None]]

# Failures worth one more try on another worker, when no byte reached the client yet
# (and an upstream's rate limit: another account may have room).
RETRYABLE = frozenset({"upstream", "timeout", "overloaded"})


async def serve(gw: Gateway, request: Request, chat: ChatRequest, dialect: ModuleType,
                record: RequestRecord, *, prefer: str | None = None,
                finalize: Finalize | None = None) -> Response | EventStreamResponse:
    """Serve a decoded request with the worker the pool picks (``prefer``
    names a worker to use when it is eligible). A worker that fails before
    the client got a byte is replaced once by another eligible worker.
    ``finalize`` is awaited with the finished response object and the worker's
    name (stored responses); for a stream, once it ended without the client leaving."""
    record.model = chat.model
    record.stream = chat.stream

    # _attempt(lease, routed) with the rest bound (a partial: no coroutine of its own)
    attempt = partial(_attempt, gw, request, chat, dialect, record, finalize)
    try:
        return await _with_retry(gw, request, chat, record, prefer, attempt)
    except GatewayError as exc:
        record.error = exc.kind
        worker = getattr(exc, "worker", None)
        return error_response(exc, ERROR_DIALECT[chat.dialect],
                              {"x-poolgate-worker": worker} if worker else None)


async def complete(gw: Gateway, request: Request, chat: ChatRequest,
                   record: RequestRecord, *, counted: bool = False) -> Completion:
    """The whole answer to ``chat`` as one Completion (admitted, routed and
    retried like :func:`serve`; ``counted``: the key's policy already admitted
    the request this answer is part of); raises GatewayError."""
    async def attempt(lease: Any, routed: ChatRequest) -> Completion:
        try:
            answer = await until_disconnect(request.receive, fold_answer(lease.worker.stream(routed)))
        except BaseException:
            # In a fan-out (a list prompt) this failure ends the whole request: give the slot
            # back one loop tick later, once the task group has cancelled the siblings queued
            # for it, so none of them is granted it and starts work nobody will read.
            asyncio.get_running_loop().call_soon(gw.release, lease)
            raise
        gw.release(lease)
        return answer

    return await _with_retry(gw, request, chat, record, None, attempt, counted)


async def _with_retry(gw: Gateway, request: Request, chat: ChatRequest, record: RequestRecord,
                      prefer: str | None,
                      attempt: Callable[[Any, ChatRequest], Awaitable[T]],
                      counted: bool = False) -> T:
    """Admit and route ``chat``, run ``attempt(lease, routed)``; on a retryable
    failure try once more on another eligible worker. Raises the GatewayError
    the client must see, with ``.worker`` naming the last worker tried."""
    if not counted and record.key in gw.teams.policies:  # the key's models, rate and budget
        await gw.admit_key(record.key, chat.model)
    tried: list[str] = []
    failure: GatewayError | None = None
    while True:
        try:
            lease, routed = await gw.admit(chat, request.headers, record.key, prefer, tried)
        except GatewayError as exc:
            failure = failure or exc  # no other worker: the first failure is the answer
            failure.worker = tried[-1] if tried else None  # type: ignore[attr-defined]
            raise failure from None
        worker = lease.worker
        record.worker = worker.name
        try:
            return await attempt(lease, routed)
        except GatewayError as exc:
            gw.metrics_upstream_error(worker.name, exc.kind)
            tried.append(worker.name)
            exc.worker = worker.name  # type: ignore[attr-defined]
            limited = exc.kind == "rate_limit"
            if limited:
                # the upstream account is at its limit: nothing new for it until the reset
                # it gave, and this request goes to another account (when one can take it)
                gw.pool.cool_down(worker.name, exc.retry_after or gw.cooldown_seconds)
            if (exc.kind not in RETRYABLE and not limited) or isinstance(exc, ClientGone) \
                    or len(tried) > 1:
                raise
            if not limited:
                gw.pool.cool_down(worker.name, gw.cooldown_seconds)
            failure = exc
            log.info("request.retry", failed_worker=worker.name, error=exc.kind)


async def _attempt(gw: Gateway, request: Request, chat: ChatRequest, dialect: ModuleType,
                   record: RequestRecord, finalize: Finalize | None, lease: Any,
                   routed: ChatRequest) -> Response | EventStreamResponse:
    """One try on the leased worker; raises GatewayError while nothing was sent.
    The lease is released on every path: here, or when the stream ends."""
    worker = lease.worker
    handed_over = False
    try:
        relay = relay_for(worker, routed, chat, finalize, dialect)
        if chat.stream:
            iterator = _events(worker, routed, relay).__aiter__()
            first = await _begin(gw, request, iterator)
            end = _StreamEnd(gw, lease, record, routed)
            # a forwarded stream builds the dialect's encoder only if it needs one
            # (the upstream answered with a body, or failed before its first frame);
            # what would build it, with the decoded request, goes once it forwards
            encoder = _encoder(dialect, chat) if relay is None else RelayedEncoder(
                partial(_encoder, dialect, chat), relay, dialect=chat.dialect)
            after = None
            if finalize is not None:
                async def after() -> None:
                    await finalize(encoder.response(), worker.name)

            handed_over = True
            return EventStreamResponse(
                first, iterator, encoder,
                headers=_worker_header(worker.name),
                ping_interval=gw.ping_interval, on_done=end.done, after=after, relay=relay)
        whole = getattr(worker, "complete", None)  # one coroutine, where the worker has it
        answer = whole(routed, relay) if whole is not None else fold_answer(_events(worker, routed, relay))
        completion = await until_disconnect(request.receive, answer)
        if type(completion) is bytes:  # forwarded as the upstream's body
            record_body(record, relay)
            gw.note_signed(worker, getattr(relay, "signed", None))
            return BodyResponse(completion, worker.name)
        gw.note_signed(worker, [v for p in completion.parts if type(p) is ReasoningPart
                                if (v := opaque_value(p))])
        usage = completion.usage
        record.tokens_in = usage.input_tokens
        record.tokens_out = usage.output_tokens
        record.tokens_cached = usage.cached_tokens
        body = dialect.encode_completion(completion, chat,
                                         response_id=new_id(ID_PREFIX[chat.dialect]),
                                         created=now(), model=chat.model)
        if finalize is not None:
            await finalize(body, worker.name)
        return json_response(body, headers={"x-poolgate-worker": worker.name})
    finally:
        if not handed_over:
            gw.release(lease)


def _events(worker: Any, routed: ChatRequest, relay: Any) -> Any:
    """The worker's answer as it comes: the client's bytes when ``relay``
    forwards it, else lists of events (one per upstream read) from workers
    that can, else events."""
    if relay is not None:
        return worker.forward(routed, relay)
    batches = getattr(worker, "stream_batches", None)
    return worker.stream(routed) if batches is None else batches(routed)


class _StreamEnd:
    """What a stream needs at its end: the lease given back and the record
    filled in. One object, not closures over the attempt's variables: it lives
    as long as the stream. It does not hold the request (a whole conversation,
    for as long as the stream is open): only its input estimate, what a stream
    cut before the worker reported usage is charged, taken now (about 1 µs for
    a short request, 30 µs for a hundred messages)."""

    __slots__ = ("gw", "lease", "record", "estimate")

    def __init__(self, gw: Gateway, lease: Any, record: RequestRecord,
                 routed: ChatRequest) -> None:
        self.gw = gw
        self.lease = lease
        self.record = record
        self.estimate = estimate_tokens(routed)

    def done(self, outcome: StreamOutcome) -> None:
        self.gw.release(self.lease)
        _record_stream(self.record, outcome, self.gw, self.estimate)
        self.gw.note_signed(self.lease.worker, outcome.signed)


@lru_cache(maxsize=1024)
def _worker_header(name: str) -> list[tuple[bytes, bytes]]:
    """A stream's ``x-poolgate-worker`` header: one list per worker, shared by its
    streams (never changed: it is copied when the response starts)."""
    return [(b"x-poolgate-worker", name.encode())]


def _encoder(dialect: ModuleType, chat: ChatRequest) -> Any:
    """The dialect's stream encoder for ``chat`` (it keeps none of the request)."""
    return dialect.StreamEncoder(chat, response_id=new_id(ID_PREFIX[chat.dialect]),
                                 created=now(), model=chat.model)


async def _begin(gw: Gateway, request: Request, iterator: Any) -> Event | asyncio.Future[Event]:
    """The worker's first event if it comes within ``stream_grace`` (a failure
    until then can still be an HTTP error, or a retry elsewhere); else the
    pending future, and the response starts with headers and pings."""
    task = asyncio.ensure_future(_first_event(iterator))
    try:
        await until_disconnect(request.receive, asyncio.wait({task}, timeout=gw.stream_grace))
    except BaseException:
        task.cancel()
        await asyncio.wait({task})
        raise
    return task.result() if task.done() else task


async def _first_event(iterator: Any) -> Event:
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        raise UpstreamUnavailable("The worker ended its answer before it began.") from None


def _record_stream(record: RequestRecord, outcome: StreamOutcome, gw: Gateway,
                   estimate: int) -> None:
    record.tokens_in = outcome.usage_in
    record.tokens_out = outcome.usage_out
    record.tokens_cached = outcome.usage_cached
    if outcome.usage_out is None and outcome.content_events:
        # cut before the worker reported usage: charge what was sent
        record.tokens_out = outcome.content_events
        if outcome.usage_in is None:
            record.tokens_in = estimate
    record.disconnected = outcome.disconnected
    if outcome.error is not None:
        record.error = outcome.error.kind
        if record.worker is not None:
            gw.metrics_upstream_error(record.worker, outcome.error.kind)
    elif outcome.disconnected:
        record.error = "client_disconnected"
    if outcome.first_token_at is not None:
        record.ttft = outcome.first_token_at - record.started


async def count_input(gw: Gateway, chat: ChatRequest, record: RequestRecord, *,
                      known_only: bool) -> tuple[dict[str, str], int]:
    """The input tokens of ``chat`` for a count_tokens route, and the header
    saying how they were counted: the worker's own count when it has one (an
    Anthropic or Gemini upstream, a local tokenizer), else the documented
    estimate of :func:`pool.tokens.estimate_tokens`. One request of the key's
    ``rpm`` (an upstream is asked with the operator's credentials); it charges
    no tokens. A model no worker serves is a 404 when ``known_only``, else
    estimated (Claude Code falls back to billable calls on a 404)."""
    record.model = chat.model
    await gw.admit_key(record.key, chat.model)
    exact = None
    if gw.pool.knows(chat.model):
        worker, routed = gw.pool.pick(chat)
        record.worker = worker.name
        counter = getattr(worker, "count_tokens", None)
        exact = await counter(routed) if counter is not None else None
    elif known_only:
        raise gw.unknown_model(record.key, chat.model)
    tokens = exact if exact is not None else estimate_tokens(chat)
    record.tokens_in = tokens
    return {"x-poolgate-token-count": "exact" if exact is not None else "estimate"}, tokens
