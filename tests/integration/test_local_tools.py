"""Tool calls from a local model, both ways, in both dialects: the trained tiny
model (it answers tool prompts with ``<tool_call>{json}</tool_call>``) on each
CPU engine behind a real gateway, driven by the real SDKs."""

from __future__ import annotations

import json
from typing import Any, Iterator

import anthropic
import openai
import pytest

from app.factory import create_app
from app.settings import load_settings
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris today?"}]


@pytest.fixture(scope="module", params=["transformers", "llamacpp"])
def srv(request: pytest.FixtureRequest, tiny_model_trained: Any) -> Iterator[ServerThread]:
    engine = request.param
    model = tiny_model_trained.gguf if engine == "llamacpp" else tiny_model_trained.hf_dir
    settings = load_settings(None, {}, {"workers": [
        {"name": engine, "kind": "local", "engine": engine, "model": model, "models": ["tiny"],
         "threads": 1, "capacity": 2, "context_length": 1024}]})
    with ServerThread(create_app(settings)) as server:
        yield server


def test_a_plain_turn_ends_with_the_end_of_turn_token(srv: ServerThread) -> None:
    client = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0))
    r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=64, temperature=0)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content and "<|im_end|>" not in r.choices[0].message.content


def test_openai_tool_call_and_result_round_trip(srv: ServerThread) -> None:
    client = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0))
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=64,
                                       temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert isinstance(json.loads(call.function.arguments), dict)
    assert "<tool_call>" not in (choice.message.content or "")

    stream = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER],
                                            max_tokens=64, temperature=0, stream=True)
    names, args, finish = [], "", None
    for chunk in stream:
        for delta_call in chunk.choices[0].delta.tool_calls or []:
            if delta_call.function.name:
                names.append(delta_call.function.name)
            args += delta_call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"] and json.loads(args) == json.loads(call.function.arguments)
    assert finish == "tool_calls"

    # the result goes back: the template renders it as a <tool_response> turn
    follow = client.chat.completions.create(model="tiny", max_tokens=32, temperature=0, tools=[WEATHER],
                                            messages=[*ASK, choice.message.model_dump(exclude_none=True),
                                                      {"role": "tool", "tool_call_id": call.id,
                                                       "content": "Sunny, 21 C"}])
    assert follow.usage.prompt_tokens > r.usage.prompt_tokens


def test_anthropic_tool_use(srv: ServerThread) -> None:
    claude = closed_at_end(anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0))
    tool = {"name": "get_weather", "description": "The weather of a city.",
            "input_schema": WEATHER["function"]["parameters"]}
    m = claude.messages.create(model="tiny", max_tokens=64, messages=ASK, tools=[tool],
                               extra_body={"temperature": 0})
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input, dict)


def test_a_named_tool_choice_forces_the_call(srv: ServerThread) -> None:
    client = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0))
    lookup = {"type": "function", "function": {"name": "lookup_user", "parameters": {
        "type": "object", "properties": {"user_id": {"type": "string"}}}}}
    r = client.chat.completions.create(
        model="tiny", max_tokens=64, temperature=0, tools=[WEATHER, lookup],
        tool_choice={"type": "function", "function": {"name": "lookup_user"}},
        messages=[{"role": "user", "content": "hello"}])
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "lookup_user"
    assert isinstance(json.loads(call.function.arguments), dict)
