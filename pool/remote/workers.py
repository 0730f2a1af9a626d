"""The two ``remote`` worker kinds: an OpenAI Chat Completions upstream and an
Anthropic Messages upstream. All I/O lives in :class:`.base.RemoteWorker`;
the translation in the dialect modules."""

from __future__ import annotations

from typing import Any, Mapping

from pool.model import ChatRequest
from pool.worker import Capabilities

from . import anthropic_messages, openai_chat
from .base import RemoteSpec, RemoteWorker

__all__ = ["OpenAIChatWorker", "AnthropicMessagesWorker", "ANTHROPIC_VERSION"]

ANTHROPIC_VERSION = "2023-06-01"
_JSON = {"content-type": "application/json"}


class OpenAIChatWorker(RemoteWorker):
    """``POST {url}/chat/completions``; health is ``GET {url}/models``."""

    parser_factory = openai_chat.StreamParser
    body_events = openai_chat.body_events

    def __init__(self, spec: RemoteSpec) -> None:
        base = spec.url.rstrip("/")
        auth = {"authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        super().__init__(spec, capabilities=Capabilities(images=True, logprobs=True, max_n=1,
                                                          tools=True),
                         chat_url=base + "/chat/completions", health_url=base + "/models",
                         auth_headers=auth)

    def prepare(self, request: ChatRequest) -> tuple[dict[str, Any], Mapping[str, str]]:
        return openai_chat.build_body(request), _JSON


class AnthropicMessagesWorker(RemoteWorker):
    """``POST {url}/v1/messages``; health is ``GET {url}/v1/models``.

    A request that came in as Anthropic carries the client's
    ``anthropic-version`` and ``anthropic-beta`` headers on to the upstream.
    """

    parser_factory = anthropic_messages.StreamParser
    body_events = anthropic_messages.body_events

    def __init__(self, spec: RemoteSpec) -> None:
        root = spec.url.rstrip("/")
        auth = {"x-api-key": spec.api_key} if spec.api_key else {}
        super().__init__(spec, capabilities=Capabilities(images=True, logprobs=False, max_n=1,
                                                          tools=True),
                         chat_url=root + "/v1/messages", health_url=root + "/v1/models",
                         auth_headers=auth,
                         default_headers={"anthropic-version": ANTHROPIC_VERSION})

    def prepare(self, request: ChatRequest) -> tuple[dict[str, Any], Mapping[str, str]]:
        body = anthropic_messages.build_body(request)
        passed = request.passthrough_headers
        if request.dialect != "anthropic" or not passed:
            return body, _JSON
        headers = {"content-type": "application/json"}
        version = passed.get("anthropic-version")
        if version:
            headers["anthropic-version"] = version
        beta = passed.get("anthropic-beta")
        if beta:
            headers["anthropic-beta"] = beta
        return body, headers
