"""Reading an upstream's answer: what :class:`~pool.remote.base.RemoteWorker`
reads of a response, whichever client made it (:mod:`.h1`, or aiohttp
through a proxy): the body within the idle timeout, a refusal's error, a
token count, and what is left of a body so its connection can be kept.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import aiohttp
import orjson
import structlog

from pool.errors import GatewayError, UpstreamTimeout, UpstreamUnavailable

from .errors import error_from_body
from .idle import IdleTimeout, IdleWatch
from .spec import RemoteSpec

__all__ = ["BodyReads", "UpstreamResponse", "MAX_BODY"]

log = structlog.get_logger("pool.remote")

_DRAIN_TIMEOUT = 0.5         # wait for the end of a finished body, to reuse the connection
_MAX_ERROR_BODY = 64 * 1024  # read at most this much of a refusal
MAX_BODY = 64 * 2**20  # a whole (non-stream) answer; one streamed event has pool.sse.MAX_LINE


class UpstreamResponse(Protocol):
    """An answer as the workers read it (``h1.Response``, ``aiohttp.ClientResponse``)."""

    status: int
    content_type: str  # h1: the Content-Type as sent; aiohttp: its media type

    @property
    def headers(self) -> Any: ...

    @property
    def content(self) -> Any: ...

    def release(self) -> Any: ...

    def close(self) -> Any: ...


class BodyReads:
    """The reads of a worker named ``name`` with ``spec`` (its timeouts, its key)."""

    name: str
    spec: RemoteSpec

    async def _read_count(self, resp: UpstreamResponse, field: str) -> int:
        """The token count in ``field`` of a counting endpoint's answer."""
        try:
            raw = await self._read_all(resp)
        except BaseException:
            resp.close()
            raise
        resp.release()
        try:
            count = orjson.loads(raw).get(field)
        except (orjson.JSONDecodeError, AttributeError):
            count = None
        if type(count) is not int or count < 0:
            raise UpstreamUnavailable(f"upstream {self.name} sent an invalid token count")
        return count

    @staticmethod
    def _settle(resp: UpstreamResponse, watch: IdleWatch | None, reusable: bool) -> None:
        if watch is not None:
            watch.close()
        if reusable:
            resp.release()
        else:
            # the client went away or the answer broke: drop the connection
            # now so the upstream sees the disconnect and stops generating
            resp.close()

    async def _refusal(self, resp: UpstreamResponse) -> GatewayError:
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(min(self.spec.idle_timeout, 10.0)):
                while size < _MAX_ERROR_BODY and (chunk := await resp.content.readany()):
                    parts.append(chunk)
                    size += len(chunk)
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass  # what arrived is enough to name the error, if anything
        raw = b"".join(parts)[:_MAX_ERROR_BODY]
        log.warning("remote.upstream_status", worker=self.name, status=resp.status)
        return error_from_body(resp.status, raw, resp.headers, upstream=f"upstream {self.name}",
                               secret=self.spec.api_key)

    async def _read_chunk(self, resp: UpstreamResponse,
                          watch: IdleWatch | None = None) -> bytes:
        """The next body bytes (``b""`` at the end), within the idle timeout
        (kept by ``watch`` when given: one timer per answer, not one per read)."""
        content = resp.content
        try:
            # what already arrived needs no timer: most non-stream bodies come
            # with the headers, and a fast stream is often ahead of its reader
            chunk = content.read_nowait()
            if chunk or content.is_eof():
                return chunk
            if watch is not None:
                watch.begin()
                try:
                    return await content.readany()
                finally:
                    watch.end()
            async with asyncio.timeout(self.spec.idle_timeout):
                return await content.readany()
        except (TimeoutError, IdleTimeout, aiohttp.ClientError, OSError) as exc:
            raise self._read_failed(exc) from None

    def _read_failed(self, exc: BaseException) -> GatewayError:
        """The error of a body read that failed with ``exc`` (logged)."""
        if isinstance(exc, (TimeoutError, IdleTimeout)):
            log.warning("remote.idle_timeout", worker=self.name)
            return UpstreamTimeout(f"upstream {self.name} stalled for more than "
                                   f"{self.spec.idle_timeout:g}s")
        log.warning("remote.stream_broken", worker=self.name)
        return UpstreamUnavailable("upstream closed the stream early")

    async def _read_all(self, resp: UpstreamResponse, watch: IdleWatch | None = None,
                        size: int = 0) -> bytes:
        """The rest of the body (``size`` bytes of it already read): at most
        :data:`MAX_BODY` in all, else the upstream failed (the caller drops the
        connection)."""
        parts: list[bytes] = []
        while chunk := await self._read_chunk(resp, watch):
            size += len(chunk)
            if size > MAX_BODY:
                log.warning("remote.body_too_large", worker=self.name)
                raise UpstreamUnavailable(f"upstream {self.name} sent an answer over "
                                          f"{MAX_BODY >> 20} MiB")
            parts.append(chunk)
        return b"".join(parts)

    @staticmethod
    async def _drained(resp: UpstreamResponse) -> bool:
        """Read what is left after the terminal event (the end of the chunked
        body) so the connection can be reused; ``False`` if that does not come."""
        content = resp.content
        if content.is_eof():
            return True
        try:
            async with asyncio.timeout(_DRAIN_TIMEOUT):
                while await content.readany():
                    pass
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False
        return True
