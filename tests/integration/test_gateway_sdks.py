"""The real openai and anthropic SDKs, sync and async, streaming and not,
through a real poolgate to both upstream dialects."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from tests.fakes.upstreams import reasoning_for, signature_for
from tests.support.sdk_clients import closed_at_end

from .conftest import ANTHROPIC_MODEL, CLIENT_KEY, OPENAI_MODEL


def oai(gateway) -> openai.OpenAI:
    return closed_at_end(openai.OpenAI(base_url=gateway.openai_base, api_key=CLIENT_KEY,
                                       max_retries=0))


def aoai(gateway) -> openai.AsyncOpenAI:
    """Use as ``async with``: an async client must close on its own loop."""
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=CLIENT_KEY, max_retries=0)


def ant(gateway) -> anthropic.Anthropic:
    return closed_at_end(anthropic.Anthropic(base_url=gateway.url, api_key=CLIENT_KEY,
                                             max_retries=0))


def aant(gateway) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gateway.url, api_key=CLIENT_KEY, max_retries=0)


WEATHER_TOOL_OPENAI = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
WEATHER_TOOL_ANTHROPIC = {"name": "get_weather", "description": "Weather for a city",
                          "input_schema": {"type": "object",
                                           "properties": {"city": {"type": "string"}},
                                           "required": ["city"]}}


# --- OpenAI clients -------------------------------------------------------------------

def test_openai_sync_non_stream(gateway, upstream_model):
    resp = oai(gateway).chat.completions.with_raw_response.create(
        model=upstream_model, messages=[{"role": "user", "content": "hello there"}])
    completion = resp.parse()
    assert completion.choices[0].message.content == "echo: hello there"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == upstream_model
    assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    assert resp.headers["x-poolgate-worker"] in ("openai-up", "anthropic-up")
    assert resp.headers["x-request-id"]


def test_openai_sync_stream_with_usage(gateway, upstream_model):
    stream = oai(gateway).chat.completions.create(
        model=upstream_model, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "one two three four"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: one two three four"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


async def test_openai_async_stream_helper(gateway, upstream_model):
    async with aoai(gateway) as client:
        async with client.chat.completions.stream(
                model=upstream_model, messages=[{"role": "user", "content": "async words"}]) as s:
            final = await s.get_final_completion()
    assert final.choices[0].message.content == "echo: async words"


def test_openai_max_tokens_and_stop(gateway, upstream_model):
    client = oai(gateway)
    cut = client.chat.completions.create(
        model=upstream_model, max_tokens=2,
        messages=[{"role": "user", "content": "a b c d e f"}])
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.content.split() == ["echo:", "a"]
    stopped = client.chat.completions.create(
        model=upstream_model, stop=["c"], messages=[{"role": "user", "content": "a b c d"}])
    assert stopped.choices[0].finish_reason == "stop"
    assert "d" not in stopped.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_openai_tool_round_trip(gateway, upstream_model, stream):
    client = oai(gateway)
    messages = [{"role": "user", "content": 'weather? [[tool:get_weather {"city": "Paris"}]]'}]
    if stream:
        with client.chat.completions.stream(model=upstream_model, messages=messages,
                                            tools=[WEATHER_TOOL_OPENAI]) as s:
            first = s.get_final_completion()
    else:
        first = client.chat.completions.create(model=upstream_model, messages=messages,
                                               tools=[WEATHER_TOOL_OPENAI])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21C"}]
    second = client.chat.completions.create(model=upstream_model, messages=messages,
                                            tools=[WEATHER_TOOL_OPENAI])
    assert second.choices[0].message.content == "tool said: Sunny, 21C"
    sent = gateway.fake.last.body
    # the upstream saw the call and its result, in its own dialect
    assert json.dumps(sent).count(call.id) >= 2


def test_openai_parallel_tool_calls(gateway, upstream_model):
    out = oai(gateway).chat.completions.create(
        model=upstream_model, tools=[WEATHER_TOOL_OPENAI],
        messages=[{"role": "user", "content":
                   '[[tool:get_weather {"city": "A"}]] [[tool:get_weather {"city": "B"}]]'}])
    calls = out.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["A", "B"]
    assert len({c.id for c in calls}) == 2


def test_openai_alias_resolves(gateway):
    out = oai(gateway).chat.completions.create(
        model="fast", messages=[{"role": "user", "content": "alias"}])
    assert out.choices[0].message.content == "echo: alias"
    assert gateway.fake.last.body["model"] == OPENAI_MODEL


def test_openai_image_part_reaches_upstream(gateway, upstream_model):
    data = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    oai(gateway).chat.completions.create(model=upstream_model, messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}])
    assert data in json.dumps(gateway.fake.last.body)


# --- Anthropic clients -------------------------------------------------------------------

def test_anthropic_sync_non_stream(gateway, upstream_model):
    msg = ant(gateway).messages.create(
        model=upstream_model, max_tokens=64, system="be kind",
        messages=[{"role": "user", "content": "hello claude"}])
    assert msg.content[0].text == "echo: hello claude"
    assert msg.stop_reason == "end_turn"
    assert msg.usage.output_tokens > 0


def test_anthropic_sync_stream(gateway, upstream_model):
    with ant(gateway).messages.stream(
            model=upstream_model, max_tokens=64,
            messages=[{"role": "user", "content": "streamed words here"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "echo: streamed words here"
    assert final.stop_reason == "end_turn"


async def test_anthropic_async_stream_and_create(gateway, upstream_model):
    async with aant(gateway) as client:
        async with client.messages.stream(model=upstream_model, max_tokens=64,
                                          messages=[{"role": "user", "content": "async"}]) as s:
            final = await s.get_final_message()
        msg = await client.messages.create(model=upstream_model, max_tokens=64,
                                           messages=[{"role": "user", "content": "plain"}])
    assert final.content[0].text == "echo: async"
    assert msg.content[0].text == "echo: plain"


def test_anthropic_max_tokens_and_stop_sequence(gateway, upstream_model):
    client = ant(gateway)
    cut = client.messages.create(model=upstream_model, max_tokens=2,
                                 messages=[{"role": "user", "content": "a b c d"}])
    assert cut.stop_reason == "max_tokens"
    stopped = client.messages.create(model=upstream_model, max_tokens=64, stop_sequences=["c"],
                                     messages=[{"role": "user", "content": "a b c d"}])
    assert stopped.stop_reason in ("stop_sequence", "end_turn")
    if upstream_model == ANTHROPIC_MODEL:
        assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "c"


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_round_trip(gateway, upstream_model, stream):
    client = ant(gateway)
    messages = [{"role": "user", "content": 'weather? [[tool:get_weather {"city": "Oslo"}]]'}]
    kwargs = dict(model=upstream_model, max_tokens=256, tools=[WEATHER_TOOL_ANTHROPIC])
    if stream:
        with client.messages.stream(messages=messages, **kwargs) as s:
            first = s.get_final_message()
    else:
        first = client.messages.create(messages=messages, **kwargs)
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input == {"city": "Oslo"}
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": "Cloudy, 9C"}]}]
    second = client.messages.create(messages=messages, **kwargs)
    assert second.content[0].text == "tool said: Cloudy, 9C"
    assert json.dumps(gateway.fake.last.body).count(use.id) >= 2


def test_anthropic_thinking_signature_byte_for_byte(gateway):
    client = ant(gateway)
    first = client.messages.create(model=ANTHROPIC_MODEL, max_tokens=2048,
                                   thinking={"type": "enabled", "budget_tokens": 1024},
                                   messages=[{"role": "user", "content": "deep [[think]]"}])
    thinking = first.content[0]
    assert thinking.type == "thinking"
    assert thinking.thinking == reasoning_for("deep")
    assert thinking.signature == signature_for(thinking.thinking)
    client.messages.create(model=ANTHROPIC_MODEL, max_tokens=2048,
                           thinking={"type": "enabled", "budget_tokens": 1024},
                           messages=[{"role": "user", "content": "deep [[think]]"},
                                     {"role": "assistant",
                                      "content": [b.model_dump() for b in first.content]},
                                     {"role": "user", "content": "again"}])
    sent_back = gateway.fake.last.body["messages"][1]["content"][0]
    assert sent_back["signature"] == thinking.signature


def test_anthropic_stream_thinking(gateway):
    with ant(gateway).messages.stream(
            model=ANTHROPIC_MODEL, max_tokens=2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": "ponder [[think]]"}]) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking"
    assert final.content[0].signature == signature_for(final.content[0].thinking)
    assert final.content[1].text == "echo: ponder"


def test_openai_client_sees_anthropic_reasoning(gateway):
    out = oai(gateway).chat.completions.create(
        model=ANTHROPIC_MODEL, messages=[{"role": "user", "content": "why [[think]]"}])
    message = out.choices[0].message
    assert message.content == "echo: why"
    assert message.model_extra["reasoning_content"] == reasoning_for("why")


# --- models -----------------------------------------------------------------------------

def test_models_openai_shape(gateway):
    ids = [m.id for m in oai(gateway).models.list()]
    assert {OPENAI_MODEL, ANTHROPIC_MODEL, "fast"} <= set(ids)
    assert oai(gateway).models.retrieve("fast").id == "fast"


def test_models_anthropic_shape(gateway):
    page = ant(gateway).models.list()
    ids = [m.id for m in page.data]
    assert ANTHROPIC_MODEL in ids and page.has_more is False
    assert page.data[0].type == "model"
    assert ant(gateway).models.retrieve(ANTHROPIC_MODEL).display_name == ANTHROPIC_MODEL
    with pytest.raises(anthropic.NotFoundError):
        ant(gateway).models.retrieve("nope")


# --- legacy completions and token counting ---------------------------------------------

def test_legacy_completions(gateway, upstream_model):
    client = oai(gateway)
    out = client.completions.create(model=upstream_model, prompt="complete me", max_tokens=16)
    assert out.choices[0].text == "echo: complete me"
    assert out.object == "text_completion"
    chunks = list(client.completions.create(model=upstream_model, prompt="stream me",
                                            max_tokens=16, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "echo: stream me"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=upstream_model, prompt="x", echo=True)
    assert err.value.body["param"] == "echo"


def test_count_tokens_exact_from_anthropic_upstream_and_estimated_otherwise(gateway):
    client = ant(gateway)
    messages = [{"role": "user", "content": "count these words please"}]
    exact = client.messages.with_raw_response.count_tokens(
        model=ANTHROPIC_MODEL, messages=messages, system="sys")
    assert exact.headers["x-poolgate-token-count"] == "exact"
    assert gateway.fake.last.path == "/v1/messages/count_tokens"
    assert exact.parse().input_tokens > 0
    estimate = client.messages.with_raw_response.count_tokens(
        model=OPENAI_MODEL, messages=messages, tools=[WEATHER_TOOL_ANTHROPIC])
    assert estimate.headers["x-poolgate-token-count"] == "estimate"
    bigger = client.messages.count_tokens(
        model=OPENAI_MODEL, messages=[{"role": "user", "content": "count these words please " * 50}],
        tools=[WEATHER_TOOL_ANTHROPIC])
    assert bigger.input_tokens > estimate.parse().input_tokens > 0
    # a model nobody serves still gets an estimate, never a 404
    assert client.messages.count_tokens(model="claude-unknown", messages=messages).input_tokens > 0


def test_legacy_completions_several_prompts(gateway, upstream_model):
    client = oai(gateway)
    out = client.completions.create(model=upstream_model, prompt=["first one", "second one"],
                                    max_tokens=16)
    assert [(c.index, c.text) for c in out.choices] == [(0, "echo: first one"),
                                                       (1, "echo: second one")]
    assert out.usage.completion_tokens >= 6
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=upstream_model, prompt=["a", "b"], stream=True)
    assert err.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=upstream_model, prompt=[1, 2, 3])
    assert err.value.body["param"] == "prompt"
