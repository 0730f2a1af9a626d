"""Map what an upstream said went wrong onto :mod:`pool.errors`, in one place.

Pure functions: the HTTP plumbing (:mod:`pool.remote.base`) and both stream
parsers call them, so an HTTP 429 and an in-stream ``rate_limit_error`` end up
as the same exception. Messages never contain a response body of a 5xx (it
may echo internals) and are scrubbed of the upstream API key.
"""

from __future__ import annotations

import email.utils
import re
import time
from typing import Any, Mapping

import orjson

from pool.errors import (
    GatewayError, UpstreamCredentialsRefused, UpstreamError, UpstreamTimeout, UpstreamUnavailable,
    kind_for_status,
)

__all__ = ["loads_upstream", "error_for_status", "error_from_body", "error_from_object", "parse_retry_after",
           "scrub", "scrub_error"]

# Anthropic ``error.type`` (also used by some OpenAI-compatible servers) -> HTTP status
_STATUS_BY_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "api_error": 500,
    "server_error": 500,
    "overloaded_error": 529,
    "timeout_error": 504,
}


# what looks like a key, whole or partly masked ("sk-proj-****abcd", "sk-ant-api03-…",
# "Bearer abc"): upstreams quote the key they refused
_KEY_LIKE = re.compile(r"\b(?:sk|pk|rk|ak)[-_][\w\-*.…]*[\w*…]|\bBearer\s+\S+", re.IGNORECASE)


def scrub(message: str, secret: str | None) -> str:
    """Remove ``secret`` (the upstream API key) and anything key-like from a
    message meant for a client or a log."""
    if secret and secret in message:
        message = message.replace(secret, "***")
    return _KEY_LIKE.sub("***", message)


def scrub_error(exc: GatewayError, secret: str | None) -> GatewayError:
    """``exc`` with its message scrubbed (in place; errors raised in-stream are
    built by the parsers, which do not know the key)."""
    clean = scrub(exc.message, secret)
    if clean != exc.message:
        exc.message = clean
        exc.args = (clean,)
    return exc


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait, from ``retry-after-ms``, ``retry-after`` (seconds or HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_for_status(status: int, message: str | None, *, upstream: str = "upstream",
                     param: str | None = None, code: str | None = None,
                     retry_after: float | None = None) -> GatewayError:
    """The exception for an upstream that answered (or reported in-stream) ``status``.

    4xx, 429 and 529 keep the upstream's status and message so the client sees
    what the upstream said in its own dialect, except 401 and 403: those refuse
    the gateway's credentials, a 502 (:class:`UpstreamCredentialsRefused`);
    other 5xx become a 502 that names only the status.
    """
    if status in (401, 403):
        return UpstreamCredentialsRefused(status)
    if 400 <= status < 500 or status == 529:
        return UpstreamError(message or f"{upstream} refused the request (HTTP {status})",
                             status=status, kind=kind_for_status(status), param=param,
                             code=code, retry_after=retry_after)
    if status == 504:
        return UpstreamTimeout(f"{upstream} timed out (HTTP 504)", retry_after=retry_after)
    return UpstreamUnavailable(f"{upstream} failed (HTTP {status})", retry_after=retry_after)


def _envelope(body: Any) -> tuple[str | None, str | None, str | None, str | None]:
    """(message, type, param, code) from either dialect's error envelope, or a
    bare ``{"message"}`` / ``{"detail"}`` (FastAPI-style servers)."""
    if not isinstance(body, dict):
        return None, None, None, None
    err = body.get("error", body)
    if isinstance(err, str):
        return err, None, None, None
    if not isinstance(err, dict):
        return None, None, None, None
    message = err.get("message")
    if not isinstance(message, str):
        detail = err.get("detail")
        message = detail if isinstance(detail, str) else None
    etype, param, code = err.get("type"), err.get("param"), err.get("code")
    return (message, etype if isinstance(etype, str) else None,
            param if isinstance(param, str) else None,
            code if isinstance(code, str) else None)


def error_from_body(status: int, raw: bytes, headers: Mapping[str, str], *,
                    upstream: str, secret: str | None) -> GatewayError:
    """The exception for a non-2xx HTTP answer with body ``raw``."""
    retry_after = parse_retry_after(headers)
    if not (400 <= status < 500 or status == 529):
        return error_for_status(status, None, upstream=upstream, retry_after=retry_after)
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = None
    message, _, param, code = _envelope(body)
    if message is not None:
        message = scrub(message, secret)
    return error_for_status(status, message, upstream=upstream, param=param, code=code,
                            retry_after=retry_after)


def error_from_object(obj: Any, *, upstream: str = "upstream") -> GatewayError:
    """The exception for an error reported inside a 2xx answer: an Anthropic
    ``event: error`` / ``{"type": "error"}`` body, or an OpenAI-style
    ``{"error": {...}}`` chunk (vLLM and others send those mid-stream)."""
    message, etype, param, code = _envelope(obj)
    err = obj.get("error") if isinstance(obj, dict) else None
    raw_code = err.get("code") if isinstance(err, dict) else None
    if isinstance(raw_code, int) and 400 <= raw_code < 600:
        status = raw_code
    elif code == "invalid_api_key":  # OpenAI's type for it is invalid_request_error
        status = 401
    else:
        status = _STATUS_BY_TYPE.get(etype or code or "", 500)
    if status >= 500 and status not in (504, 529):
        # no upstream text for server faults: it may describe internals
        return UpstreamUnavailable(f"{upstream} reported {etype or code or 'an error'}")
    return error_for_status(status, scrub(message, None) if message else message,
                            upstream=upstream, param=param, code=code)


def loads_upstream(data: str | bytes) -> Any:
    """One JSON payload from an upstream (a body or an SSE ``data`` line);
    invalid JSON is the upstream's failure, not the client's."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamUnavailable("upstream sent invalid JSON") from None
