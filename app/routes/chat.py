"""Inference routes: OpenAI ``/v1/chat/completions`` and ``/v1/completions``,
Anthropic ``/v1/messages`` and ``/v1/messages/count_tokens``."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from starlette.requests import Request

from pool.errors import GatewayError

from pool.tokens import estimate_tokens

from ..dialects import anthropic_messages, openai_chat, openai_completions
from ..gateway import Gateway
from ..http import error_response, json_response, read_json
from .inference import serve

__all__ = ["chat_completions", "completions", "messages", "count_tokens"]


def _route(dialect: ModuleType, name: str, error_dialect: str) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Any:
        gw: Gateway = request.app.state.gateway
        record = request.scope["state"]["record"]
        record.dialect = name
        try:
            body = await read_json(request, gw.max_body_bytes)
            chat = dialect.decode(body, request.headers)
        except GatewayError as exc:
            record.error = exc.kind
            return error_response(exc, error_dialect)
        return await serve(gw, request, chat, dialect, record)

    endpoint.__name__ = name
    return endpoint


chat_completions = _route(openai_chat, "openai_chat", "openai")
messages = _route(anthropic_messages, "anthropic", "anthropic")
completions = _route(openai_completions, "openai_completions", "openai")


async def count_tokens(request: Request) -> Any:
    """Input tokens of ``system`` + ``messages`` + ``tools``: the worker's own
    count when it has one (an Anthropic upstream), else the documented
    estimate of :func:`pool.tokens.estimate_tokens`. Never a 404 for a known
    model: Claude Code would fall back to billable calls."""
    gw: Gateway = request.app.state.gateway
    record = request.scope["state"]["record"]
    record.dialect = "anthropic"
    try:
        body = await read_json(request, gw.max_body_bytes)
        chat = anthropic_messages.decode_count_tokens(body, request.headers)
        record.model = chat.model
        exact = None
        if gw.pool.knows(chat.model):
            worker, routed = gw.pool.pick(chat)
            record.worker = worker.name
            counter = getattr(worker, "count_tokens", None)
            exact = await counter(routed) if counter is not None else None
    except GatewayError as exc:
        record.error = exc.kind
        return error_response(exc, "anthropic")
    tokens = exact if exact is not None else estimate_tokens(chat)
    record.tokens_in = tokens
    return json_response({"input_tokens": tokens}, headers={
        "x-poolgate-token-count": "exact" if exact is not None else "estimate"})
