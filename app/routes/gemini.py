"""The Gemini API routes: ``models/{model}:generateContent``,
``:streamGenerateContent`` (``?alt=sse`` as SSE, else one JSON array written as
it comes), ``:countTokens`` and the model listing, under ``/v1beta/`` and
``/v1/`` (see :mod:`app.gemini_paths`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response

from pool.errors import GatewayError
from pool.pool import ModelEntry

from ..dialects import gemini
from ..gateway import Gateway
from ..gemini_paths import PREFIXES, split_method_path
from ..hot import HotRoute, Incoming
from ..http import error_response, json_response, read_json
from ..record import RequestRecord
from ..streaming import EventStreamResponse
from .inference import count_input, serve

__all__ = ["hot_routes", "list_models", "get_model", "model_json"]

_METHODS = ["generateContent", "streamGenerateContent", "countTokens"]
_JSON = (b"content-type", b"application/json; charset=utf-8")
# what a translated model can tell: the gateway knows no limits of its own
_INPUT_LIMIT = 1_048_576
_OUTPUT_LIMIT = 65_536


def _model(request: Incoming) -> str:
    found = split_method_path(request.scope["path"])
    assert found is not None  # the middleware routed it here by this very path
    return found[1]


def _query(request: Incoming) -> dict[str, str]:
    return dict(parse_qsl((request.scope.get("query_string") or b"").decode("latin-1")))


async def generate_content(gw: Gateway, request: Incoming, record: RequestRecord) -> Any:
    return await _generate(gw, request, record, stream=False)


async def stream_generate_content(gw: Gateway, request: Incoming, record: RequestRecord) -> Any:
    return await _generate(gw, request, record, stream=True)


async def _generate(gw: Gateway, request: Incoming, record: RequestRecord, *,
                    stream: bool) -> Any:
    record.dialect = "gemini"
    try:
        body = await read_json(request, gw.max_body_bytes)
        chat = gemini.decode(body, _model(request), stream=stream)
    except GatewayError as exc:
        record.error = exc.kind
        return error_response(exc, "gemini")
    sse = not stream or _query(request).get("alt") == "sse"
    response = await serve(gw, request, chat, gemini if sse else gemini.ARRAY, record)
    if not sse and isinstance(response, EventStreamResponse):
        return _AsJson(response)
    return response


class _AsJson:
    """A stream written as one JSON array: the event stream's response with
    a JSON content type."""

    __slots__ = ("response",)

    def __init__(self, response: EventStreamResponse) -> None:
        self.response = response

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def send_json(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [_JSON, *(h for h in message["headers"]
                                               if h[0] != b"content-type")]
            await send(message)

        await self.response(scope, receive, send_json)


async def count_tokens(gw: Gateway, request: Incoming, record: RequestRecord) -> Any:
    """``{"totalTokens": n}``: the worker's own count when it has one (an
    Anthropic upstream), else the estimate of :func:`pool.tokens.estimate_tokens`."""
    record.dialect = "gemini"
    try:
        body = await read_json(request, gw.max_body_bytes)
        chat = gemini.decode_count_tokens(body, _model(request))
        how, tokens = await count_input(gw, chat, record, known_only=True)
    except GatewayError as exc:
        record.error = exc.kind
        return error_response(exc, "gemini")
    return json_response({"totalTokens": tokens}, headers=how)


_HANDLERS = {"generateContent": generate_content,
             "streamGenerateContent": stream_generate_content, "countTokens": count_tokens}


def hot_routes(gw: Gateway) -> list[HotRoute]:
    """Every Gemini method under every prefix, by the table path the
    middleware looks them up by (:func:`app.gemini_paths.method_route`)."""
    return [HotRoute(gw, "POST", f"{prefix}*:{method}", _HANDLERS[method])
            for prefix in PREFIXES for method in _METHODS]


# --- models -----------------------------------------------------------------------------

def model_json(entry: ModelEntry) -> dict[str, Any]:
    return {"name": f"models/{entry.id}", "baseModelId": entry.id, "version": "001",
            "displayName": entry.id, "description": f"{entry.id}, served by poolgate",
            "inputTokenLimit": _INPUT_LIMIT, "outputTokenLimit": _OUTPUT_LIMIT,
            "supportedGenerationMethods": list(_METHODS)}


async def list_models(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    key = request.scope["state"]["record"].key
    return json_response({"models": [model_json(e) for e in gw.pool.models()
                                     if gw.teams.sees(key, e.id)]})


async def get_model(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    model_id = request.path_params["model_id"]
    if model_id.startswith("models/"):
        model_id = model_id[len("models/"):]
    if gw.teams.sees(request.scope["state"]["record"].key, model_id):
        for entry in gw.pool.models():
            if entry.id == model_id:
                return json_response(model_json(entry))
    return error_response(gw.unknown_model(request.scope["state"]["record"].key, model_id),
                          "gemini")
