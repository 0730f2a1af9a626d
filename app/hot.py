"""The hot inference routes as plain ASGI callables.

Every inference request (``POST /v1/chat/completions``, ``/v1/messages``, …)
is dispatched by :class:`~app.middleware.GatewayMiddleware`, once it has
admitted the request, straight to its :class:`HotRoute` by a dict lookup on
``(method, path)``: no Starlette router, exception middlewares or
``Request`` object on the way. Everything else (operator and model-listing
routes, 404s and 405s) stays on Starlette.

A hot handler is ``handler(gw, request, record) -> response``: ``request``
is an :class:`Incoming` (``receive`` and the headers, nothing more) and the
response any ASGI callable. An exception a handler does not turn into an
answer is a 500 in the caller's dialect (as Starlette's server-error
middleware answers it for the other routes), then re-raised so the server
logs its traceback.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping

import structlog
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect

from pool.errors import InternalError

from .http import error_response
from .record import RequestRecord

__all__ = ["Incoming", "HotRoute", "Handler", "hot_table", "GatewayApp", "unhandled", "raw_headers"]

log = structlog.get_logger("poolgate")

Handler = Callable[[Any, "Incoming", RequestRecord], Awaitable[Any]]


def raw_headers(scope: dict[str, Any]) -> dict[bytes, bytes]:
    """The request's headers as a dict of lower-case byte names; reversed: a
    repeated header's first value is the one kept, as Starlette's
    ``Headers.get`` gives it."""
    return dict(reversed(scope["headers"]))


class Incoming:
    """What a hot route reads of its request: ``receive``, and ``headers`` as
    a plain dict of lower-case names (the first value of a repeated header),
    decoded on first use from ``raw`` (:func:`raw_headers`, when the caller
    has it already)."""

    __slots__ = ("scope", "receive", "_raw", "_headers")

    def __init__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                 raw: dict[bytes, bytes] | None = None) -> None:
        self.scope = scope
        self.receive = receive
        self._raw = raw
        self._headers: dict[str, str] | None = None

    @property
    def headers(self) -> dict[str, str]:
        headers = self._headers
        if headers is None:
            raw = self._raw if self._raw is not None else raw_headers(self.scope)
            headers = self._headers = {name.decode("latin-1"): value.decode("latin-1")
                                       for name, value in raw.items()}
        return headers


class HotRoute:
    """One hot route: ``handler`` with the gateway, as an ASGI app (also
    mounted on the Starlette router, so other methods on its path get the
    router's 405)."""

    __slots__ = ("gateway", "handler", "method", "path")

    def __init__(self, gateway: Any, method: str, path: str, handler: Handler) -> None:
        self.gateway = gateway
        self.method = method
        self.path = path
        self.handler = handler

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # GatewayMiddleware does the same in its own frame (one frame fewer per stream)
        record: RequestRecord = scope["state"]["record"]
        try:
            response = await self.handler(self.gateway, Incoming(scope, receive), record)
            await response(scope, receive, send)
        except Exception as exc:
            await self.failed(exc, record, scope, receive, send)
            raise

    @staticmethod
    async def failed(exc: Exception, record: RequestRecord, scope: dict[str, Any],
                     receive: Any, send: Any) -> None:
        """A failure no handler turned into an answer: the 500, if nothing was sent
        yet (the caller re-raises ``exc``, so the server logs its traceback)."""
        if record.status == 0:  # nothing sent yet: the client still gets an answer
            await unhandled(exc, record.error_dialect())(scope, receive, send)


def unhandled(exc: Exception, dialect: str) -> Any:
    """The 500 for an exception no route turned into an answer; its traceback
    goes to the log (by the server), never to the client. A client gone
    mid-upload is no error of ours (the middleware counts it as a 499)."""
    if not isinstance(exc, ClientDisconnect):
        log.error("gateway.unhandled_error", error_type=type(exc).__name__)
    return error_response(InternalError("The gateway failed to handle this request."), dialect)


def hot_table(routes: list[HotRoute]) -> Mapping[tuple[str, str], HotRoute]:
    """The dispatch table of :class:`~app.middleware.GatewayMiddleware`."""
    return {(r.method, r.path): r for r in routes}


class GatewayApp(Starlette):
    """Starlette with ``front`` (the gateway middleware) outermost, ahead of
    Starlette's server-error middleware: hot routes skip it (they answer their
    own 500s), and a 500 of the other routes carries the request id and is
    counted with its status too."""

    def __init__(self, *, front: Callable[[Any], Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._front = front

    def build_middleware_stack(self) -> Any:
        return self._front(super().build_middleware_stack())
