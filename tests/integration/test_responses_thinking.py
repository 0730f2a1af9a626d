"""Responses ``reasoning.effort`` to an Anthropic upstream: a thinking budget
goes up, the thinking comes back as ``reasoning`` items whose signature rides
in ``encrypted_content`` and returns to the upstream byte for byte (the fake
refuses a thinking block whose signature is not the one it gave). Real
uvicorn, the real openai SDK, a fake Anthropic upstream that records bodies
(and checks signatures, for these tests)."""

from __future__ import annotations

import openai
import pytest

from tests.fakes.scripted import signature_for

from .conftest import ANTHROPIC_MODEL, CLIENT_KEY

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@pytest.fixture
def client(gateway):
    gateway.fake.check_thinking = True
    try:
        with openai.OpenAI(base_url=gateway.openai_base, api_key=CLIENT_KEY,
                           max_retries=0) as c:
            yield c
    finally:
        gateway.fake.check_thinking = False


@pytest.mark.parametrize("effort, budget, max_tokens", [
    ("low", 1024, 1024 + 4096), ("medium", 4096, 4096 + 4096), ("high", 16384, 16384 + 4096),
    ("minimal", None, 4096), ("none", None, 4096)])
def test_effort_becomes_a_thinking_budget(client, gateway, effort, budget, max_tokens):
    client.responses.create(model=ANTHROPIC_MODEL, input="hi", reasoning={"effort": effort})
    sent = gateway.fake.last.body
    assert sent["max_tokens"] == max_tokens
    assert sent.get("thinking") == (None if budget is None
                                    else {"type": "enabled", "budget_tokens": budget})


def test_a_client_cap_holds_and_keeps_room_for_the_answer(client, gateway):
    client.responses.create(model=ANTHROPIC_MODEL, input="hi", reasoning={"effort": "high"},
                            max_output_tokens=6000)
    sent = gateway.fake.last.body
    assert sent["max_tokens"] == 6000
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 3000}


def _reasoning_of(response):
    return next(item for item in response.output if item.type == "reasoning")


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_round_trip(client, gateway, stream):
    kwargs = dict(model=ANTHROPIC_MODEL, tools=[WEATHER], reasoning={"effort": "medium"},
                  input='[[think]] weather? [[tool:get_weather {"city": "Rome"}]]')
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        types = [e.type for e in events]
        assert "response.reasoning_summary_text.delta" in types
        assert types[-1] == "response.completed"
        first = events[-1].response
    else:
        first = client.responses.create(**kwargs)
    reasoning = _reasoning_of(first)
    thought = reasoning.summary[0].text
    assert thought.startswith("Thinking about:")
    assert signature_for(thought) in reasoning.encrypted_content
    call = next(item for item in first.output if item.type == "function_call")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Hot"}

    # the client sends the items back itself (store=false: nothing to look up)
    second = client.responses.create(
        model=ANTHROPIC_MODEL, tools=[WEATHER], reasoning={"effort": "medium"}, store=False,
        input=[{"role": "user", "content": "weather?"},
               *(item.model_dump(exclude_none=True) for item in first.output), result])
    assert second.output_text == "tool said: Hot"
    assistant = gateway.fake.last.body["messages"][1]
    assert assistant["content"][0] == {"type": "thinking", "thinking": thought,
                                       "signature": signature_for(thought)}
    assert assistant["content"][1]["type"] == "tool_use"

    # and by previous_response_id: the stored items
    third = client.responses.create(model=ANTHROPIC_MODEL, tools=[WEATHER],
                                    reasoning={"effort": "medium"},
                                    previous_response_id=first.id, input=[result])
    assert third.output_text == "tool said: Hot"
    assert gateway.fake.last.body["messages"][1]["content"][0]["signature"] == \
        signature_for(thought)


def test_a_tampered_signature_is_the_upstreams_400(client):
    first = client.responses.create(model=ANTHROPIC_MODEL, input="[[think]] hmm",
                                    reasoning={"effort": "low"})
    item = _reasoning_of(first).model_dump(exclude_none=True)
    item["encrypted_content"] = item["encrypted_content"][:-4] + "AAAA"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=ANTHROPIC_MODEL, store=False, input=[
            {"role": "user", "content": "hmm"}, item, {"role": "user", "content": "more"}])


def test_a_chat_client_tool_loop_with_effort_keeps_working(gateway):
    """A Chat Completions client cannot send the signed thinking back, and
    Anthropic refuses thinking on a tool-use turn without it: the effort (a
    hint) gives way on that turn rather than failing it."""
    gateway.fake.check_thinking = True
    try:
        with openai.OpenAI(base_url=gateway.openai_base, api_key=CLIENT_KEY,
                           max_retries=0) as chat:
            tools = [{"type": "function", "function": {
                "name": WEATHER["name"], "parameters": WEATHER["parameters"]}}]
            asked = [{"role": "user",
                      "content": '[[think]] weather? [[tool:get_weather {"city": "Rome"}]]'}]
            first = chat.chat.completions.create(model=ANTHROPIC_MODEL, messages=asked,
                                                 tools=tools, reasoning_effort="high")
            assert gateway.fake.last.body["thinking"]["budget_tokens"] == 16384
            call = first.choices[0].message.tool_calls[0]
            second = chat.chat.completions.create(
                model=ANTHROPIC_MODEL, tools=tools, reasoning_effort="high",
                messages=[*asked, first.choices[0].message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "Hot"}])
    finally:
        gateway.fake.check_thinking = False
    assert second.choices[0].message.content == "tool said: Hot"
    assert "thinking" not in gateway.fake.last.body
