"""The ``remote`` worker kinds: an OpenAI Chat Completions upstream, an
Anthropic Messages upstream and a Gemini API upstream. All I/O lives in :class:`.base.RemoteWorker`;
the translation in the dialect modules."""

from __future__ import annotations

from typing import Any, Mapping

import orjson
from yarl import URL

from pool.errors import UpstreamError
from pool.model import ChatRequest
from pool.worker import Capabilities

from . import anthropic_messages, gemini, openai_chat
from .base import RemoteSpec, RemoteWorker
from .images import vet_images

__all__ = ["OpenAIChatWorker", "AnthropicMessagesWorker", "GeminiWorker", "ANTHROPIC_VERSION"]

ANTHROPIC_VERSION = "2023-06-01"
_JSON = {"content-type": "application/json"}
# messages fields the count_tokens endpoint refuses ("extra inputs are not permitted")
_NOT_COUNTED = ("max_tokens", "stream", "temperature", "top_p", "top_k", "stop_sequences",
                "metadata", "service_tier", "container")


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
        return openai_chat.build_body(request, self.spec.policy), _JSON


class AnthropicMessagesWorker(RemoteWorker):
    """``POST {url}/v1/messages``; health is ``GET {url}/v1/models``;
    ``POST {url}/v1/messages/count_tokens`` counts input tokens.

    A request that came in as Anthropic carries the client's
    ``anthropic-version`` and ``anthropic-beta`` headers on to the upstream
    (the betas the worker's policy allows).
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
        self._count_url = root + "/v1/messages/count_tokens"

    def prepare(self, request: ChatRequest) -> tuple[dict[str, Any], Mapping[str, str]]:
        body = anthropic_messages.build_body(request, self.spec.policy)
        passed = request.passthrough_headers
        if request.dialect != "anthropic" or not passed:
            return body, _JSON
        headers = {"content-type": "application/json"}
        version = passed.get("anthropic-version")
        if version:
            headers["anthropic-version"] = version
        beta = passed.get("anthropic-beta")
        kept = self.spec.policy.betas(beta) if beta else None
        if kept:
            headers["anthropic-beta"] = kept
        return body, headers

    async def count_tokens(self, request: ChatRequest) -> int | None:
        """The upstream's ``input_tokens`` for ``request``, built like a
        messages request without the generation fields; ``None`` when the
        upstream has no count_tokens endpoint (404 or 405)."""
        body, headers = self.prepare(await vet_images(request, self.spec.policy, self.spec.proxy))
        for key in _NOT_COUNTED:
            body.pop(key, None)
        try:
            resp = await self._post(orjson.dumps(body, default=dict), headers,
                                    url=self._count_url)
        except UpstreamError as exc:
            if exc.status in (404, 405):
                return None
            raise
        return await self._read_count(resp, "input_tokens")


class GeminiWorker(RemoteWorker):
    """``POST {url}/v1beta/models/{model}:generateContent`` (or
    ``:streamGenerateContent?alt=sse``) with the key as ``x-goog-api-key``;
    health is ``GET {url}/v1beta/models``. Answers are translated (also to a
    Gemini client, whose own body is sent on): see :mod:`.gemini`."""

    parser_factory = gemini.StreamParser
    body_events = gemini.body_events

    def __init__(self, spec: RemoteSpec) -> None:
        root = spec.url.rstrip("/")
        auth = {"x-goog-api-key": spec.api_key} if spec.api_key else {}
        super().__init__(spec, capabilities=Capabilities(images=True, logprobs=False, max_n=1,
                                                          tools=True),
                         chat_url=root + "/v1beta/models", health_url=root + "/v1beta/models",
                         auth_headers=auth)
        self._root = root
        self._urls: dict[tuple[str, bool], URL] = {}

    def prepare(self, request: ChatRequest) -> tuple[dict[str, Any], Mapping[str, str]]:
        return gemini.build_body(request, self.spec.policy), _JSON

    def url_for(self, request: ChatRequest) -> URL:
        key = (request.model, request.stream)
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) >= 256:  # served models are few; requests name only those
                self._urls.clear()
            method = "streamGenerateContent?alt=sse" if request.stream else "generateContent"
            url = self._urls[key] = URL(f"{self._root}/v1beta/models/{request.model}:{method}",
                                        encoded=False)
        return url

    async def count_tokens(self, request: ChatRequest) -> int | None:
        """The upstream's ``totalTokens`` for ``request`` (``:countTokens`` with
        the whole request as ``generateContentRequest``); ``None`` when the
        upstream cannot count (404 or 405)."""
        body, headers = self.prepare(await vet_images(request, self.spec.policy, self.spec.proxy))
        wrapped = {"generateContentRequest": {"model": f"models/{request.model}", **body}}
        url = URL(f"{self._root}/v1beta/models/{request.model}:countTokens", encoded=False)
        try:
            resp = await self._post(orjson.dumps(wrapped, default=dict), headers, url=url)
        except UpstreamError as exc:
            if exc.status in (404, 405):
                return None
            raise
        return await self._read_count(resp, "totalTokens")
