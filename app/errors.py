"""Map :mod:`pool.errors` once per dialect to its wire envelope and status.

OpenAI: ``{"error": {"message", "type", "param", "code"}}``.
Anthropic: ``{"type": "error", "error": {"type", "message"}}``; overload is 529.
"""

from __future__ import annotations

from typing import Any

import orjson

from pool.errors import GatewayError

__all__ = ["openai_error", "anthropic_error", "error_body", "error_status", "error_headers",
           "openai_error_frame", "anthropic_error_frame"]

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


def error_status(exc: GatewayError, dialect: str) -> int:
    if exc.kind == "overloaded":
        return 529 if dialect == "anthropic" else 429
    return exc.status


def openai_error(exc: GatewayError) -> dict[str, Any]:
    etype, code = _OPENAI.get(exc.kind, ("api_error", None))
    return {"error": {"message": exc.message, "type": etype, "param": exc.param,
                      "code": exc.code or code}}


def anthropic_error(exc: GatewayError) -> dict[str, Any]:
    return {"type": "error",
            "error": {"type": _ANTHROPIC.get(exc.kind, "api_error"), "message": exc.message}}


def error_body(exc: GatewayError, dialect: str) -> dict[str, Any]:
    return anthropic_error(exc) if dialect == "anthropic" else openai_error(exc)


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
