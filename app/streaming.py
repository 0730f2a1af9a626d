"""Drive a worker's event stream onto the wire.

Two ASGI-level pieces the routes share:

* :class:`EventStreamResponse` sends SSE frames from a dialect encoder: the
  request's task pumps events, a :class:`~app.disconnect.DisconnectWatch`
  (no task of its own) notices the client going away (which cancels the
  pump, and so the worker's upstream request), and the loop's ping board sends keep-alive pings while the worker is silent.
  Every exit path ends the stream with the dialect's terminal frames, and
  calls ``on_done`` exactly once.
* :func:`until_disconnect` runs a non-streaming request's work and cancels it
  if the client disconnects first.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol, TypeVar

import structlog

from pool.board import Board, Entry, board
from pool.errors import GatewayError, InternalError, UpstreamUnavailable
from pool.model import Event, Finish, ReasoningEnd, Start, Usage

from .disconnect import DisconnectWatch
from .watch import watch

__all__ = ["EventStreamResponse", "until_disconnect", "Encoder", "StreamOutcome"]

log = structlog.get_logger("poolgate.stream")
T = TypeVar("T")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class Encoder(Protocol):
    def feed(self, event: Event) -> bytes: ...
    def ping(self) -> bytes: ...
    def close(self) -> bytes: ...
    def fail(self, exc: GatewayError) -> bytes: ...


class StreamOutcome:
    """What became of a stream, for the access log and metrics."""

    __slots__ = ("usage_in", "usage_out", "usage_cached", "finish", "error", "disconnected",
                 "first_token_at", "content_events", "signed")

    def __init__(self) -> None:
        self.usage_in: int | None = None
        self.usage_out: int | None = None
        self.usage_cached: int | None = None
        self.finish: str | None = None
        self.error: GatewayError | None = None
        self.disconnected = False
        self.first_token_at: float | None = None
        # events with content sent to the client: what a stream cut before
        # the worker reported usage is charged (about a token each)
        self.content_events = 0
        # the signed reasoning values handed out (noted against the worker's account)
        self.signed: list[str] | None = None

    def sign(self, event: ReasoningEnd) -> None:
        value = event.redacted_data or event.signature or event.encrypted_content
        if value:
            if self.signed is None:
                self.signed = []
            self.signed.append(value)


class EventStreamResponse:
    """An ASGI response streaming ``first`` then the rest of ``events``.

    ``first`` may still be pending (a future): the worker is slow to begin
    (a long prefill, a queue), so the headers go out now and keep-alive pings
    follow while it works; a failure then ends the stream with the dialect's
    error frame."""

    __slots__ = ("first", "events", "encoder", "headers", "ping_interval", "on_done", "after",
                 "outcome", "relay", "_pings", "_task", "_pumping", "_feed_batch")

    def __init__(self, first: Event | asyncio.Future[Event], events: AsyncIterator[Event],
                 encoder: Encoder, *,
                 headers: list[tuple[bytes, bytes]], ping_interval: float,
                 on_done: Callable[[StreamOutcome], None],
                 after: Callable[[], Awaitable[None]] | None = None,
                 relay: Any = None) -> None:
        self.first = first
        self.events = events
        self.encoder = encoder
        self.headers = headers  # after SSE_HEADERS, joined when the response starts
        self.ping_interval = ping_interval
        self.on_done = on_done
        self.after = after  # awaited once the stream ended, unless the client left
        self.outcome = StreamOutcome()
        self._pings: _Pinger | None = None
        self._task: asyncio.Task[Any] | None = None  # the request's, which pumps
        self._pumping = True  # the client leaving now cancels the stream
        # a same-dialect stream (pool.remote.relay.Relay): the worker yields the
        # upstream's frames as bytes, and the relay keeps their usage and finish;
        # its encoder is an app.relayed.RelayedEncoder
        self.relay = relay
        # the encoder's feed() of a list of events at once, when it has one
        self._feed_batch = getattr(encoder, "feed_batch", None)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # The pump runs in the request's own task; a watch driven by receive()'s
        # own futures notices the client leaving (and cancels it); pings come
        # from the loop's board (a place on it, no timer per stream), which
        # starts a short task only when a ping is due. No task and no timer of
        # its own per open stream: less memory with thousands of them open.
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        watch: DisconnectWatch | None = None
        pings: _Pinger | None = None
        relay = None  # the relay, once the upstream's frames are forwarded
        # Everything from the response start on is inside the try: a start
        # that fails (the client gone) or is cancelled still gives the lease
        # back, stops the worker and closes its upstream request (the finally).
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": SSE_HEADERS + self.headers})
            # The request's headers were read (auth, routing, decoding; a retry
            # happens before a stream starts): emptied, so neither the scope nor
            # uvicorn's protocol (the same list, until the connection's next
            # request) holds them for as long as the stream is open.
            request_headers = scope.get("headers")
            if type(request_headers) is list:
                request_headers.clear()
            del request_headers
            watch = DisconnectWatch(receive, self._client_gone, task.get_loop())
            if self.ping_interval > 0:
                pings = self._pings = _Pinger(self, send, task.get_loop())
            # the pump, in this frame (one coroutine frame fewer per open stream)
            try:
                if isinstance(self.first, asyncio.Future):
                    self.first = await self.first
                # the first item is taken from self.first as it is sent, so
                # no frame of the stream holds it afterwards
                if type(self.first) is bytes:
                    # forwarded: the upstream's frames as the worker yields them,
                    # one write per upstream read (in this frame too); the
                    # relay's account goes into the outcome on every exit
                    relay = self.relay
                    self.encoder.forwarding()  # type: ignore[attr-defined]
                    outcome = self.outcome
                    if relay.content_events:
                        outcome.first_token_at = time.perf_counter()
                    data, self.first = self.first, None
                    self._sent()
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                    async for data in self.events:
                        if outcome.first_token_at is None and relay.content_events:
                            outcome.first_token_at = time.perf_counter()
                        self._sent()
                        await send({"type": "http.response.body", "body": data,
                                    "more_body": True})
                        del data  # sent: not held while the next read waits
                else:
                    await self._encode(send)
                tail = self.encoder.close()
            except (asyncio.CancelledError, GeneratorExit):
                raise
            except Exception as exc:
                tail = self._failed(exc)
            await send({"type": "http.response.body", "body": tail, "more_body": False})
            self._pumping = False
            if self.after is not None:
                await self.after()
        except asyncio.CancelledError:
            # the watcher's cancel is ours to absorb; any other one goes on
            if not self.outcome.disconnected or task.uncancel() > 0:
                raise
        finally:
            self._pumping = False
            if watch is not None:
                watch.close()
            if pings is not None:
                pings.stop()
            first = self.first
            if isinstance(first, asyncio.Future) and not first.done():
                first.cancel()  # the client left before the worker began: stop it
                await asyncio.wait({first})
            await _aclose_quietly(self.events)
            if relay is not None:
                self._relayed(relay)
            self.on_done(self.outcome)

    def _sent(self) -> None:
        """A frame went out: the next ping is due a ping interval from now."""
        pings = self._pings
        if pings is not None:
            pings.sent()

    def _failed(self, exc: Exception) -> bytes:
        """The stream's last frames when the worker failed (called while handling ``exc``)."""
        if not isinstance(exc, GatewayError):  # a worker bug must still end the stream properly
            log.exception("stream.worker_crashed")
            exc = InternalError("The worker failed while answering.")
        self.outcome.error = exc
        return self.encoder.fail(exc)

    async def _encode(self, send: Any) -> None:
        """Encode the worker's events in the client's dialect: one write per
        event, or per list of events (a worker's ``stream_batches``: one
        upstream read)."""
        first, self.first = self.first, None
        frame = self._frames(first)
        del first
        if frame:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        async for item in self.events:
            frame = self._frames(item)
            if frame:
                self._sent()
                await send({"type": "http.response.body", "body": frame, "more_body": True})

    def _frames(self, item: Any) -> bytes:
        if type(item) is not list:
            return self._frame(item)
        if len(item) == 1:
            return self._frame(item[0])
        feed_batch = self._feed_batch
        if feed_batch is None:
            return b"".join([self._frame(event) for event in item])
        outcome = self.outcome
        content = 0
        for event in item:
            t = type(event)
            if t is Usage or t is Finish:
                self._account(event)
            elif t is not Start:  # the stream's start is no content (nor its first token)
                content += 1
                if t is ReasoningEnd:
                    outcome.sign(event)
        if content:
            outcome.content_events += content
            if outcome.first_token_at is None:
                outcome.first_token_at = time.perf_counter()
        return feed_batch(item)

    def _account(self, event: Usage | Finish) -> None:
        outcome = self.outcome
        if type(event) is Finish:
            outcome.finish = event.reason
            return
        if event.input_tokens is not None:
            outcome.usage_in = event.input_tokens
        if event.output_tokens is not None:
            outcome.usage_out = event.output_tokens
        if event.cached_tokens is not None:
            outcome.usage_cached = event.cached_tokens

    def _frame(self, event: Event) -> bytes:
        outcome = self.outcome
        t = type(event)
        if t is Usage or t is Finish:
            self._account(event)
        elif t is not Start:  # the stream's start is no content (nor its first token)
            outcome.content_events += 1
            if outcome.first_token_at is None:
                outcome.first_token_at = time.perf_counter()
            if t is ReasoningEnd:
                outcome.sign(event)
        return self.encoder.feed(event)

    def _relayed(self, relay: Any) -> None:
        """A forwarded stream's account, kept by its relay, into the outcome."""
        outcome = self.outcome
        usage = relay.usage
        outcome.usage_in = usage.input_tokens
        outcome.usage_out = usage.output_tokens
        outcome.usage_cached = usage.cached_tokens
        outcome.finish = relay.finish
        outcome.content_events = relay.content_events
        outcome.signed = getattr(relay, "signed", None)

    def _client_gone(self) -> None:
        if self._pumping and self._task is not None:
            self.outcome.disconnected = True
            self._task.cancel()


class _Pinger(Entry):
    """Keep-alive pings while the worker is silent: the stream's place on the
    loop's board for its ping interval (see :mod:`pool.board`), taken again
    at every frame sent, so a ping goes out once the stream has been silent
    for the interval (up to a tenth of it, at most a second, later).

    Frames are whole SSE events and uvicorn writes each send() before it
    awaits flow control, so a ping can never land inside another frame."""

    __slots__ = ("stream", "send", "task", "_board")

    def __init__(self, stream: EventStreamResponse, send: Any,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.stream = stream
        self.send = send
        self.task: asyncio.Future[None] | None = None
        self._board: Board[_Pinger] | None = board(loop, stream.ping_interval, _ping_due)
        self._board.join(self)

    def sent(self) -> None:
        found = self._board
        if found is not None:
            found.leave(self)
            found.join(self)

    def due(self) -> None:
        if self.task is None:
            self.task = asyncio.ensure_future(self._ping())
        self._board.join(self)  # type: ignore[union-attr]  (stop() takes it off the board)

    async def _ping(self) -> None:
        try:
            await self.send({"type": "http.response.body", "body": self.stream.encoder.ping(),
                             "more_body": True})
        finally:
            self.task = None

    def stop(self) -> None:
        if self._board is not None:
            self._board.leave(self)
            self._board = None
        if self.task is not None:
            self.task.cancel()


def _ping_due(pinger: _Pinger) -> None:
    pinger.due()


async def _aclose_quietly(events: AsyncIterator[Event]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:  # noqa: BLE001 - the stream is over either way
            log.debug("stream.aclose_failed", exc_info=True)


# A non-stream answer that comes sooner than this never starts a watcher
# task; a client that left meanwhile is noticed when it starts (uvicorn's
# receive() reports the disconnect at once), so cancelling the upstream is at
# most one and a half times this later (see app.watch).
WATCH_AFTER = 0.25


async def until_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]],
                           work: Awaitable[T], *, watch_after: float = WATCH_AFTER) -> T:
    """Await ``work`` in the current task; if the client disconnects first,
    cancel it (and so the worker's upstream request) and raise :class:`ClientGone`.

    The work stays in the request's task; a helper task watches ``receive``
    only once ``work`` has taken ``watch_after`` seconds (before that, a place
    on the loop's board is all it costs: see :mod:`app.watch`).
    """
    task = asyncio.current_task()
    assert task is not None
    entry = watch(task, receive, watch_after)
    try:
        return await work
    except asyncio.CancelledError:
        if entry.gone and task.uncancel() == 0:
            raise ClientGone("The client disconnected.") from None
        raise
    finally:
        entry.leave()


class ClientGone(UpstreamUnavailable):
    """The client disconnected before its answer was ready."""

    status = 499
