"""A ``dialect = "gemini"`` remote worker: a fake Gemini API upstream behind a
real poolgate, used by the real google-genai SDK (its own body sent on), and
the openai and anthropic SDKs (translated), streaming and tools included."""

from __future__ import annotations

import base64
import json
from typing import Iterator

import anthropic
import httpx
import openai
import orjson
import pytest
from google import genai
from google.genai import errors, types

from pydantic import SecretStr

from app.factory import create_app
from app.key_settings import KeySettings
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.gemini_upstream import FakeGemini, gemini_signature
from tests.fakes.scripted import reasoning_for
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

KEY = "sk-gemini-client"
TIGHT_KEY = "sk-one-request-a-minute"
UPSTREAM_KEY = "goog-upstream-secret"
MODEL = "gemini-fake-flash"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeGemini]:
    with FakeGemini(api_key=UPSTREAM_KEY, models=(MODEL,)) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def url(fake: FakeGemini) -> Iterator[str]:
    tight = KeySettings(secret=SecretStr(TIGHT_KEY), rpm=1, models=("gemini-*",))
    settings = Settings(server=ServerSettings(api_keys={"team": KEY}, keys={"tight": tight}),
                        workers=(
        WorkerSettings(name="gemini-up", dialect="gemini", url=fake.url, api_key=UPSTREAM_KEY,
                       models=(MODEL,)),))
    with ServerThread(create_app(settings)) as server:
        yield server.url


def google(url: str) -> genai.Client:
    return genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=url,
                                                                    api_version="v1beta"))


def test_gemini_client_is_sent_on(url: str, fake: FakeGemini) -> None:
    config = types.GenerateContentConfig(
        temperature=0.3, safety_settings=[types.SafetySetting(
            category="HARM_CATEGORY_HARASSMENT", threshold="BLOCK_NONE")])
    with google(url) as c:
        out = c.models.generate_content(model=MODEL, contents="hello there", config=config)
        chunks = list(c.models.generate_content_stream(model=MODEL, contents="one two three"))
    assert out.text == "echo: hello there"
    assert out.usage_metadata.prompt_token_count > 0
    assert "".join(ch.text or "" for ch in chunks) == "echo: one two three"
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    # fields the canonical form does not model reached the upstream
    assert fake.requests[-2][1]["safetySettings"][0]["threshold"] == "BLOCK_NONE"
    assert fake.requests[-1][0] == f"/v1beta/models/{MODEL}:streamGenerateContent"


def test_gemini_client_thought_signature_round_trip(url: str, fake: FakeGemini) -> None:
    question = types.Content(role="user", parts=[types.Part(text="[[think]] why")])
    with google(url) as c:
        first = c.models.generate_content(model=MODEL, contents=[question])
        thought = next(p for p in first.candidates[0].content.parts if p.thought)
        assert thought.text == reasoning_for("why")
        c.models.generate_content(model=MODEL, contents=[
            question, first.candidates[0].content,
            types.Content(role="user", parts=[types.Part(text="go on")])])
    # the client's own body went on: the signature in the SDK's base64url, the same bytes
    sent = fake.last["contents"][1]["parts"]
    signatures = [p.get("thoughtSignature") or p.get("thought_signature") for p in sent]
    assert [base64.urlsafe_b64decode(s) for s in signatures if s] == [
        base64.b64decode(gemini_signature(reasoning_for("why")))]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_client_tool_round_trip(url: str, fake: FakeGemini, stream: bool) -> None:
    client = closed_at_end(openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    messages: list = [{"role": "user", "content": 'weather? [[tool:get_weather {"city": "Oslo"}]]'}]
    if stream:
        with client.chat.completions.stream(model=MODEL, messages=messages, tools=tools) as s:
            first = s.get_final_completion()
    else:
        first = client.chat.completions.create(model=MODEL, messages=messages, tools=tools,
                                               tool_choice="required")
        assert fake.last["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather", {"city": "Oslo"})
    assert fake.last["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"] == WEATHER
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "Snow, -3C"}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    client.close()
    assert second.choices[0].message.content == "tool said: Snow, -3C"
    response = fake.last["contents"][-1]["parts"][0]["functionResponse"]
    assert response == {"id": call.id, "name": "get_weather",
                        "response": {"output": "Snow, -3C"}}


def test_anthropic_client(url: str, fake: FakeGemini) -> None:
    client = closed_at_end(anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0))
    out = client.messages.create(model=MODEL, max_tokens=50, system="be brief",
                                 messages=[{"role": "user", "content": "hi there"}])
    with client.messages.stream(model=MODEL, max_tokens=2,
                                messages=[{"role": "user", "content": "a b c d"}]) as s:
        cut = s.get_final_message()
    client.close()
    assert out.content[0].text == "echo: hi there" and out.stop_reason == "end_turn"
    assert out.usage.input_tokens > 0
    assert cut.stop_reason == "max_tokens"
    assert fake.last["generationConfig"]["maxOutputTokens"] == 2
    assert fake.requests[-2][1]["systemInstruction"] == {"parts": [{"text": "be brief"}]}


def test_count_tokens_is_the_upstreams(url: str, fake: FakeGemini) -> None:
    with google(url) as c:
        counted = c.models.count_tokens(model=MODEL, contents="count these words " * 20)
    assert fake.requests[-1][0] == f"/v1beta/models/{MODEL}:countTokens"
    wrapped = fake.last["generateContentRequest"]
    assert wrapped["model"] == f"models/{MODEL}"
    assert counted.total_tokens == max(1, len(orjson.dumps(wrapped["contents"])) // 4)
    client = closed_at_end(anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0))
    raw = client.messages.with_raw_response.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "hi"}])
    client.close()
    assert raw.headers["x-poolgate-token-count"] == "exact"
    assert fake.last["generateContentRequest"]["contents"] == [
        {"role": "user", "parts": [{"text": "hi"}]}]


def test_key_policy_refusals_in_googles_shape(url: str) -> None:
    """The same key policy as every dialect: a rate limit is 429
    RESOURCE_EXHAUSTED with Retry-After; a model the key may not use is refused."""
    with genai.Client(api_key=TIGHT_KEY, http_options=types.HttpOptions(
            base_url=url, api_version="v1beta")) as c:
        c.models.generate_content(model=MODEL, contents="one")
        with pytest.raises(errors.ClientError) as limited:
            c.models.generate_content(model=MODEL, contents="two")
    assert limited.value.code == 429 and limited.value.status == "RESOURCE_EXHAUSTED"
    assert int(limited.value.response.headers["retry-after"]) >= 1
    refused = httpx.post(f"{url}/v1beta/models/other-model:generateContent",
                         headers={"x-goog-api-key": TIGHT_KEY},
                         json={"contents": [{"parts": [{"text": "x"}]}]})
    assert refused.status_code in (403, 404)
    assert refused.json()["error"]["status"] in ("PERMISSION_DENIED", "NOT_FOUND")
