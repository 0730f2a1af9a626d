"""Operators' endpoints for teams: ``GET /internal/usage`` (the ledger) and
the API keys (``GET``/``POST /internal/keys``, ``PATCH``/``DELETE
/internal/keys/{name}``). Admin token required; errors in the same
envelope as the other ``/internal/*`` endpoints."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from auth.keys import ANONYMOUS, digest
from pool.errors import BadRequest, Conflict, GatewayError, NotFound
from sessions.database import DatabaseUnavailable
from sessions.keystore import KeyExists
from sessions.ledger import GROUPS
from sessions.redis_link import StoreUnavailable

from ..gateway import Gateway
from ..http import error_response, json_response, read_json
from ..budgets import day_start
from ..key_sync import adopt_policies, apply_policy, forget_key
from ..teams import policy_as_mapping, policy_from_mapping
from .ops import admin_denied

__all__ = ["usage", "list_keys", "create_key", "update_key", "delete_key"]

log = structlog.get_logger("poolgate.admin")

SECRET_PREFIX = "sk-pg-"
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_MAX_BODY = 64 * 1024


class _Budget(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    day: int | None = Field(None, gt=0)
    month: int | None = Field(None, gt=0)


class _Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    models: list[str] | None = None
    max_in_flight: int | None = Field(None, gt=0)
    rpm: int | None = Field(None, gt=0)
    tpm: int | None = Field(None, gt=0)
    budget_tokens: _Budget | None = None


class _NewKey(_Policy):
    name: str = Field(pattern=_NAME_PATTERN)


async def _body(request: Request, model: type[_Policy]) -> tuple[_Policy, dict[str, Any]]:
    """The validated body and the fields it set; BadRequest naming the first bad one."""
    raw = await read_json(request, _MAX_BODY)
    if not isinstance(raw, dict):
        raise BadRequest("The body must be a JSON object.")
    try:
        parsed = model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise BadRequest(f"{param}: {err['msg']}." if param else err["msg"], param=param) from None
    if parsed.models is not None and any(not m for m in parsed.models):
        raise BadRequest("models: patterns must not be empty.", param="models")
    return parsed, parsed.model_dump(include=parsed.model_fields_set, exclude={"name"})


def _entry(gw: Gateway, name: str, today: dict[str, tuple[int, int, int]]) -> dict[str, Any]:
    policy = gw.teams.policies.get(name)
    fields = (policy_as_mapping(policy) if policy is not None else
              {"models": None, "max_in_flight": None, "rpm": None, "tpm": None,
               "budget_tokens": None})
    key_id = gw.keyring.id_of(name)
    requests, tokens_in, tokens_out = today.get(key_id, (0, 0, 0))
    return {"name": name, "id": key_id, "source": "config" if name in gw.config_keys else "runtime", **fields,
            "usage_today": {"requests": requests, "input_tokens": tokens_in,
                            "output_tokens": tokens_out}}


async def _today(gw: Gateway) -> dict[str, tuple[int, int, int]]:
    """key id -> today's (requests, input, output tokens)."""
    assert gw.ledger is not None
    return await asyncio.to_thread(gw.ledger.tokens_by_key, day_start(time.time()))


def _database_down(exc: DatabaseUnavailable) -> Response:
    log.warning("admin.database_unavailable", error=str(exc))
    return error_response(StoreUnavailable(
        "The gateway's database is not reachable; retry shortly."), "openai")


async def list_keys(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    denied = admin_denied(gw, request)
    if denied is not None:
        return denied
    try:
        today = await _today(gw)
    except DatabaseUnavailable as exc:
        return _database_down(exc)
    config = [n for n in gw.keyring.names if n in gw.config_keys]
    runtime = sorted(n for n in gw.keyring.names if n not in gw.config_keys)
    return json_response({"keys": [_entry(gw, n, today) for n in (*config, *runtime)]})


async def create_key(request: Request) -> Response:
    """A new key; the only answer that ever shows its secret."""
    gw: Gateway = request.app.state.gateway
    denied = admin_denied(gw, request)
    if denied is not None:
        return denied
    try:
        body, fields = await _body(request, _NewKey)
        name = body.name  # type: ignore[attr-defined]
        if name == ANONYMOUS:
            raise BadRequest(f"name: '{ANONYMOUS}' is reserved (requests without a key).",
                             param="name")
        if name in gw.config_keys or name in gw.keyring.names:
            raise Conflict(f"A key named '{name}' already exists.", param="name",
                           code="key_exists")
        secret = _new_secret(gw)
        assert gw.keystore is not None
        try:
            stored = await asyncio.to_thread(gw.keystore.create, name, digest(secret), fields)
        except KeyExists:
            raise Conflict(f"A key named '{name}' already exists.", param="name",
                           code="key_exists") from None
    except GatewayError as exc:
        return error_response(exc, "openai")
    except DatabaseUnavailable as exc:
        return _database_down(exc)
    gw.keyring.add(name, digest(secret), stored.id)
    gw.keyring.require()  # deleting every key later must not open the gateway
    apply_policy(gw, policy_from_mapping(name, fields))
    log.info("admin.key_created", name=name, id=stored.id)
    return json_response({**_entry(gw, name, {}), "secret": secret}, status=201)


def _new_secret(gw: Gateway) -> str:
    """A secret no key holds. The gateway draws it (a client never chooses one), so a
    clash can only be a CSPRNG collision: a new secret is drawn, silently. Answering
    409 instead would tell the caller that some other key has that secret."""
    for _ in range(3):
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        if not gw.keyring.knows_secret(digest(secret)):
            return secret
    raise GatewayError("Could not draw a fresh key secret; try again.")


def _runtime_key(gw: Gateway, request: Request) -> Response | None:
    """The refusal for a change to ``{name}``: admin token, a run-time key that exists."""
    denied = admin_denied(gw, request)
    if denied is not None:
        return denied
    name = request.path_params["name"]
    if name in gw.config_keys:
        return error_response(Conflict(
            f"The key '{name}' comes from the configuration and is read-only here.",
            param="name", code="key_read_only"), "openai")
    if name not in gw.keyring.names:
        return error_response(NotFound(f"No key named '{name}'.", param="name",
                                       code="key_not_found"), "openai")
    return None


async def update_key(request: Request) -> Response:
    """Change a run-time key's policy: the fields the body sets, others kept."""
    gw: Gateway = request.app.state.gateway
    refused = _runtime_key(gw, request)
    if refused is not None:
        return refused
    name = request.path_params["name"]
    try:
        _, fields = await _body(request, _Policy)
    except GatewayError as exc:
        return error_response(exc, "openai")
    current = gw.teams.policies.get(name)
    merged = {**(policy_as_mapping(current) if current is not None else {}), **fields}
    assert gw.keystore is not None
    try:
        await asyncio.to_thread(gw.keystore.update, name, merged)
        await adopt_policies(gw, [policy_from_mapping(name, merged)])  # a new budget: seeded
        today = await _today(gw)
    except DatabaseUnavailable as exc:
        return _database_down(exc)
    log.info("admin.key_updated", name=name, fields=sorted(fields))
    return json_response(_entry(gw, name, today))


async def delete_key(request: Request) -> Response:
    """Revoke a run-time key: its next request is refused here, and on every
    replica once it polled the database; its stored responses are deleted."""
    gw: Gateway = request.app.state.gateway
    refused = _runtime_key(gw, request)
    if refused is not None:
        return refused
    name = request.path_params["name"]
    assert gw.keystore is not None
    try:
        # the database first: a replica that polls meanwhile must not bring it back
        key_id = await asyncio.to_thread(gw.keystore.delete, name)
    except DatabaseUnavailable as exc:
        return _database_down(exc)
    await forget_key(gw, name, key_id or gw.keyring.id_of(name))
    log.info("admin.key_deleted", name=name, id=key_id)
    return json_response({"name": name, "deleted": True})


def _time_param(request: Request, name: str) -> float | int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"{name} must be Unix seconds, not '{raw}'.", param=name) from None
    return int(value) if value.is_integer() else value


async def usage(request: Request) -> Response:
    """``GET /internal/usage?key=&model=&since=&until=&group_by=key,model,day``."""
    gw: Gateway = request.app.state.gateway
    denied = admin_denied(gw, request)
    if denied is not None:
        return denied
    query = request.query_params
    try:
        since, until = _time_param(request, "since"), _time_param(request, "until")
        raw_groups = query.get("group_by")
        groups = [g.strip() for g in raw_groups.split(",") if g.strip()] if raw_groups else list(GROUPS)
        unknown = [g for g in groups if g not in GROUPS]
        if unknown:
            raise BadRequest(f"group_by: unknown field '{unknown[0]}' (key, model, day).",
                             param="group_by")
    except GatewayError as exc:
        return error_response(exc, "openai")
    group_by = [g for g in GROUPS if g in groups]
    assert gw.ledger is not None
    try:
        rows = await asyncio.to_thread(gw.ledger.usage, key=query.get("key") or None,
                                       model=query.get("model") or None, since=since,
                                       until=until, group_by=group_by)
    except DatabaseUnavailable as exc:
        return _database_down(exc)
    return json_response({"since": since, "until": until, "group_by": group_by, "rows": rows})
