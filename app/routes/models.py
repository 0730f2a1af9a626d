"""``GET /v1/models`` and ``GET /v1/models/{id}`` in OpenAI's shape, or
Anthropic's when the request carries ``anthropic-version``, or Gemini's when
it carries ``x-goog-api-key`` (the middleware marks the record so)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from pool.pool import ModelEntry

from ..gateway import Gateway
from ..http import error_response, json_response
from . import gemini

__all__ = ["list_models", "get_model"]

# A fixed creation time: the gateway does not know when an upstream model was made.
_CREATED = 1700000000
_CREATED_AT = "2023-11-14T22:13:20Z"


def _openai(entry: ModelEntry) -> dict[str, Any]:
    return {"id": entry.id, "object": "model", "created": _CREATED, "owned_by": entry.owned_by}


def _anthropic(entry: ModelEntry) -> dict[str, Any]:
    return {"type": "model", "id": entry.id, "display_name": entry.id, "created_at": _CREATED_AT}


async def list_models(request: Request) -> Response:
    if request.scope["state"]["record"].dialect == "gemini":
        return await gemini.list_models(request)
    gw: Gateway = request.app.state.gateway
    key = request.scope["state"]["record"].key
    entries = [e for e in gw.pool.models() if gw.teams.sees(key, e.id)]
    if "anthropic-version" in request.headers:
        data = [_anthropic(e) for e in entries]
        return json_response({"data": data, "has_more": False,
                              "first_id": data[0]["id"] if data else None,
                              "last_id": data[-1]["id"] if data else None})
    return json_response({"object": "list", "data": [_openai(e) for e in entries]})


async def get_model(request: Request) -> Response:
    if request.scope["state"]["record"].dialect == "gemini":
        return await gemini.get_model(request)
    gw: Gateway = request.app.state.gateway
    model_id = request.path_params["model_id"]
    anthropic = "anthropic-version" in request.headers
    visible = gw.teams.sees(request.scope["state"]["record"].key, model_id)
    for entry in gw.pool.models():
        if entry.id == model_id and visible:
            return json_response(_anthropic(entry) if anthropic else _openai(entry))
    return error_response(gw.unknown_model(request.scope["state"]["record"].key, model_id),
                          "anthropic" if anthropic else "openai")
