"""One pure-ASGI middleware for every request: request id, client auth, body
limit, and the access record (one log line and the request metrics).

Pure ASGI rather than ``BaseHTTPMiddleware`` because it sits on every request
of the hot path and must not buffer streamed responses. It is the outermost
layer of the app, and hands an admitted inference request straight to its
plain-ASGI route (:mod:`app.hot`); everything else goes on to Starlette.
A client that leaves before its request was read (``ClientDisconnect``, from
any route) is recorded as a 499 ``client_disconnected``: no 500, no traceback.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Mapping

import orjson
import structlog
from starlette.requests import ClientDisconnect

from auth.keys import KeyRing, TokenGate, extract_key_from_raw, extract_key_from_scope
from pool.errors import AuthenticationFailed, GatewayError, NotFound, PayloadTooLarge

from .access import ADMIN, CLIENT, METRICS, PUBLIC, required_credential, route_path
from .errors import error_body, error_status
from .gemini_paths import google_key, method_route, wants_gemini
from .hot import Incoming, raw_headers
from .http import random_hex
from .observability import current_request
from .record import RequestRecord

__all__ = ["GatewayMiddleware"]

log = structlog.get_logger("poolgate.access")
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
_CLOSED = TokenGate(None)


class _SendWithId:
    """``send`` that notes the response's status in the record and adds the
    request id header (an object, not a closure: less to hold per open stream)."""

    __slots__ = ("send", "record")

    def __init__(self, send: Any, record: RequestRecord) -> None:
        self.send = send
        self.record = record

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            record = self.record
            record.status = message["status"]
            message["headers"] = [*message.get("headers", ()),
                                  (b"x-request-id", record.request_id.encode("latin-1"))]
        await self.send(message)


class GatewayMiddleware:
    def __init__(self, app: Any, *, keys: KeyRing, max_body_bytes: int,
                 on_finish: Callable[[RequestRecord], None], admin: TokenGate = _CLOSED,
                 metrics: TokenGate = _CLOSED, metrics_public: bool = False,
                 hot: Mapping[tuple[str, str], Any] | None = None) -> None:
        self.app = app
        self.hot = hot or {}  # (method, path) -> plain ASGI app (app.hot), past the router
        self.keys = keys
        self.admin = admin
        self.metrics = metrics
        self.metrics_public = metrics_public
        self.max_body_bytes = max_body_bytes
        self.on_finish = on_finish

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        raw = raw_headers(scope)  # one dict for the id, the limit, the key and the route
        given = raw.get(b"x-request-id")
        request_id = given.decode("latin-1") if given is not None else None
        if request_id is None or not _SAFE_ID.match(request_id):
            request_id = random_hex(32)  # the OS's CSPRNG: one id never tells the next
        path = route_path(scope)
        record = RequestRecord(request_id, scope["method"], path, started)
        record.anthropic_version = b"anthropic-version" in raw
        if wants_gemini(path, raw):
            record.dialect = "gemini"  # its refusals below are in Google's shape
        scope.setdefault("state", {})["record"] = record
        current_request.set(record)  # its id and key go into every line logged meanwhile
        send_with_id = _SendWithId(send, record)

        try:
            error = self._admit(scope, path, record, raw)
            route = self.hot.get((scope["method"], path))
            if route is None and ":" in path:  # a Gemini method: the model is in the path
                wild = method_route(path)
                route = self.hot.get((scope["method"], wild)) if wild is not None else None
            if error is not None:
                await self._reject(error, record, send_with_id)
            elif route is None:
                await self.app(scope, receive, send_with_id)
            else:
                # the route's answer is awaited in this frame, not in one of the
                # route's: a coroutine frame fewer for as long as a stream is open
                try:
                    response = await route.handler(route.gateway, Incoming(scope, receive, raw),
                                                   record)
                    del raw  # read: not held by this frame for as long as a stream is open
                    await response(scope, receive, send_with_id)
                except ClientDisconnect:
                    raise  # no answer to give, nothing of ours failed: see below
                except Exception as exc:
                    await route.failed(exc, record, scope, receive, send_with_id)
                    raise
        except ClientDisconnect:
            # the client left before its request was read (mid-upload): a
            # client disconnect (499 in the log and the metrics), not a 500
            # with a traceback; there is nobody to answer
            record.status = 499
            record.error = "client_disconnected"
            record.disconnected = True
        finally:
            record.duration = time.perf_counter() - started
            self.on_finish(record)

    def _admit(self, scope: dict[str, Any], path: str, record: RequestRecord,
               raw: dict[bytes, bytes]) -> GatewayError | None:
        needed = required_credential(scope["method"], path)
        if needed == PUBLIC:
            return None
        if needed == ADMIN:
            if self.admin.closed:  # closed, not merely unauthorised: say nothing more
                return NotFound("Admin endpoints are disabled: no admin token is set.")
            if not self.admin.check(extract_key_from_scope(scope)):
                return AuthenticationFailed(
                    "Admin endpoints need the admin token as 'Authorization: Bearer <token>'.")
        elif needed == METRICS:
            if not self.metrics_public and not self.metrics.check(extract_key_from_scope(scope)):
                return AuthenticationFailed(
                    "/metrics needs the metrics token as 'Authorization: Bearer <token>'.")
        elif needed == CLIENT and self.keys.enabled:
            gemini = record.dialect == "gemini"
            presented = extract_key_from_raw(raw)
            if gemini and presented is None:
                presented = google_key(raw, scope)
            name = self.keys.identify(presented)
            if name is None:
                return AuthenticationFailed(
                    "Invalid or missing API key. Send it as 'x-goog-api-key: <key>', "
                    "'?key=<key>' or 'Authorization: Bearer <key>'." if gemini else
                    "Invalid or missing API key. Send it as 'Authorization: Bearer <key>' "
                    "or 'x-api-key: <key>'.")
            record.key = name
            record.key_id = self.keys.id_of(name)
        content_length = raw.get(b"content-length")
        if content_length is not None:
            try:
                too_big = int(content_length) > self.max_body_bytes
            except ValueError:
                too_big = False
            if too_big:
                return PayloadTooLarge(
                    f"The request body is larger than the limit of {self.max_body_bytes} bytes.")
        return None

    async def _reject(self, error: GatewayError, record: RequestRecord, send: Any) -> None:
        dialect = record.error_dialect()
        body = orjson.dumps(error_body(error, dialect))
        record.error = error.kind
        await send({"type": "http.response.start", "status": error_status(error, dialect),
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
