"""Operations: liveness, readiness, metrics, and the admin endpoints."""

from __future__ import annotations

import time
from typing import Any

import structlog

from starlette.requests import Request
from starlette.responses import Response

from auth.keys import extract_key
from pool.errors import AuthenticationFailed, Conflict, GatewayError, NotFound
from pool.worker import WorkerState

from ..gateway import Gateway
from ..http import error_response, json_response
from ..quota_view import account_quota, quota_block

__all__ = ["root", "healthz", "readyz", "metrics", "internal_workers", "worker_action", "worker_info",
           "worker_engine", "internal_stats", "admin_denied"]

log = structlog.get_logger("poolgate.admin")


async def root(request: Request) -> Response:
    # Claude Code sends HEAD / before its first request and wants a 200.
    return json_response({"name": "poolgate", "status": "ok"})


async def healthz(request: Request) -> Response:
    """Alive, with the pool at a glance (the seed gateway's summary); O(workers), no I/O."""
    gw: Gateway = request.app.state.gateway
    workers = gw.pool.workers
    ready = sum(1 for w in workers if w.state is WorkerState.READY)
    return json_response({"status": "ok", "workers": {"ready": ready, "total": len(workers)},
                          "in_flight": sum(gw.pool.in_flight.values())})


async def readyz(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    models = gw.pool.ready_models()
    missing = sorted(m for m, ok in models.items() if not ok)
    ready = bool(models) and not missing
    # A lost Redis does not make a replica unready: it still serves (routing by
    # hash, limits counted locally) and every replica loses Redis together, so
    # failing readiness would take the whole gateway out for a partial loss.
    return json_response({"status": "ready" if ready else "not_ready", "models": models,
                          "missing": missing, "redis": gw.redis_state()},
                         status=200 if ready else 503)


async def metrics(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    if not gw.metrics_public:
        if gw.metrics_gate.closed or not gw.metrics_gate.check(extract_key(request.headers)):
            return error_response(AuthenticationFailed(
                "/metrics needs the metrics token as 'Authorization: Bearer <token>'."), "openai")
    body, content_type = gw.metrics.render()
    return Response(body, media_type=content_type)


def admin_denied(gw: Gateway, request: Request) -> Response | None:
    if gw.admin.closed:
        # Closed, not merely unauthorised: say nothing about what is behind it.
        return error_response(NotFound("Admin endpoints are disabled: no admin token is set."),
                              "openai")
    if not gw.admin.check(extract_key(request.headers)):
        return error_response(AuthenticationFailed(
            "Admin endpoints need the admin token as 'Authorization: Bearer <token>'."), "openai")
    return None


def worker_info(gw: Gateway, w: Any, now: float) -> dict[str, Any]:
    """One worker as ``GET /internal/workers`` lists it."""
    uptime = getattr(w, "uptime", None)
    started = getattr(w, "started_at", None)
    if uptime is None and started:
        uptime = now - started
    last_exit = getattr(w, "last_exit", None)
    if hasattr(last_exit, "as_dict"):
        last_exit = last_exit.as_dict()
    runtime = gw.runtime_workers
    return {"name": w.name, "kind": w.kind, "state": w.state.value,
            "source": runtime.source(w.name) if runtime is not None else "config",
            "pid": getattr(w, "pid", None),
            "uptime": round(uptime, 3) if uptime is not None else None,
            "restarts": getattr(w, "restarts", 0),
            "last_exit": last_exit,
            "crash_looping": getattr(w, "crash_looping", False),
            "in_flight": gw.in_flight(w.name), "capacity": getattr(w, "capacity", None),
            "models": list(w.models), "aliases": dict(w.aliases),
            "probe_seconds": gw.pool.probe_seconds.get(w.name),
            **_engine_info(w), **_cli_info(w, now)}


_CLI_FIELDS = ("cli", "version", "account", "login", "conversations", "held_tool_calls",
               "cooldown_until", "mode", "sandbox", "account_state")


def _cli_info(w: Any, now: float) -> dict[str, Any]:
    """A cli worker's account: CLI, version, account, login state, conversations,
    cooldown, and its quota (as ``GET /internal/accounts`` shows it)."""
    quota = account_quota(w)
    if quota is None:  # not a cli worker
        return {}
    info = w.info()
    return {**{name: info.get(name) for name in _CLI_FIELDS}, "quota": quota_block(quota, now)}


def _engine_info(w: Any) -> dict[str, Any]:
    """A local worker's engine, model file and parallel sequences."""
    local = getattr(w, "local", None)
    if local is None:
        return {}
    return {"engine": local.engine, "model": local.model, "engine_capacity": local.capacity}


async def internal_workers(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    denied = admin_denied(gw, request)
    if denied is not None:
        return denied
    now = time.time()
    return json_response({"workers": [worker_info(gw, w, now) for w in gw.pool.workers],
                          "time": now})


async def worker_action(request: Request) -> Response:
    """``POST /internal/workers/{name}/drain`` (no new requests, in-flight ones
    finish), ``/resume`` (take requests again) and ``/restart``."""
    gw: Gateway = request.app.state.gateway
    denied = admin_denied(gw, request)
    if denied is not None:
        return denied
    action = request.path_params["action"]
    try:
        worker = gw.pool.worker(request.path_params["name"])
    except NotFound as exc:
        return error_response(exc, "openai")
    if action == "resume" and gw.runtime_workers is not None and gw.runtime_workers.leaving(
            worker.name):
        return error_response(Conflict(
            f"The worker '{worker.name}' is leaving the pool; it cannot be resumed.",
            param="name", code="worker_leaving"), "openai")
    if action not in ("drain", "resume", "restart", "stop") or (
            action == "stop" and not hasattr(worker, "supervisor")):
        return error_response(NotFound(f"No worker action '{action}' "
                                       "(drain, resume, restart, stop)."), "openai")
    try:
        await _act(gw, worker, action)
    except GatewayError as exc:  # a cli account's state does not allow it: 409
        return error_response(exc, "openai")
    log.info("admin.worker_action", worker=worker.name, action=action)
    return json_response(worker_info(gw, worker, time.time()))


async def _act(gw: Gateway, worker: Any, action: str) -> None:
    """The action, through the account's state machine for a cli worker."""
    account = getattr(worker, "account", None)
    if action in ("drain", "resume"):
        async def publish() -> None:
            await gw.drains.set(gw, worker, action == "drain")  # here, then every replica
        await (getattr(account, action)(publish) if account is not None else publish())
    elif action == "restart":
        await (account.restart() if account is not None else worker.restart())
        gw.admission.refresh()
    elif account is not None:
        await account.stop()
    else:
        # stopped until /restart: what a bundle import needs (its CLI must not run meanwhile)
        await worker.drain(worker.spec.stop_timeout)
        await worker.supervisor.stop()
        worker.resume()


async def worker_engine(request: Request) -> Response:
    """``GET /internal/workers/{name}/engine``: a local worker's engine, as it
    sees itself (engine name, sequences generating now, context length)."""
    gw: Gateway = request.app.state.gateway
    denied = admin_denied(gw, request)
    if denied is not None:
        return denied
    try:
        worker = gw.pool.worker(request.path_params["name"])
        stats = getattr(worker, "engine_stats", None)
        if stats is None:
            raise NotFound(f"Worker '{worker.name}' has no model engine (it is {worker.kind}).")
        return json_response(await stats())
    except GatewayError as exc:
        return error_response(exc, "openai")


async def internal_stats(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    denied = admin_denied(gw, request)
    if denied is not None:
        return denied
    return json_response(gw.stats())
