"""Inference routes: OpenAI ``/v1/chat/completions`` and Anthropic ``/v1/messages``."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from starlette.requests import Request

from pool.errors import GatewayError

from ..dialects import anthropic_messages, openai_chat
from ..gateway import Gateway
from ..http import error_response, read_json
from .inference import serve

__all__ = ["chat_completions", "messages"]


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
