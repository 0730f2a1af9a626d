"""Remote workers joining and leaving at run time: ``POST /internal/workers``
registers one, ``DELETE /internal/workers/{name}`` drains it and takes it out
(see :mod:`app.runtime_workers`). Admin token required."""

from __future__ import annotations

import time

import structlog
from starlette.requests import Request
from starlette.responses import Response

from pool.errors import BadRequest, GatewayError

from ..gateway import Gateway
from ..http import error_response, json_response, read_json
from .ops import admin_denied, worker_info

__all__ = ["register_worker", "unregister_worker"]

log = structlog.get_logger("poolgate.admin")

_MAX_BODY = 64 * 1024


async def register_worker(request: Request) -> Response:
    """Register a remote worker: ``{"name", "dialect", "url", "models", "aliases",
    "api_key_env", ...}``; 201 with the worker as ``GET /internal/workers`` shows it."""
    gw: Gateway = request.app.state.gateway
    denied = admin_denied(gw, request)
    if denied is not None:
        return denied
    try:
        body = await read_json(request, _MAX_BODY)
        if not isinstance(body, dict):
            raise BadRequest("The body must be a JSON object.")
        worker = await gw.runtime_workers.register(body)
    except GatewayError as exc:
        return error_response(exc, "openai")
    log.info("admin.worker_registered", worker=worker.name)
    return json_response(worker_info(gw, worker, time.time()), status=201)


async def unregister_worker(request: Request) -> Response:
    """Drain a registered worker and take it out of the pool once its requests
    finish. Waits up to ``?timeout=`` seconds (default: the shutdown timeout):
    200 when it is out, 202 while its requests are still finishing."""
    gw: Gateway = request.app.state.gateway
    denied = admin_denied(gw, request)
    if denied is not None:
        return denied
    name = request.path_params["name"]
    try:
        timeout = _timeout(request, gw.settings.server.shutdown_timeout)
        removed = await gw.runtime_workers.unregister(name, timeout)
    except GatewayError as exc:
        return error_response(exc, "openai")
    log.info("admin.worker_unregistered", worker=name, removed=removed)
    if removed:
        return json_response({"name": name, "removed": True})
    return json_response({"name": name, "removed": False, "state": "draining",
                          "in_flight": gw.in_flight(name)}, status=202)


def _timeout(request: Request, default: float) -> float:
    raw = request.query_params.get("timeout")
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise BadRequest("timeout must be seconds between 0 and 3600.", param="timeout")
    return value
