"""Map :mod:`pool.errors` once per dialect to its wire envelope and status.

OpenAI: ``{"error": {"message", "type", "param", "code"}}``.
Anthropic: ``{"type": "error", "error": {"type", "message"}}``; overload is 529.
Gemini (Google APIs): ``{"error": {"code", "message", "status", "details"}}``, the
status a ``google.rpc.Code`` name; a rejected field is named in the message and
in a ``google.rpc.BadRequest`` field violation; overload is 503 ``UNAVAILABLE``.
"""

from __future__ import annotations

from typing import Any

import orjson

from pool.errors import GatewayError

__all__ = ["openai_error", "anthropic_error", "google_error", "error_body", "error_status",
           "error_headers", "openai_error_frame", "anthropic_error_frame", "google_error_frame"]

# neutral kind -> (OpenAI error.type, OpenAI error.code)
_OPENAI = {
    "invalid_request": ("invalid_request_error", None),
    "authentication": ("authentication_error", "invalid_api_key"),
    "permission": ("permission_error", None),
    "not_found": ("invalid_request_error", "not_found"),  # an unknown model says model_not_found itself
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit": ("rate_limit_error", "rate_limit_exceeded"),
    "overloaded": ("rate_limit_error", "rate_limit_exceeded"),
    "upstream": ("api_error", "upstream_error"),
    "timeout": ("api_error", "upstream_timeout"),
    "internal": ("api_error", "internal_error"),
}

# neutral kind -> Anthropic error.type
_ANTHROPIC = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "request_too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "overloaded": "overloaded_error",
    "upstream": "api_error",
    "timeout": "api_error",
    "internal": "api_error",
}


# neutral kind -> google.rpc.Code name
_GOOGLE = {
    "invalid_request": "INVALID_ARGUMENT",
    "authentication": "UNAUTHENTICATED",
    "permission": "PERMISSION_DENIED",
    "not_found": "NOT_FOUND",
    "request_too_large": "INVALID_ARGUMENT",
    "rate_limit": "RESOURCE_EXHAUSTED",
    "overloaded": "UNAVAILABLE",
    "upstream": "UNAVAILABLE",
    "timeout": "DEADLINE_EXCEEDED",
    "internal": "INTERNAL",
}
_OVERLOADED = {"anthropic": 529, "gemini": 503}


def error_status(exc: GatewayError, dialect: str) -> int:
    if exc.kind == "overloaded":
        return _OVERLOADED.get(dialect, 429)
    return exc.status


def openai_error(exc: GatewayError) -> dict[str, Any]:
    etype, code = _OPENAI.get(exc.kind, ("api_error", None))
    return {"error": {"message": exc.message, "type": etype, "param": exc.param,
                      "code": exc.code or code}}


def anthropic_error(exc: GatewayError) -> dict[str, Any]:
    return {"type": "error",
            "error": {"type": _ANTHROPIC.get(exc.kind, "api_error"), "message": exc.message}}


def google_error(exc: GatewayError) -> dict[str, Any]:
    error: dict[str, Any] = {"code": error_status(exc, "gemini"), "message": exc.message,
                             "status": _GOOGLE.get(exc.kind, "INTERNAL")}
    if exc.param:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                             "fieldViolations": [{"field": exc.param,
                                                  "description": exc.message}]}]
    return {"error": error}


def error_body(exc: GatewayError, dialect: str) -> dict[str, Any]:
    if dialect == "anthropic":
        return anthropic_error(exc)
    return google_error(exc) if dialect == "gemini" else openai_error(exc)


def error_headers(exc: GatewayError) -> dict[str, str]:
    extra = getattr(exc, "headers", None)  # rate limits: Retry-After and the limit headers
    if extra:
        return dict(extra)
    if exc.retry_after is not None:
        return {"retry-after": str(max(1, round(exc.retry_after)))}
    return {}


def openai_error_frame(exc: GatewayError) -> bytes:
    """The SSE frame an OpenAI-dialect stream carries when it fails after the first byte."""
    return b"data: " + orjson.dumps(openai_error(exc)) + b"\n\n"


def anthropic_error_frame(exc: GatewayError) -> bytes:
    return b"event: error\ndata: " + orjson.dumps(anthropic_error(exc)) + b"\n\n"


def google_error_frame(exc: GatewayError) -> bytes:
    """A Gemini SSE stream's failure: one ``data:`` frame holding the error
    envelope, which the google-genai SDK raises as an ``APIError``."""
    return b"data: " + orjson.dumps(google_error(exc)) + b"\n\n"
