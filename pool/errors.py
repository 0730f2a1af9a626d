"""One small error hierarchy for the whole gateway.

Each error carries a dialect-neutral ``kind``, an HTTP ``status``, a message
safe to show a client (never a secret, never a traceback) and, for bad input,
the ``param`` it concerns. ``app/errors.py`` maps them once per dialect to the
wire envelope.
"""

from __future__ import annotations

__all__ = [
    "GatewayError", "BadRequest", "AuthenticationFailed", "PermissionDenied", "NotFound",
    "PayloadTooLarge", "Overloaded", "UpstreamError", "UpstreamUnavailable", "UpstreamTimeout",
    "InternalError", "WorkerCrashed", "EngineUnavailable", "EngineFailed",
    "UpstreamCredentialsRefused",
]


class GatewayError(Exception):
    status: int = 500
    kind: str = "internal"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after
        if status is not None:
            self.status = status


class BadRequest(GatewayError):
    """The request is malformed or asks for something the target cannot honour."""

    status = 400
    kind = "invalid_request"


class AuthenticationFailed(GatewayError):
    status = 401
    kind = "authentication"


class PermissionDenied(GatewayError):
    status = 403
    kind = "permission"


class NotFound(GatewayError):
    status = 404
    kind = "not_found"


class PayloadTooLarge(GatewayError):
    status = 413
    kind = "request_too_large"


class Overloaded(GatewayError):
    """No capacity now: OpenAI 429 ``rate_limit_exceeded``, Anthropic 529 ``overloaded_error``.

    ``status`` 429 means "rate limited" (a client or key over its share) and is
    429 in both dialects; any other status means "overloaded" (529 for Anthropic).
    """

    status = 503
    kind = "overloaded"


class UpstreamError(GatewayError):
    """The upstream refused the request with a 4xx; ``status`` is its status,
    ``kind`` the matching neutral kind, so the client sees it in its own dialect."""

    kind = "invalid_request"

    def __init__(self, message: str, *, status: int, kind: str | None = None,
                 param: str | None = None, code: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message, param=param, code=code, status=status, retry_after=retry_after)
        if kind is not None:
            self.kind = kind


class UpstreamUnavailable(GatewayError):
    """The upstream failed (5xx), could not be reached, or died mid-answer."""

    status = 502
    kind = "upstream"


class UpstreamCredentialsRefused(UpstreamUnavailable):
    """The upstream refused the gateway's own credentials (HTTP 401/403, or an
    in-stream authentication/permission error). That is the operator's fault,
    not the client's: a 502, retried on another worker, never a 401 the client
    would take for its own key being wrong. The upstream's text is not kept (it
    often quotes the key, partly masked)."""

    def __init__(self, upstream_status: int) -> None:
        super().__init__("upstream credentials refused")
        self.upstream_status = upstream_status


class WorkerCrashed(UpstreamUnavailable):
    """A worker process of ours died (or was killed as hung) with this request
    in flight. ``before_first_event``: nothing had reached the client yet, so
    the pool may retry the request elsewhere."""

    def __init__(self, message: str, *, before_first_event: bool) -> None:
        super().__init__(message)
        self.before_first_event = before_first_event


class NoUsableWorker(UpstreamUnavailable):
    """Every worker of a model is out for a lasting reason a client can read (its
    account logged out, its credentials refused): a 503 naming why, not the
    transient 429/529 of a busy or restarting pool."""

    status = 503


class EngineUnavailable(UpstreamUnavailable):
    """A local worker's engine cannot serve now (model not loaded, its server
    gone or not answering): the worker's fault, so retried elsewhere."""

    status = 503


class EngineFailed(UpstreamUnavailable):
    """A local worker's engine failed while generating."""

    status = 500


class UpstreamTimeout(GatewayError):
    status = 504
    kind = "timeout"


class InternalError(GatewayError):
    status = 500
    kind = "internal"


def kind_for_status(status: int) -> str:
    """The neutral kind for an HTTP status an upstream answered with."""
    return _KIND_BY_STATUS.get(status, "invalid_request" if 400 <= status < 500 else "upstream")


_KIND_BY_STATUS = {
    400: "invalid_request",
    401: "authentication",
    403: "permission",
    404: "not_found",
    413: "request_too_large",
    422: "invalid_request",
    429: "rate_limit",
    500: "upstream",
    502: "upstream",
    503: "overloaded",
    504: "timeout",
    529: "overloaded",
}
