"""``RemoteWorker.count_tokens`` against real HTTP upstreams: the fake
Anthropic upstream (which counts), and tiny servers that cannot or fail."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, AsyncIterator, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.dialects import anthropic_messages
from pool.errors import UpstreamCredentialsRefused, UpstreamError, UpstreamUnavailable
from pool.model import ChatRequest, Message, Sampling, TextPart, Tool
from pool.remote import AnthropicMessagesWorker, OpenAIChatWorker, RemoteSpec
from tests.fakes import FakeUpstream, rough_tokens
from tests.support.server import ServerThread

KEY = "sk-fake-upstream-key-0123456789"
TOOL = {"name": "get_weather", "description": "Weather for a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=KEY) as upstream:
        yield upstream


def _refusing_app() -> Starlette:
    """No count_tokens route (404), a GET-only one (405) and failing ones, by path prefix."""

    async def models(request: Request) -> Response:
        return JSONResponse({"data": []})

    async def failing(request: Request) -> Response:
        status = int(request.path_params["status"])
        return JSONResponse({"type": "error", "error": {"type": "rate_limit_error"
                                                        if status == 429 else "api_error",
                                                        "message": f"said {status}"}},
                            status_code=status)

    return Starlette(routes=[
        Route("/none/v1/models", models),
        Route("/get-only/v1/messages/count_tokens", models, methods=["GET"]),
        Route("/fail/{status:int}/v1/messages/count_tokens", failing, methods=["POST"]),
    ])


@pytest.fixture(scope="module")
def refusing() -> Iterator[str]:
    with ServerThread(_refusing_app(), lifespan="off") as server:
        yield server.url


@pytest.fixture
async def workers() -> AsyncIterator[list[Any]]:
    made: list[Any] = []
    yield made
    for worker in made:
        await worker.aclose()


async def anthropic_worker(workers: list[Any], url: str, key: str | None = KEY) -> Any:
    worker = AnthropicMessagesWorker(RemoteSpec(name="anthropic-up", dialect="anthropic",
                                                url=url, api_key=key, models=("fake-model",)))
    await worker.start()
    workers.append(worker)
    return worker


def translated(text: str, **kw: Any) -> ChatRequest:
    return ChatRequest(model="fake-model", dialect="openai_chat",
                       messages=(Message("system", (TextPart("be brief"),)),
                                 Message("user", (TextPart(text),))), **kw)


async def test_counts_a_translated_request_without_generation_fields(
        fake: FakeUpstream, workers: list[Any]) -> None:
    worker = await anthropic_worker(workers, fake.anthropic_url)
    request = translated("hello there", stream=True,
                         sampling=Sampling(max_tokens=50, temperature=0.2, stop=("X",)),
                         tools=(Tool("get_weather", "Weather.", {"type": "object"}),),
                         user="u-1")
    count = await worker.count_tokens(request)
    sent = fake.last
    assert sent.path == "/v1/messages/count_tokens"
    assert sent.headers["x-api-key"] == KEY and sent.headers["anthropic-version"]
    body = sent.body
    assert body["model"] == "fake-model"
    assert body["system"] == [{"type": "text", "text": "be brief"}]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text",
                                                              "text": "hello there"}]}]
    assert body["tools"][0]["name"] == "get_weather"
    for key in ("max_tokens", "stream", "temperature", "stop_sequences", "metadata"):
        assert key not in body
    assert count == rough_tokens({k: body.get(k) for k in ("system", "messages", "tools")})


async def test_anthropic_client_body_passes_through_with_its_headers(
        fake: FakeUpstream, workers: list[Any]) -> None:
    worker = await anthropic_worker(workers, fake.anthropic_url)
    raw = {"model": "claude-alias", "system": "sys", "tools": [TOOL],
           "messages": [{"role": "user", "content": "count me", "x-extra": 1}],
           "thinking": {"type": "enabled", "budget_tokens": 2048}}
    request = anthropic_messages.decode_count_tokens(
        raw, {"anthropic-version": "2023-06-01", "anthropic-beta": "token-counting-2024-11-01"})
    routed = replace(request, model="fake-model")  # as the pool routes an alias
    count = await worker.count_tokens(routed)
    sent = fake.last
    assert sent.body == {**raw, "model": "fake-model"}  # the client's own body, model rewritten
    assert raw["model"] == "claude-alias"  # and the client's object untouched
    assert sent.headers["anthropic-beta"] == "token-counting-2024-11-01"
    assert count == rough_tokens({"system": "sys", "messages": raw["messages"],
                                  "tools": [TOOL]})


async def test_count_grows_with_content(fake: FakeUpstream, workers: list[Any]) -> None:
    worker = await anthropic_worker(workers, fake.anthropic_url)
    short = await worker.count_tokens(translated("hi"))
    long = await worker.count_tokens(translated("hi " * 500))
    assert short is not None and long is not None and long > short + 300


@pytest.mark.parametrize("path", ["/none", "/get-only"], ids=["404", "405"])
async def test_no_count_endpoint_means_none(refusing: str, path: str,
                                            workers: list[Any]) -> None:
    worker = await anthropic_worker(workers, refusing + path)
    assert await worker.count_tokens(translated("hi")) is None


async def test_upstream_refusals_map_like_stream(fake: FakeUpstream, refusing: str,
                                                 workers: list[Any]) -> None:
    wrong_key = await anthropic_worker(workers, fake.anthropic_url, key="sk-wrong")
    with pytest.raises(UpstreamCredentialsRefused) as info:
        await wrong_key.count_tokens(translated("hi"))
    assert info.value.status == 502 and info.value.kind == "upstream"
    assert "sk-wrong" not in info.value.message

    limited = await anthropic_worker(workers, refusing + "/fail/429")
    with pytest.raises(UpstreamError) as info:
        await limited.count_tokens(translated("hi"))
    assert info.value.status == 429 and info.value.message == "said 429"

    broken = await anthropic_worker(workers, refusing + "/fail/500")
    with pytest.raises(UpstreamUnavailable):
        await broken.count_tokens(translated("hi"))


async def test_unreachable_upstream_is_unavailable(workers: list[Any]) -> None:
    worker = await anthropic_worker(workers, "http://127.0.0.1:9")
    with pytest.raises(UpstreamUnavailable):
        await worker.count_tokens(translated("hi"))


async def test_openai_worker_cannot_count(fake: FakeUpstream) -> None:
    worker = OpenAIChatWorker(RemoteSpec(name="openai-up", dialect="openai", url=fake.url,
                                         api_key=KEY, models=("fake-model",)))
    await worker.start()
    try:
        before = len(fake.requests)
        assert await worker.count_tokens(translated("hi")) is None
        assert len(fake.requests) == before  # nothing was sent
    finally:
        await worker.aclose()
