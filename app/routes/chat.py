"""Inference routes: OpenAI ``/v1/chat/completions`` and ``/v1/completions``,
Anthropic ``/v1/messages`` and ``/v1/messages/count_tokens``."""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

from pool.errors import GatewayError


from ..dialects import anthropic_messages, native_generate, openai_chat, openai_completions
from ..gateway import Gateway
from ..hot import Handler, Incoming
from ..http import error_response, json_response, new_id, now, read_json
from ..record import RequestRecord
from .inference import complete, count_input, serve

__all__ = ["chat_completions", "completions", "messages", "count_tokens", "generate"]


def _route(dialect: ModuleType, name: str, error_dialect: str) -> Handler:
    async def endpoint(gw: Gateway, request: Incoming, record: RequestRecord) -> Any:
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
async def completions(gw: Gateway, request: Incoming, record: RequestRecord) -> Any:
    """Legacy completions: one prompt is served like any request; a list of
    prompts (not streamed) is one request for the key's policy (one of its
    rpm), answered by one upstream request per prompt, concurrently, their
    choices in prompt order. The prompts that finished are charged also when
    another failed."""
    record.dialect = "openai_completions"
    try:
        body = await read_json(request, gw.max_body_bytes)
        chats = openai_completions.decode_all(body, request.headers)
        if len(chats) == 1:
            return await serve(gw, request, chats[0], openai_completions, record)
        record.model = chats[0].model
        if record.key in gw.teams.policies:  # one request, whatever the number of prompts
            await gw.admit_key(record.key, record.model)
        done = await _complete_all(gw, request, chats, record)
    except GatewayError as exc:
        record.error = exc.kind
        return error_response(exc, "openai")
    return json_response(openai_completions.encode_completions(
        list(done), chats[0], response_id=new_id("cmpl-"), created=now(), model=chats[0].model))


async def _complete_all(gw: Gateway, request: Incoming, chats: list[Any],
                        record: Any) -> list[Any]:
    """Every prompt's completion, concurrently; the first failure cancels the
    others (their slots are released as they unwind) and is the answer. The
    usage of those that finished goes on ``record`` either way (charged)."""
    tasks: list[asyncio.Task[Any]] = []
    try:
        async with asyncio.TaskGroup() as group:
            tasks += (group.create_task(complete(gw, request, c, record, counted=True))
                      for c in chats)
    except BaseExceptionGroup as failed:
        raise _first_failure(failed) from None
    finally:
        finished = [t.result() for t in tasks
                    if t.done() and not t.cancelled() and t.exception() is None]
        record.tokens_in = sum(c.usage.input_tokens or 0 for c in finished)
        record.tokens_out = sum(c.usage.output_tokens or 0 for c in finished)
    return [t.result() for t in tasks]


def _first_failure(group: BaseExceptionGroup) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_failure(exc)
        if isinstance(exc, GatewayError):
            return exc
    return group.exceptions[0]


async def count_tokens(gw: Gateway, request: Incoming, record: RequestRecord) -> Any:
    """Input tokens of ``system`` + ``messages`` + ``tools``: the worker's own
    count when it has one (an Anthropic upstream), else the documented
    estimate of :func:`pool.tokens.estimate_tokens`. Never a 404 for a known
    model: Claude Code would fall back to billable calls. One request of the
    key's ``rpm`` (the upstream is asked with the operator's credentials); it
    charges no tokens."""
    record.dialect = "anthropic"
    try:
        body = await read_json(request, gw.max_body_bytes)
        chat = anthropic_messages.decode_count_tokens(body, request.headers)
        how, tokens = await count_input(gw, chat, record, known_only=False)
    except GatewayError as exc:
        record.error = exc.kind
        return error_response(exc, "anthropic")
    return json_response({"input_tokens": tokens}, headers=how)


async def generate(gw: Gateway, request: Incoming, record: RequestRecord) -> Any:
    """The native ``/generate`` (SGLang's shape): token ids and logprobs, for RL."""
    record.dialect = "native"
    try:
        body = await read_json(request, gw.max_body_bytes)
        chat = native_generate.decode(body, request.headers, default_model=_token_id_model(gw))
    except GatewayError as exc:
        record.error = exc.kind
        return error_response(exc, "openai")
    return await serve(gw, request, chat, native_generate, record)


def _token_id_model(gw: Gateway) -> str | None:
    """The model ``/generate`` serves when the body names none: the first one
    whose worker takes token ids."""
    for worker in gw.pool.workers:
        if worker.capabilities.token_ids and worker.models:
            return worker.models[0]
    return None
