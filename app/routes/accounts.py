"""Operators' endpoints for cli accounts (admin token; the ``/internal/*`` error envelope).

- ``GET /internal/accounts``: every cli account of this replica, its state and
  its quota (docs/accounts.md#quota)

- ``GET /internal/workers/{name}/bundle``: the session bundle, ``application/gzip``
- ``PUT /internal/workers/{name}/bundle``: import one (raw tar.gz, or JSON ``{"bundle_b64"}``)
- ``POST /internal/workers/{name}/login`` (``{"auto": true|false}``),
  ``GET /internal/workers/{name}/login``, ``GET …/login/screenshot``,
  ``POST /internal/workers/{name}/login/code`` (``{"code": "…"}``),
  ``DELETE /internal/workers/{name}/login`` (cancel the login under way)
- the seed gateway's paths: ``POST /internal/auto-login/start?instance=NAME``,
  ``GET /internal/auto-login/status``, ``POST /internal/session/export?instance=NAME``
"""

from __future__ import annotations

import base64
import time
from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from pool.errors import BadRequest, GatewayError, NotFound, PayloadTooLarge
from sessions.bundles import MAX_BYTES

from ..accounts import decode_b64
from ..gateway import Gateway
from ..http import error_response, json_response, read_json
from ..quota_view import account_entry
from .ops import admin_denied

__all__ = ["list_accounts", "get_bundle", "put_bundle", "session_export", "start_login", "cancel_login",
           "login_status",
           "login_code", "login_screenshot", "auto_login_start", "auto_login_status"]

_MAX_JSON = 64 * 1024
Handler = Callable[[Request, Gateway], Awaitable[Response]]


def admin(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Admin token first; GatewayErrors become the /internal/* envelope."""
    async def endpoint(request: Request) -> Response:
        gw: Gateway = request.app.state.gateway
        denied = admin_denied(gw, request)
        if denied is not None:
            return denied
        try:
            return await handler(request, gw)
        except GatewayError as exc:
            return error_response(exc, "openai")
    endpoint.__name__ = handler.__name__
    endpoint.__doc__ = handler.__doc__
    return endpoint


def _worker(gw: Gateway, name: str | None, param: str = "name") -> Any:
    if not name:
        raise BadRequest(f"Name the worker ({param}).", param=param)
    return gw.pool.worker(name)


async def _raw_body(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"A bundle is at most {limit} bytes.", param="bundle")
        chunks.append(chunk)
    return b"".join(chunks)


@admin
async def list_accounts(request: Request, gw: Gateway) -> Response:
    """One entry per cli worker of this replica (each replica runs its own CLI
    processes, as ``/internal/workers`` lists its own workers)."""
    now = time.time()
    return json_response({"accounts": [account_entry(w, now) for w in gw.pool.workers
                                       if w.kind == "cli"],
                          "time": now})


# --- bundles ------------------------------------------------------------------------------

@admin
async def get_bundle(request: Request, gw: Gateway) -> Response:
    worker = _worker(gw, request.path_params["name"])
    data = await gw.accounts.account(worker.name).export_bundle()
    return Response(data, media_type="application/gzip", headers={
        "content-disposition": f'attachment; filename="{worker.name}.bundle.tar.gz"'})


@admin
async def put_bundle(request: Request, gw: Gateway) -> Response:
    worker = _worker(gw, request.path_params["name"])
    if request.headers.get("content-type", "").startswith("application/json"):
        body = await read_json(request, 2 * MAX_BYTES)
        if not isinstance(body, dict) or not isinstance(body.get("bundle_b64"), str):
            raise BadRequest("The JSON body needs bundle_b64 (a string).", param="bundle_b64")
        data = decode_b64(body["bundle_b64"], "bundle_b64")
    else:
        data = await _raw_body(request, MAX_BYTES)
    if not data:
        raise BadRequest("The body is empty: send the bundle (tar.gz).", param="bundle")
    manifest = await gw.accounts.account(worker.name).import_bundle(data)
    return json_response({"worker": worker.name, "imported": manifest.summary()})


@admin
async def session_export(request: Request, gw: Gateway) -> Response:
    """The seed's export: JSON with ``bundle_b64``."""
    worker = _worker(gw, request.query_params.get("instance"), "instance")
    data = await gw.accounts.account(worker.name).export_bundle()
    return json_response({"instance": worker.name, "bundle_b64": base64.b64encode(data).decode(),
                          "bytes": len(data)})


# --- logins ----------------------------------------------------------------------------

async def _login_body(request: Request) -> dict[str, Any]:
    if not await _has_body(request):
        return {}
    body = await read_json(request, _MAX_JSON)
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.")
    return body


async def _has_body(request: Request) -> bool:
    return request.headers.get("content-length", "0") != "0" or \
        "chunked" in request.headers.get("transfer-encoding", "")


def _auto_flag(body: dict[str, Any]) -> bool | None:
    auto = body.get("auto")
    if auto is not None and not isinstance(auto, bool):
        raise BadRequest("auto must be true or false.", param="auto")
    return auto


@admin
async def start_login(request: Request, gw: Gateway) -> Response:
    worker = _worker(gw, request.path_params["name"])
    auto = _auto_flag(await _login_body(request))
    status = await gw.accounts.account(worker.name).login(auto)
    return json_response(status, status=202)


@admin
async def cancel_login(request: Request, gw: Gateway) -> Response:
    """End the login under way: its CLI process and every lock it held go with it."""
    worker = _worker(gw, request.path_params["name"])
    await gw.accounts.account(worker.name).cancel_login()
    return json_response(gw.logins.status(worker.name))


@admin
async def login_status(request: Request, gw: Gateway) -> Response:
    worker = _worker(gw, request.path_params["name"])
    return json_response(gw.logins.status(worker.name))


@admin
async def login_code(request: Request, gw: Gateway) -> Response:
    worker = _worker(gw, request.path_params["name"])
    body = await _login_body(request)
    code = body.get("code")
    if not isinstance(code, str) or not code.strip():
        raise BadRequest("code must be the code (or redirect URL) the login page showed.",
                         param="code")
    return json_response(await gw.accounts.account(worker.name).login_code(code.strip()))


@admin
async def login_screenshot(request: Request, gw: Gateway) -> Response:
    worker = _worker(gw, request.path_params["name"])
    png = gw.logins.screenshot(worker.name)
    if png is None:
        raise NotFound(f"No screenshot of a failed login of worker '{worker.name}'.")
    return Response(png, media_type="image/png")


@admin
async def auto_login_start(request: Request, gw: Gateway) -> Response:
    """The seed's start: an automatic login of ``?instance=NAME``."""
    worker = _worker(gw, request.query_params.get("instance"), "instance")
    return json_response(await gw.accounts.account(worker.name).login(True), status=202)


@admin
async def auto_login_status(request: Request, gw: Gateway) -> Response:
    """The seed's status: every cli account's login."""
    return json_response({"instances": {name: gw.logins.status(name)
                                        for name in gw.accounts.configs}})
