"""Operations: liveness, readiness, metrics, and the admin endpoints."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from auth.keys import extract_key
from pool.errors import AuthenticationFailed, NotFound

from ..gateway import Gateway
from ..http import error_response, json_response

__all__ = ["root", "healthz", "readyz", "metrics", "internal_workers"]


async def root(request: Request) -> Response:
    # Claude Code sends HEAD / before its first request and wants a 200.
    return json_response({"name": "poolgate", "status": "ok"})


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    models = gw.pool.ready_models()
    missing = sorted(m for m, ok in models.items() if not ok)
    ready = bool(models) and not missing
    return json_response({"status": "ready" if ready else "not_ready", "models": models,
                          "missing": missing}, status=200 if ready else 503)


async def metrics(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    if not gw.metrics_public:
        if gw.metrics_gate.closed or not gw.metrics_gate.check(extract_key(request.headers)):
            return error_response(AuthenticationFailed(
                "/metrics needs the metrics token as 'Authorization: Bearer <token>'."), "openai")
    body, content_type = gw.metrics.render()
    return Response(body, media_type=content_type)


def _admin_denied(gw: Gateway, request: Request) -> Response | None:
    if gw.admin.closed:
        # Closed, not merely unauthorised: say nothing about what is behind it.
        return error_response(NotFound("Admin endpoints are disabled: no admin token is set."),
                              "openai")
    if not gw.admin.check(extract_key(request.headers)):
        return error_response(AuthenticationFailed(
            "Admin endpoints need the admin token as 'Authorization: Bearer <token>'."), "openai")
    return None


async def internal_workers(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    denied = _admin_denied(gw, request)
    if denied is not None:
        return denied
    now = time.time()
    workers = [{"name": w.name, "kind": w.kind, "state": w.state.value,
                "models": list(w.models), "aliases": dict(w.aliases),
                "in_flight": gw.pool.in_flight[w.name]} for w in gw.pool.workers]
    return json_response({"workers": workers, "time": now})
