"""The path every inference request takes once decoded: pick, stream, encode.

A route reads like a sentence: decode the wire body into a ``ChatRequest``,
then ``serve`` it — choose a worker, open its event stream, and either stream
SSE frames of the client's dialect or fold the events into one body.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from pool.accumulate import Accumulator
from pool.errors import GatewayError, UpstreamUnavailable
from pool.model import ChatRequest, Event

from ..gateway import Gateway
from ..http import error_response, json_response, new_id, now
from ..record import RequestRecord
from ..streaming import EventStreamResponse, StreamOutcome, until_disconnect

__all__ = ["serve", "ERROR_DIALECT"]

# client dialect -> error envelope dialect and response id prefix
ERROR_DIALECT = {"openai_chat": "openai", "anthropic": "anthropic",
                 "openai_responses": "openai", "openai_completions": "openai"}
ID_PREFIX = {"openai_chat": "chatcmpl-", "anthropic": "msg_", "openai_responses": "resp_",
             "openai_completions": "cmpl-"}


Finalize = Callable[[dict[str, Any], str], Awaitable[None]]


async def serve(gw: Gateway, request: Request, chat: ChatRequest, dialect: ModuleType,
                record: RequestRecord, *, prefer: str | None = None,
                finalize: Finalize | None = None) -> Response | EventStreamResponse:
    """Serve a decoded request with the worker the pool picks (``prefer``
    names a worker to use when it is eligible). ``finalize`` is awaited with
    the finished response object and the worker's name (stored responses);
    for a stream, once it has ended without the client leaving."""
    error_dialect = ERROR_DIALECT[chat.dialect]
    record.model = chat.model
    record.stream = chat.stream
    try:
        worker, routed = gw.pool.pick(chat, prefer)
    except GatewayError as exc:
        record.error = exc.kind
        return error_response(exc, error_dialect)
    record.worker = worker.name
    worker_header = {"x-poolgate-worker": worker.name}
    gw.acquire(worker)
    handed_over = False
    try:
        events = worker.stream(routed)
        if chat.stream:
            iterator = events.__aiter__()
            first = await until_disconnect(request.receive, _first_event(iterator))
            encoder = dialect.StreamEncoder(chat, response_id=new_id(ID_PREFIX[chat.dialect]),
                                            created=now(), model=chat.model)

            def on_done(outcome: StreamOutcome) -> None:
                gw.release(worker)
                _record_stream(record, outcome, gw)

            after = None
            if finalize is not None:
                async def after() -> None:
                    await finalize(encoder.response(), worker.name)

            handed_over = True
            return EventStreamResponse(
                first, iterator, encoder,
                headers=[(b"x-poolgate-worker", worker.name.encode())],
                ping_interval=gw.ping_interval, on_done=on_done, after=after)
        completion = await until_disconnect(request.receive, _fold(events))
        usage = completion.usage
        record.tokens_in = usage.input_tokens
        record.tokens_out = usage.output_tokens
        body = dialect.encode_completion(completion, chat,
                                         response_id=new_id(ID_PREFIX[chat.dialect]),
                                         created=now(), model=chat.model)
        if finalize is not None:
            await finalize(body, worker.name)
        return json_response(body, headers=worker_header)
    except GatewayError as exc:
        record.error = exc.kind
        gw.metrics_upstream_error(worker.name, exc.kind)
        return error_response(exc, error_dialect, worker_header)
    finally:
        if not handed_over:
            gw.release(worker)


async def _first_event(iterator: Any) -> Event:
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        raise UpstreamUnavailable("The worker ended its answer before it began.") from None


async def _fold(events: Any) -> Any:
    acc = Accumulator()
    try:
        async for event in events:
            acc.feed(event)
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    return acc.finish()


def _record_stream(record: RequestRecord, outcome: StreamOutcome, gw: Gateway) -> None:
    record.tokens_in = outcome.usage_in
    record.tokens_out = outcome.usage_out
    record.disconnected = outcome.disconnected
    if outcome.error is not None:
        record.error = outcome.error.kind
        if record.worker is not None:
            gw.metrics_upstream_error(record.worker, outcome.error.kind)
    elif outcome.disconnected:
        record.error = "client_disconnected"
    if outcome.first_token_at is not None:
        record.ttft = outcome.first_token_at - record.started

