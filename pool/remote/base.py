"""Shared HTTP plumbing of the ``remote`` workers: one client per worker
(:mod:`.h1`, or an aiohttp session when the worker has an egress proxy),
timeouts, error mapping and the streaming loop.

A dialect subclass supplies only the endpoint, the body and headers for a
request, and its sans-IO parser (:mod:`.openai_chat`, :mod:`.anthropic_messages`).

Timeouts: ``connect_timeout`` bounds the TCP connect; ``first_byte_timeout``
runs from the call until the response headers (so it also covers waiting
for a free connection when ``max_connections`` is reached);
``idle_timeout`` bounds each silence between body chunks.
"""

from __future__ import annotations

import asyncio
import time
from hashlib import blake2b
from functools import partial
from typing import Any, AsyncIterator, Callable, ClassVar, Mapping

import aiohttp
import orjson
import structlog
from yarl import URL

from pool.errors import GatewayError, UpstreamCredentialsRefused, UpstreamUnavailable
from pool.accumulate import fold, fold_answer
from pool.model import ChatRequest, Completion, Event, ReasoningPart, Start
from pool.sse import SSEDecoder
from pool.worker import Capabilities, WorkerState, flatten

from . import h1
from .client import SOCKS_ERRORS, UpstreamClient
from .errors import scrub_error
from .idle import IdleTimeout, IdleWatch
from .images import vet_images
from .lean import lean_response
from .spec import RemoteSpec, StreamParser
from .reads import BodyReads, UpstreamResponse
from .relay import Relay, relay_for

__all__ = ["RemoteSpec", "RemoteWorker", "StreamParser"]

log = structlog.get_logger("pool.remote")

_HEALTH_TIMEOUT = 5.0
_NO_TOOLS: frozenset[str] = frozenset()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError


class RemoteWorker(BodyReads):
    """A worker that forwards to an HTTP upstream (see :class:`pool.worker.Worker`)."""

    kind = "remote"
    # both take the request's custom tool names (calls to them come back unwrapped)
    parser_factory: ClassVar[Callable[..., StreamParser]]
    body_events: ClassVar[Callable[..., list[Event]]]

    def __init__(self, spec: RemoteSpec, *, capabilities: Capabilities, chat_url: str,
                 health_url: str, auth_headers: Mapping[str, str],
                 default_headers: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.models = tuple(spec.models)
        self.aliases = dict(spec.aliases)
        self.capabilities = capabilities
        self.capacity = spec.max_in_flight
        self.state = WorkerState.STARTING
        self._refused = False  # unhealthy because the upstream refused our key
        self._answered = False  # an upstream request got a 2xx since the last probe began
        self.started_at: float | None = None
        self._chat_url = URL(chat_url)  # parsed once, not on every request
        # whose signed reasoning this worker's answers carry (pool/signatures.py): the
        # upstream and the key, so two workers of one account are one signer
        self.signs_per_account = spec.dialect == "anthropic"  # its thinking signatures
        self.signing_account = "remote:" + blake2b(
            f"{chat_url}\x00{spec.api_key or ''}".encode(), digest_size=12).hexdigest()
        self._health_url = health_url
        # configured headers override our defaults; the credentials override both.
        # identity: the body is parsed as it comes, never decompressed
        self._default_headers = {"user-agent": "poolgate", **(default_headers or {}),
                                 **spec.headers, **auth_headers, "accept-encoding": "identity"}
        self._client: UpstreamClient | None = None  # opened by start()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"  # no URL: it may carry credentials

    # --- subclass hooks -------------------------------------------------------

    def prepare(self, request: ChatRequest) -> tuple[dict[str, Any], Mapping[str, str]]:
        """The upstream body (a dict) and the per-request headers."""
        raise NotImplementedError

    def url_for(self, request: ChatRequest) -> URL | None:
        """The endpoint for ``request`` when it is not the one chat URL (the
        Gemini API puts the model and the streaming choice in the path)."""
        return None

    # --- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        if self._client is None:
            self._client = UpstreamClient(self.spec, self._chat_url, self._default_headers)
        self.state = WorkerState.READY
        self.started_at = time.time()

    # --- operator actions (a remote worker has no process: these are state only) ---

    def drain(self) -> None:
        """No new requests; those in flight finish."""
        self.state = WorkerState.DRAINING

    def resume(self) -> None:
        if self.state is WorkerState.DRAINING:
            self.state = WorkerState.READY

    async def restart(self) -> None:
        """Drop pooled connections and start afresh (the upstream itself is not ours)."""
        await self._close_client()
        await self.start()

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def aclose(self) -> None:
        self.state = WorkerState.STOPPED
        await self._close_client()

    async def health(self) -> bool:
        """Reachable and taking our credentials: the upstream answered the model
        listing with a status < 500 other than 401/403.

        A probe that fails without a refusal (it timed out, the connection
        broke, a 5xx) while the upstream answered requests since the previous
        probe does not take the worker out: a saturated gateway reads the
        probe's answer late, and the answers it did get say more than the one
        it missed. The next probe decides, unless requests succeed meanwhile."""
        answered, self._answered = self._answered, False
        refused = False
        try:
            client = self._client or await self._ensure_client()
            async with asyncio.timeout(min(_HEALTH_TIMEOUT, self.spec.first_byte_timeout)):
                status = await client.probe(self._health_url)
            refused = status in (401, 403)
            # 407: the egress proxy refused us, the upstream was not reached
            ok = status < 500 and not refused and status != 407
        except (aiohttp.ClientError, OSError, TimeoutError, UpstreamUnavailable, *SOCKS_ERRORS):
            ok = False
        if self.state is WorkerState.DRAINING or self.state is WorkerState.STOPPED:
            return ok
        if ok and self.state is WorkerState.UNHEALTHY:
            self.state = WorkerState.READY
            self._refused = False
        elif not ok and self.state is WorkerState.READY:
            if answered and not refused:
                log.warning("remote.probe_missed", worker=self.name)
            else:
                self.state = WorkerState.UNHEALTHY
                log.warning("remote.unhealthy", worker=self.name)
        return ok

    def _credentials_refused(self, exc: UpstreamCredentialsRefused) -> None:
        """Our key was refused: unhealthy (shown in /internal/workers; no new
        requests) until a health probe gets through with it again."""
        log.error("remote.credentials_refused", worker=self.name, status=exc.upstream_status)
        if self.state is WorkerState.READY:
            self.state = WorkerState.UNHEALTHY
            self._refused = True

    @property
    def unavailable_reason(self) -> str | None:
        """Why the pool does not pick this worker, in words a client may read."""
        if self._refused and self.state is WorkerState.UNHEALTHY:
            return f"the upstream of worker {self.name} refused the gateway's credentials"
        return None

    async def _ensure_client(self) -> UpstreamClient:
        """The client, opened on first use when ``start()`` was skipped."""
        if self.state is WorkerState.STOPPED:
            raise UpstreamUnavailable(f"worker {self.name} is stopped")
        if self._client is None:
            self._client = UpstreamClient(self.spec, self._chat_url, self._default_headers)
        return self._client

    # --- the request ------------------------------------------------------------

    async def count_tokens(self, request: ChatRequest) -> int | None:
        """The upstream's exact count of the request's input tokens, or ``None``
        when this upstream cannot count (the gateway then estimates)."""
        return None

    def stream(self, request: ChatRequest) -> AsyncIterator[Event]:
        return flatten(self._run(request, None))

    def stream_batches(self, request: ChatRequest) -> AsyncIterator[list[Event]]:
        """The events of :meth:`stream` as one list per upstream read, so the
        gateway can write all frames of one read at once."""
        return self._run(request, None)

    def relay(self, request: ChatRequest, model: str) -> Relay | None:
        """A relay when this upstream's answer to ``request`` can go to its client
        as the upstream's bytes (see :mod:`.relay`); ``model``: the client's name."""
        return relay_for(self.spec.dialect, request, model)

    def forward(self, request: ChatRequest, relay: Relay) -> AsyncIterator[bytes | Event]:
        """The answer as the bytes the client gets: the body (one item), or the
        complete SSE frames of each upstream read; ``relay`` keeps usage, finish
        and errors. An upstream that answered in the other form (a body to a
        stream request, a stream to a body request) yields lists of canonical
        events instead (as :meth:`stream_batches`), from the first item on."""
        return self._run(request, relay)

    async def complete(self, request: ChatRequest,
                       relay: Relay | None = None) -> bytes | Completion:
        """A request's whole answer in one coroutine (no async generator to
        build, step and close per request): the upstream's body as the client
        gets it when ``relay`` forwards it, else the folded Completion. An
        upstream that streams anyway is read through :meth:`_run`."""
        resp, custom = await self._send(request)
        if "event-stream" in resp.content_type:
            return await fold_answer(self._run(request, relay, resp, custom))
        reusable = False
        watch = None
        content = resp.content
        try:
            raw = content.read_nowait()  # most bodies come with the headers: no timer then
            if not content.is_eof():
                watch = IdleWatch(self.spec.idle_timeout, content)
                raw += await self._read_all(resp, watch, len(raw))
            if relay is not None and not relay.stream:
                answer: bytes | Completion = relay.body(raw)
            else:
                answer = fold(type(self).body_events(_loads_body(raw), custom))
            reusable = resp.content.is_eof() or await self._drained(resp)
            return answer
        except (GatewayError, TimeoutError, IdleTimeout, aiohttp.ClientError, OSError) as exc:
            raise self._failed(exc) from None
        finally:
            self._settle(resp, watch, reusable)

    async def _send(self, request: ChatRequest) -> tuple[UpstreamResponse, frozenset[str]]:
        """POST ``request`` (its images vetted, its body built): the 2xx
        response, and the names of the request's custom tools."""
        request = await vet_images(request, self.spec.policy, self.spec.proxy)
        body, headers = self.prepare(request)
        if request.dialect == "openai_responses":
            dropped = _encrypted_reasoning(request)
            if dropped:  # neither upstream API has a slot for OpenAI's encrypted reasoning
                log.info("remote.reasoning_dropped", worker=self.name, parts=dropped)
        # no empty frozenset per answer (216 bytes each, for as long as a stream is open)
        custom = (frozenset(t.name for t in request.tools if t.kind == "custom")
                  if request.tools else _NO_TOOLS)
        # the body is not held (a whole conversation) while the answer streams
        return await self._post(orjson.dumps(body, default=_json_default), headers,
                                url=self.url_for(request)), custom

    async def _run(self, request: ChatRequest, relay: Relay | None,
                   resp: UpstreamResponse | None = None,
                   custom: frozenset[str] = _NO_TOOLS) -> AsyncIterator[Any]:
        """The answer item by item (see :meth:`forward`); ``resp``: the
        response when it was already asked for (by :meth:`complete`)."""
        if resp is None:
            resp, custom = await self._send(request)
        del request  # not held (a whole conversation) while the answer streams
        reusable = False
        watch = IdleWatch(self.spec.idle_timeout, resp.content)
        try:
            # by what came, not what was asked: some servers stream regardless
            streamed = "event-stream" in resp.content_type
            if streamed and self.spec.lean:
                if type(resp) is h1.Response:
                    resp.lean()  # its headers, read, are let go while it streams
                else:
                    lean_response(resp)  # ≈ 2 KiB less for as long as it streams
            if relay is not None and streamed == relay.stream:
                if streamed:
                    content = resp.content
                    while not relay.done:
                        # _read_chunk's read, inline: no frame of ours waits with
                        # each open stream (its failures are mapped below)
                        chunk = content.read_nowait()
                        if not chunk and not content.is_eof():
                            watch.begin()
                            chunk = await content.readany()
                            watch.end()  # (a failure ends the answer, and closes the watch)
                        if chunk:
                            data = relay.feed(chunk)
                        else:
                            try:
                                data = relay.close()
                            except UpstreamUnavailable:
                                log.warning("remote.stream_truncated", worker=self.name)
                                raise
                        if data:
                            yield data
                        if relay.error is not None:
                            raise relay.error
                        del chunk, data  # not held while the next read waits
                else:
                    yield relay.body(await self._read_all(resp, watch))
            elif streamed:
                parser = type(self).parser_factory(custom)
                feed_into = getattr(parser, "feed_into", None) or partial(_feed_each, parser)
                decoder = SSEDecoder()
                started = False
                while not parser.done:
                    chunk = await self._read_chunk(resp, watch)
                    batch: list[Event] = []
                    failure: GatewayError | None = None
                    try:
                        feed_into(decoder.feed_data(chunk) if chunk else decoder.close_data(),
                                  batch)
                    except GatewayError as exc:
                        failure = exc  # what came before it still goes out
                    if batch:
                        if not started:
                            started = True
                            if type(batch[0]) is not Start:  # a server that skipped it
                                batch.insert(0, Start())
                        yield batch
                    if failure is not None:
                        raise failure
                    if not chunk and not parser.done:
                        log.warning("remote.stream_truncated", worker=self.name)
                        raise UpstreamUnavailable("upstream closed the stream early")
            else:
                raw = await self._read_all(resp, watch)
                yield type(self).body_events(_loads_body(raw), custom)
            reusable = resp.content.is_eof() or await self._drained(resp)
        except (GatewayError, TimeoutError, IdleTimeout, aiohttp.ClientError, OSError) as exc:
            raise self._failed(exc) from None
        finally:
            self._settle(resp, watch, reusable)

    def _failed(self, exc: BaseException) -> GatewayError:
        """What the client is told of an answer that failed with ``exc``."""
        if isinstance(exc, UpstreamCredentialsRefused):  # reported in-stream
            self._credentials_refused(exc)
            return exc
        if isinstance(exc, GatewayError):  # in-stream texts are the parsers': scrub them
            return scrub_error(exc, self.spec.api_key)
        return self._read_failed(exc)  # the relay loop's reads

    async def _post(self, body: bytes, headers: Mapping[str, str],
                    url: str | URL | None = None) -> UpstreamResponse:
        """POST ``body`` to ``url`` (default: the chat endpoint); a non-2xx
        answer is raised as the mapped :class:`GatewayError`."""
        client = self._client or await self._ensure_client()
        resp = await client.post(url or self._chat_url, body, headers)
        if 200 <= resp.status < 300:
            self._answered = True
            return resp
        try:
            refusal = await self._refusal(resp)
        finally:
            resp.close()
        if isinstance(refusal, UpstreamCredentialsRefused):
            self._credentials_refused(refusal)
        raise refusal


def _feed_each(parser: StreamParser, datas: list[str], out: list[Event]) -> None:
    """Each of ``datas`` through ``parser`` onto ``out``, up to its terminal event
    (for a parser without a ``feed_into`` of its own)."""
    for data in datas:
        out.extend(parser.feed(data))
        if parser.done:
            return


def _encrypted_reasoning(request: ChatRequest) -> int:
    """How many reasoning parts carry OpenAI ``encrypted_content`` (and no
    Anthropic signature): the translators drop them."""
    return sum(1 for m in request.messages if m.role == "assistant" for p in m.parts
               if type(p) is ReasoningPart and p.encrypted_content is not None
               and p.signature is None)


def _loads_body(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise UpstreamUnavailable("upstream sent an invalid JSON body") from None
