"""Session keys: which conversation a request belongs to, for routing affinity.

:func:`session_key` takes the first of these that the request carries:

===================================  ==============================  ===============
source                               what                            key namespace
===================================  ==============================  ===============
``header:x-session-id``              generic clients, proxies        ``session:``
``header:x-claude-code-session-id``  Claude Code                     ``session:``
``header:session-id``                Codex CLI                       ``session:``
``metadata.user_id``                 Claude Code's JSON ``user_id``  ``session:``
                                     (its ``session_id``)
``session_id``                       what the decoder found          ``session:``
                                     elsewhere (``session_id``
                                     header, Responses
                                     ``client_metadata``)
``prompt_cache_key``                 OpenAI prompt cache key         ``cache:``
``previous_response_id``             a Responses chain               ``response:``
``user``                             OpenAI ``user`` / Anthropic     ``user:``
                                     ``metadata.user_id`` as is
``content_hash``                     system prompt + first user      ``content:``
                                     message (always available)
===================================  ==============================  ===============

Keys carry the *kind* of identifier as a prefix, so a ``user`` and a
``prompt_cache_key`` with the same text never meet. Every explicit session id
shares one namespace on purpose: Claude Code sends the same UUID as a header
and inside ``metadata.user_id``, and a proxy that drops custom headers must
not split one conversation in two.

``previous_response_id`` changes every turn: as a key it matches the binding
of that response (see :func:`response_key`), which the Responses route may
write when it stores a response; the route's own preference for the previous
response's worker covers the same ground.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Iterable, Mapping

import orjson

from pool.model import (
    ChatRequest, ImagePart, Part, ReasoningPart, TextPart, ToolCallPart, ToolResultPart,
)

__all__ = ["session_key", "owned_session_key", "response_key", "content_hash", "SESSION_HEADERS", "SOURCES"]

SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id", "session-id")
SOURCES = (*(f"header:{h}" for h in SESSION_HEADERS), "metadata.user_id", "session_id",
           "prompt_cache_key", "previous_response_id", "user", "content_hash")
_HEADER_SOURCES = tuple((h, f"header:{h}") for h in SESSION_HEADERS)
# Identifiers longer than this are stored by digest: a client must not be able
# to park kilobytes per binding in the store.
_MAX_ID = 128


def _bounded(value: str) -> str:
    if len(value) <= _MAX_ID:
        return value
    return "#" + blake2b(value.encode(), digest_size=16).hexdigest()


def session_key(request: ChatRequest, headers: Mapping[str, str]) -> tuple[str, str]:
    """``(key, source)`` for ``request``; never fails (the content hash is the
    last resort). ``headers``: lower-case names, or a case-insensitive mapping
    such as Starlette's ``Headers``."""
    for name, source in _HEADER_SOURCES:
        value = headers.get(name)
        if value:
            return "session:" + _bounded(value), source
    session = _claude_code_session(request.metadata)
    if session is not None:
        return "session:" + _bounded(session), "metadata.user_id"
    if request.session_id:
        return "session:" + _bounded(request.session_id), "session_id"
    cache_key = request.prompt_cache_key or _raw_str(request, "prompt_cache_key")
    if cache_key:
        return "cache:" + _bounded(cache_key), "prompt_cache_key"
    previous = _raw_str(request, "previous_response_id")
    if previous:
        return response_key(previous), "previous_response_id"
    if request.user:
        return "user:" + _bounded(request.user), "user"
    return "content:" + content_hash(request), "content_hash"


def owned_session_key(owner: str, request: ChatRequest,
                      headers: Mapping[str, str]) -> tuple[str, str]:
    """:func:`session_key` inside the namespace of the API key ``owner`` (its
    name): two teams sending the same conversation (same session id, same
    prompt) never share a binding or an upstream session. Key names cannot
    hold ``:``, so ``owner:`` cannot be forged by a session id."""
    key, source = session_key(request, headers)
    return owner + ":" + key, source


def response_key(response_id: str) -> str:
    """The session key of a follow-up to ``response_id`` (``previous_response_id``)."""
    return "response:" + _bounded(response_id)


def _raw_str(request: ChatRequest, name: str) -> str | None:
    value = request.raw.get(name)
    return value if type(value) is str else None


def _claude_code_session(metadata: Mapping[str, object] | None) -> str | None:
    """Claude Code's ``metadata.user_id`` is JSON text holding ``session_id``."""
    if not metadata:
        return None
    user_id = metadata.get("user_id")
    if type(user_id) is not str or not user_id.startswith("{"):
        return None
    try:
        parsed = orjson.loads(user_id)
    except orjson.JSONDecodeError:
        return None
    session = parsed.get("session_id") if type(parsed) is dict else None
    return session if type(session) is str and session else None


def content_hash(request: ChatRequest) -> str:
    """A digest of the system/developer messages before the first user message
    and of that message: the same for every turn of one conversation."""
    digest = blake2b(digest_size=16)
    for message in request.messages:
        if message.role == "assistant":
            continue
        digest.update(message.role.encode())
        digest.update(b"\x1e")
        _feed(digest, message.parts)
        if message.role == "user":
            break
    return digest.hexdigest()


def _feed(digest: blake2b, parts: Iterable[Part]) -> None:
    for part in parts:
        if isinstance(part, TextPart):
            digest.update(b"T")
            digest.update(part.text.encode())
        elif isinstance(part, ImagePart):
            digest.update(b"I")
            digest.update((part.url or part.data or "").encode())
        elif isinstance(part, ToolResultPart):
            digest.update(b"R")
            digest.update(part.call_id.encode())
            _feed(digest, part.content)
        elif isinstance(part, ToolCallPart):
            digest.update(b"C")
            digest.update(part.name.encode())
            digest.update(part.arguments.encode())
        elif isinstance(part, ReasoningPart):
            digest.update(b"Z")
            digest.update(part.text.encode())
        digest.update(b"\x1f")
