"""The OpenAI Responses API: ``POST /v1/responses`` and the stored responses
(``GET``/``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``)."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

import structlog

from pool.errors import BadRequest, GatewayError, NotFound
from sessions.redis_link import StoreUnavailable
from sessions.responses import (BrokenChain, StoredResponse, chain_input_items, conversation,
                                load_chain)

from ..dialects import openai_responses
from ..gateway import Gateway
from ..hot import Incoming
from ..http import error_response, json_response, read_json
from ..record import RequestRecord
from .inference import serve

__all__ = ["create_response", "get_response", "delete_response", "list_input_items"]

log = structlog.get_logger("poolgate.responses")


def _not_found(response_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"No response with id '{response_id}' is stored here (it may have expired, "
                    "been deleted, or been created with store=false).", param=param,
                    code="response_not_found")


def _owner(gw: Gateway, request: Request) -> str:
    """The id of the key the request came with: what owns stored responses."""
    return gw.keyring.id_of(request.scope["state"]["record"].key)


async def _owned(gw: Gateway, response_id: str, owner: str) -> StoredResponse | None:
    """The stored response if the key ``owner`` created it; another key's
    response is ``None``, exactly like one that does not exist."""
    stored = await gw.responses.get(response_id)
    if stored is None or stored.owner != owner:
        return None
    return stored


async def _chain(gw: Gateway, response_id: str, owner: str,
                 param: str | None = None) -> list[StoredResponse]:
    """The chain ending at ``response_id`` (``owner``'s), oldest first; a 404
    when it is unknown or when an earlier turn is no longer stored (a follow-up
    must never see a shorter history than the conversation had)."""
    try:
        chain = await load_chain(gw.responses, response_id, owner)
    except BrokenChain as broken:
        raise NotFound(f"The conversation before response '{response_id}' is no longer "
                       f"complete: the earlier response '{broken.missing}' has expired, been "
                       "evicted or been deleted. Start a new conversation with the full input.",
                       param=param, code="response_chain_broken") from None
    if chain is None:
        raise _not_found(response_id, param)
    return chain


async def create_response(gw: Gateway, request: Incoming, record: RequestRecord) -> Any:
    record.dialect = "openai_responses"
    try:
        body = await read_json(request, gw.max_body_bytes)
        owner = gw.keyring.id_of(record.key)
        wanted = openai_responses.references(body)
        if wanted:  # earlier items by id (the Vercel AI SDK's default): the stored items
            body = openai_responses.resolve(body, wanted,
                                            await gw.responses.get_items(owner, list(wanted)))
        history: list[dict[str, Any]] = []
        prefer = None
        link = None
        previous = body.get("previous_response_id") if isinstance(body, dict) else None
        if previous is not None:
            if not isinstance(previous, str):
                raise BadRequest("previous_response_id must be a string.",
                                 param="previous_response_id")
            chain = await _chain(gw, previous, owner, "previous_response_id")
            history = conversation(chain)
            prefer = chain[-1].worker  # the worker that served the previous turn
            link = previous
        chat = openai_responses.decode(body, request.headers, history=history)
        store = body.get("store", True) is not False
        if store and not getattr(gw.responses, "available", True):
            # refuse before the answer is generated, not after: it could not be stored
            raise StoreUnavailable(
                "Stored responses are unavailable: the gateway's shared store (Redis) is not "
                "reachable. Retry shortly, or send the request with store=false.")
        items = tuple(openai_responses.input_items(body)) if store else ()
    except GatewayError as exc:
        record.error = exc.kind
        return error_response(exc, "openai")

    finalize = None
    if store:
        async def finalize(response: dict[str, Any], worker: str) -> None:
            try:
                await gw.responses.put(StoredResponse(
                    id=response["id"], response=response, input_items=items,
                    previous_id=link, worker=worker, created_at=time.time(), owner=owner))
            except StoreUnavailable:
                # the store was lost while the answer was generated: the answer stands
                log.warning("responses.not_stored", response_id=response["id"])

    return await serve(gw, request, chat, openai_responses, record, prefer=prefer,
                       finalize=finalize)


async def get_response(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    response_id = request.path_params["response_id"]
    try:
        stored = await _owned(gw, response_id, _owner(gw, request))
    except StoreUnavailable as exc:
        return error_response(exc, "openai")
    if stored is None:
        return error_response(_not_found(response_id), "openai")
    return json_response(stored.response)


async def delete_response(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    response_id = request.path_params["response_id"]
    owner = _owner(gw, request)
    try:
        found = (await _owned(gw, response_id, owner) is not None
                 and await gw.responses.delete(response_id))
    except StoreUnavailable as exc:
        return error_response(exc, "openai")
    if not found:
        return error_response(_not_found(response_id), "openai")
    return json_response({"id": response_id, "object": "response.deleted", "deleted": True})


async def list_input_items(request: Request) -> Response:
    """The items the response was generated from — earlier turns of a
    ``previous_response_id`` chain included — newest first unless
    ``order=asc``; cursor pagination with ``after`` and ``limit`` (1-100)."""
    gw: Gateway = request.app.state.gateway
    response_id = request.path_params["response_id"]
    try:
        limit, order, after = _page_params(request)
    except BadRequest as exc:
        return error_response(exc, "openai")
    try:
        chain = await _chain(gw, response_id, _owner(gw, request))
    except GatewayError as exc:  # not found, or the store is unavailable
        return error_response(exc, "openai")
    items = chain_input_items(chain)
    if order == "desc":
        items.reverse()
    start = 0
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            return error_response(BadRequest(f"No input item with id '{after}' in this response.",
                                             param="after"), "openai")
        start = ids.index(after) + 1
    page = items[start:start + limit]
    return json_response({"object": "list", "data": page,
                          "first_id": page[0].get("id") if page else None,
                          "last_id": page[-1].get("id") if page else None,
                          "has_more": start + limit < len(items)})


def _page_params(request: Request) -> tuple[int, str, str | None]:
    query = request.query_params
    raw_limit = query.get("limit", "20")
    try:
        limit = int(raw_limit)
    except ValueError:
        raise BadRequest(f"limit must be an integer, not '{raw_limit}'.", param="limit") from None
    if not 1 <= limit <= 100:
        raise BadRequest("limit must be between 1 and 100.", param="limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest("order must be 'asc' or 'desc'.", param="order")
    return limit, order, query.get("after")
