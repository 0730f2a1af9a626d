"""The real google-genai SDK through a real poolgate, over an OpenAI and an
Anthropic upstream: text, stream, a tools round trip, JSON schema, thinking
with its signature, count tokens, model listing, and Google-shaped errors."""

from __future__ import annotations

import json

import httpx
import pytest
import structlog
from google import genai
from google.genai import errors, types

from tests.fakes.upstreams import reasoning_for, signature_for

from .conftest import ANTHROPIC_MODEL, CLIENT_KEY, OPENAI_MODEL


def client(gateway, *, version: str = "v1beta", key: str = CLIENT_KEY) -> genai.Client:
    return genai.Client(api_key=key, http_options=types.HttpOptions(
        base_url=gateway.url, api_version=version))


WEATHER = types.FunctionDeclaration(
    name="get_weather", description="Weather for a city",
    parameters=types.Schema(type="OBJECT", properties={"city": types.Schema(type="STRING")},
                            required=["city"]))
WEATHER_JSON = types.FunctionDeclaration(
    name="get_weather", description="Weather for a city",
    parameters_json_schema={"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]})
NO_AUTO = types.AutomaticFunctionCallingConfig(disable=True)


@pytest.mark.parametrize("version", ["v1beta", "v1"])
def test_text(gateway, upstream_model, version):
    with client(gateway, version=version) as c:
        out = c.models.generate_content(
            model=upstream_model, contents="hello there",
            config=types.GenerateContentConfig(system_instruction="be brief", temperature=0.5))
    assert out.text == "echo: hello there"
    assert out.candidates[0].finish_reason == types.FinishReason.STOP
    usage = out.usage_metadata
    assert usage.prompt_token_count > 0 and usage.candidates_token_count > 0
    assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
    assert out.model_version == upstream_model and out.response_id
    sent = json.dumps(gateway.fake.last.body)
    assert "be brief" in sent  # the system instruction reached the upstream


def test_stream(gateway, upstream_model):
    with client(gateway) as c:
        chunks = list(c.models.generate_content_stream(
            model=upstream_model, contents="one two three four"))
    assert "".join(ch.text or "" for ch in chunks) == "echo: one two three four"
    assert len(chunks) > 2  # streamed, not one body
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.candidates_token_count > 0


def test_max_tokens_and_stop(gateway, upstream_model):
    with client(gateway) as c:
        cut = c.models.generate_content(
            model=upstream_model, contents="a b c d e f",
            config=types.GenerateContentConfig(max_output_tokens=2))
        stopped = c.models.generate_content(
            model=upstream_model, contents="a b c d",
            config=types.GenerateContentConfig(stop_sequences=["c"]))
    assert cut.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert cut.text.split() == ["echo:", "a"]
    assert stopped.candidates[0].finish_reason == types.FinishReason.STOP
    assert "d" not in stopped.text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("declaration", [WEATHER, WEATHER_JSON], ids=["schema", "json-schema"])
def test_tool_round_trip(gateway, upstream_model, stream, declaration):
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[declaration])],
        automatic_function_calling=NO_AUTO)
    question = types.Content(role="user", parts=[
        types.Part(text='weather? [[tool:get_weather {"city": "Paris"}]]')])
    with client(gateway) as c:
        if stream:
            chunks = list(c.models.generate_content_stream(
                model=upstream_model, contents=[question], config=config))
            parts = [p for ch in chunks for p in ch.candidates[0].content.parts
                     if p.function_call is not None]
            answer = types.Content(role="model", parts=parts)
        else:
            first = c.models.generate_content(model=upstream_model, contents=[question],
                                              config=config)
            answer = first.candidates[0].content
        calls = [p.function_call for p in answer.parts if p.function_call is not None]
        assert [(f.name, f.args) for f in calls] == [("get_weather", {"city": "Paris"})]
        # the tool's declaration reached the upstream as JSON Schema
        sent = json.dumps(gateway.fake.last.body)
        assert '"city": {"type": "string"}' in sent
        result = types.Content(role="user", parts=[types.Part.from_function_response(
            name="get_weather", response={"output": "Sunny, 21C"})])
        second = c.models.generate_content(model=upstream_model,
                                           contents=[question, answer, result], config=config)
    assert second.text == "tool said: Sunny, 21C"
    # the upstream saw the call and its result under one id, in its own dialect
    assert json.dumps(gateway.fake.last.body).count(calls[0].id) >= 2


def test_forced_tool_choice(gateway, upstream_model):
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[WEATHER])], automatic_function_calling=NO_AUTO,
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
            mode="ANY", allowed_function_names=["get_weather"])))
    with client(gateway) as c:
        c.models.generate_content(model=upstream_model, contents="hi", config=config)
    body = gateway.fake.last.body
    choice = body["tool_choice"]
    assert choice in ({"type": "function", "function": {"name": "get_weather"}},
                      {"type": "tool", "name": "get_weather"})


def test_json_schema(gateway, upstream_model):
    schema = {"type": "object", "properties": {"answer": {"type": "string"}},
              "required": ["answer"]}
    with client(gateway) as c:
        c.models.generate_content(
            model=upstream_model, contents="give json",
            config=types.GenerateContentConfig(response_mime_type="application/json",
                                               response_json_schema=schema))
        c.models.generate_content(
            model=upstream_model, contents="give json",
            config=types.GenerateContentConfig(
                response_mime_type="application/json",
                response_schema=types.Schema(type="OBJECT",
                                             properties={"answer": types.Schema(type="STRING")},
                                             required=["answer"])))
    # the schema reached the upstream, in JSON Schema's lower-case types (the
    # Anthropic worker asks for it in a system instruction: unescape that)
    sent = json.dumps(gateway.fake.last.body, separators=(",", ":")).replace('\\"', '"')
    assert '"answer":{"type":"string"}' in sent


def test_thinking_signature_round_trip(gateway):
    """An Anthropic thinking block is a thought part whose signature comes back
    to the upstream byte for byte, through the SDK's own (bytes) field."""
    question = types.Content(role="user", parts=[types.Part(text="[[think]] why")])
    with client(gateway) as c:
        first = c.models.generate_content(model=ANTHROPIC_MODEL, contents=[question])
        thought = next(p for p in first.candidates[0].content.parts if p.thought)
        assert thought.text == reasoning_for("why")
        follow = types.Content(role="user", parts=[types.Part(text="and then?")])
        c.models.generate_content(model=ANTHROPIC_MODEL,
                                  contents=[question, first.candidates[0].content, follow])
    messages = gateway.fake.last.body["messages"]
    blocks = [b for b in messages[1]["content"] if b["type"] == "thinking"]
    assert blocks == [{"type": "thinking", "thinking": reasoning_for("why"),
                       "signature": signature_for(reasoning_for("why"))}]


def test_thinking_stream(gateway):
    with client(gateway) as c:
        chunks = list(c.models.generate_content_stream(model=ANTHROPIC_MODEL,
                                                       contents="[[think]] why"))
    parts = [p for ch in chunks for p in ch.candidates[0].content.parts]
    assert "".join(p.text or "" for p in parts if p.thought) == reasoning_for("why")
    assert any(p.thought_signature for p in parts)
    assert "".join(p.text or "" for p in parts if not p.thought) == "echo: why"


def test_count_tokens(gateway, upstream_model):
    with client(gateway) as c:
        short = c.models.count_tokens(model=upstream_model, contents="hi")
        long = c.models.count_tokens(model=upstream_model, contents="hi " * 400)
    assert 0 < short.total_tokens < long.total_tokens


@pytest.mark.parametrize("version", ["v1beta", "v1"])
def test_models(gateway, version):
    with client(gateway, version=version) as c:
        names = [m.name for m in c.models.list()]
        one = c.models.get(model=OPENAI_MODEL)
    assert f"models/{OPENAI_MODEL}" in names and f"models/{ANTHROPIC_MODEL}" in names
    assert one.name == f"models/{OPENAI_MODEL}"
    assert "generateContent" in one.supported_actions


def test_bad_input_names_the_field(gateway):
    with client(gateway) as c, pytest.raises(errors.ClientError) as caught:
        c.models.generate_content(model=OPENAI_MODEL, contents="hi",
                                  config=types.GenerateContentConfig(candidate_count=2))
    assert caught.value.code == 400
    assert caught.value.status == "INVALID_ARGUMENT"
    assert "generationConfig.candidateCount" in caught.value.message


def test_unknown_model_is_not_found(gateway):
    with client(gateway) as c, pytest.raises(errors.ClientError) as caught:
        c.models.generate_content(model="no-such-model", contents="hi")
    assert caught.value.code == 404 and caught.value.status == "NOT_FOUND"


def test_wrong_key_is_refused_in_googles_shape(gateway):
    with client(gateway, key="sk-wrong") as c, pytest.raises(errors.ClientError) as caught:
        c.models.generate_content(model=OPENAI_MODEL, contents="hi")
    assert caught.value.code == 401 and caught.value.status == "UNAUTHENTICATED"
    assert "sk-wrong" not in caught.value.message


def test_error_mid_stream_is_a_google_error(gateway, upstream_model):
    """The upstream fails after five frames (OpenAI: a rate limit; Anthropic:
    overloaded): the SDK raises the Google error it got in the stream, after
    the text sent before it."""
    texts = []
    with client(gateway) as c, pytest.raises(errors.APIError) as caught:
        for chunk in c.models.generate_content_stream(model=upstream_model,
                                                      contents="a b c d e f g [[fail-after:5]]"):
            texts.append(chunk.text)
    assert texts  # it did fail mid-stream
    expected = (429, "RESOURCE_EXHAUSTED") if upstream_model == OPENAI_MODEL else (
        503, "UNAVAILABLE")
    assert (caught.value.code, caught.value.status) == expected


# --- raw HTTP: the key in the query, the JSON-array stream, existing /v1 routes ---------

def test_key_in_query_and_json_array_stream(gateway):
    url = f"{gateway.url}/v1beta/models/{OPENAI_MODEL}:streamGenerateContent"
    body = {"contents": [{"parts": [{"text": "x y"}]}]}
    with structlog.testing.capture_logs() as logs:
        refused = httpx.post(url, params={"key": "sk-wrong-secret"}, json=body)
        answer = httpx.post(url, params={"key": CLIENT_KEY, "alt": "json"}, json=body)
    assert refused.status_code == 401
    assert refused.json()["error"]["status"] == "UNAUTHENTICATED"
    # the key in the query string is logged nowhere
    assert logs and "sk-wrong-secret" not in repr(logs) and CLIENT_KEY not in repr(logs)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("application/json")
    chunks = answer.json()
    assert "".join(p.get("text", "") for ch in chunks
                   for p in ch["candidates"][0]["content"]["parts"]) == "echo: x y"
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"


def test_openai_and_anthropic_model_listing_unchanged(gateway):
    auth = {"authorization": f"Bearer {CLIENT_KEY}"}
    openai_list = httpx.get(f"{gateway.url}/v1/models", headers=auth).json()
    assert openai_list["object"] == "list"
    google_list = httpx.get(f"{gateway.url}/v1/models",
                            headers={"x-goog-api-key": CLIENT_KEY}).json()
    assert f"models/{OPENAI_MODEL}" in [m["name"] for m in google_list["models"]]
    # a Google key header is no key to the OpenAI routes
    refused = httpx.post(f"{gateway.url}/v1/chat/completions",
                         headers={"x-goog-api-key": CLIENT_KEY},
                         json={"model": OPENAI_MODEL, "messages": []})
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"


def test_unknown_gemini_paths_answer_in_googles_shape(gateway):
    headers = {"x-goog-api-key": CLIENT_KEY}
    missing = httpx.get(f"{gateway.url}/v1beta/files", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
    other = httpx.post(f"{gateway.url}/v1beta/models/{OPENAI_MODEL}:embedContent",
                       headers=headers, json={})
    assert other.status_code in (404, 405)
    assert other.json()["error"]["code"] == other.status_code
    not_json = httpx.post(f"{gateway.url}/v1beta/models/{OPENAI_MODEL}:generateContent",
                          headers=headers, content=b"{nope")
    assert not_json.status_code == 400
    assert not_json.json()["error"]["status"] == "INVALID_ARGUMENT"
