"""A conversation whose account is out moves to another account and goes on.

Two remote Anthropic workers, one per account (two API keys of one fake
vendor that, like the real API, signs thinking per account and refuses a
block another account signed: "Invalid `signature` in `thinking` block").
The conversation starts on one account; that account then stops being
eligible (it is drained, or it hits its rate limit: the vendor's 429 with a
reset); the next turn must go to the other account and succeed, its
history carrying none of the first account's signed thinking, its binding
moved, no slot left in flight. Real uvicorn, the real anthropic and openai
SDKs (Responses with ``previous_response_id``)."""

from __future__ import annotations

import time

from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.scripted import signature_for
from tests.fakes.upstreams import FakeUpstream
from tests.support.server import ServerThread

KEY = "sk-client"
ADMIN = "admin-token-moves"
MODEL = "claude-moving"
ACCOUNTS = {"acct-a": "sk-ant-account-a", "acct-b": "sk-ant-account-b"}
WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture
def moving() -> Iterator[Any]:
    with FakeUpstream(api_keys=tuple(ACCOUNTS.values()), models=(MODEL,)) as fake:
        fake.check_thinking = True
        settings = Settings(
            server=ServerSettings(api_keys={"team": KEY}, admin_token=ADMIN),
            workers=tuple(WorkerSettings(name=name, dialect="anthropic", url=fake.anthropic_url,
                                         api_key=key, models=(MODEL,))
                          for name, key in ACCOUNTS.items()))
        app = create_app(settings)
        with ServerThread(app) as server:
            yield server, fake, app.state.gateway


@pytest.fixture
def ant(moving) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=moving[0].url, api_key=KEY, max_retries=0) as client:
        yield client


@pytest.fixture
def oai(moving) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=moving[0].url + "/v1", api_key=KEY, max_retries=0) as client:
        yield client


def _other(name: str) -> str:
    return next(n for n in ACCOUNTS if n != name)


def _account_out(server: Any, fake: FakeUpstream, name: str, how: str) -> None:
    if how == "drained":
        reply = httpx.post(f"{server.url}/internal/workers/{name}/drain",
                           headers={"authorization": f"Bearer {ADMIN}"})
        assert reply.status_code == 200, reply.text
    else:  # the vendor's 429 with a reset, from the next request on
        fake.limit(ACCOUNTS[name], 30)


def _thinking_sent(fake: FakeUpstream) -> list[dict[str, Any]]:
    return [block for message in fake.last.body["messages"] if message["role"] == "assistant"
            for block in message["content"] if block.get("type") == "thinking"]


def _idle(gateway: Any) -> None:
    # a stream's slot is released once the server has sent its last byte, which
    # may be just after the client read it: wait a little, never forever
    deadline = time.monotonic() + 5
    while any(gateway.pool.in_flight.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(n == 0 for n in gateway.pool.in_flight.values()), gateway.pool.in_flight


@pytest.mark.parametrize("how", ["drained", "rate_limited"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_conversation_moves_and_keeps_going(moving, ant, how, stream):
    server, fake, gateway = moving
    client = ant
    session = {"x-session-id": f"conv-{how}-{stream}"}
    think = {"type": "enabled", "budget_tokens": 1024}
    asked = [{"role": "user", "content": "[[think]] hello there"}]

    def turn(messages: list[dict[str, Any]]) -> tuple[str, Any]:
        if stream:
            with client.messages.stream(model=MODEL, max_tokens=2048, thinking=think,
                                        messages=messages, extra_headers=session) as s:
                message = s.get_final_message()
                return s.response.headers["x-poolgate-worker"], message
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=2048, thinking=think, messages=messages,
            extra_headers=session)
        return raw.headers["x-poolgate-worker"], raw.parse()

    first_worker, first = turn(asked)
    signed = first.content[0]
    assert signed.type == "thinking"
    assert signed.signature == signature_for(signed.thinking, ACCOUNTS[first_worker])

    _account_out(server, fake, first_worker, how)
    history = [*asked, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
               {"role": "user", "content": "[[think]] and then?"}]
    second_worker, second = turn(history)
    assert second_worker == _other(first_worker)
    assert second.content[-1].text == "echo: and then?"
    assert _thinking_sent(fake) == []  # the first account's signed block stayed home

    # the conversation lives on its new account now: its own thinking goes back
    history += [{"role": "assistant", "content": [b.model_dump() for b in second.content]},
                {"role": "user", "content": "[[think]] once more"}]
    third_worker, _ = turn(history)
    assert third_worker == second_worker
    sent = _thinking_sent(fake)
    assert [b["signature"] for b in sent] == [second.content[0].signature]
    _idle(gateway)


def test_a_tool_loop_moves_with_its_thinking_left_behind(moving, ant):
    """The signed thinking of a tool-use turn is what Anthropic demands back
    with thinking on; on another account it cannot go, so that one turn runs
    without thinking (as the API allows) rather than failing."""
    server, fake, gateway = moving
    client = ant
    think = {"type": "enabled", "budget_tokens": 1024}
    asked = [{"role": "user", "content": '[[think]] weather? [[tool:get_weather {"city": "Rome"}]]'}]
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=2048, thinking=think,
                                                   tools=[WEATHER], messages=asked)
    first_worker, first = raw.headers["x-poolgate-worker"], raw.parse()
    call = next(b for b in first.content if b.type == "tool_use")
    _account_out(server, fake, first_worker, "rate_limited")
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=2048, thinking=think, tools=[WEATHER], messages=[
            *asked, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                          "content": "Hot"}]}])
    assert raw.headers["x-poolgate-worker"] == _other(first_worker)
    assert raw.parse().content[-1].text == "tool said: Hot"
    assert _thinking_sent(fake) == []
    assert "thinking" not in fake.last.body
    _idle(gateway)


@pytest.mark.parametrize("how", ["drained", "rate_limited"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_previous_response_id_chain_moves_and_keeps_going(moving, oai, how, stream):
    server, fake, gateway = moving
    client = oai
    if stream:  # the first turn streamed: its signature is noted as it goes out
        with client.responses.with_streaming_response.create(
                model=MODEL, input="[[think]] hi", reasoning={"effort": "low"},
                stream=True) as raw:
            first_worker = raw.headers["x-poolgate-worker"]
            events = list(raw.parse())
        first = events[-1].response
    else:
        raw = client.responses.with_raw_response.create(model=MODEL, input="[[think]] hi",
                                                        reasoning={"effort": "low"})
        first_worker, first = raw.headers["x-poolgate-worker"], raw.parse()
    reasoning = next(item for item in first.output if item.type == "reasoning")
    assert ACCOUNTS and reasoning.encrypted_content.endswith(
        signature_for(reasoning.summary[0].text, ACCOUNTS[first_worker]))

    _account_out(server, fake, first_worker, how)
    raw = client.responses.with_raw_response.create(
        model=MODEL, previous_response_id=first.id, input="[[think]] more",
        reasoning={"effort": "low"})
    second_worker, second = raw.headers["x-poolgate-worker"], raw.parse()
    assert second_worker == _other(first_worker)
    assert second.output_text == "echo: more"
    assert _thinking_sent(fake) == []

    third = client.responses.with_raw_response.create(
        model=MODEL, previous_response_id=second.id, input="[[think]] again",
        reasoning={"effort": "low"})
    assert third.headers["x-poolgate-worker"] == second_worker
    assert third.parse().output_text == "echo: again"
    own = next(item for item in second.output if item.type == "reasoning")
    assert [b["signature"] for b in _thinking_sent(fake)] == [
        own.encrypted_content.split(":", 1)[1]]
    _idle(gateway)


def test_a_responses_tool_loop_moves_with_its_thinking_left_behind(moving, oai):
    """The translated path: the stored reasoning item of the tool-use turn is
    left behind, and that one turn runs without thinking on the new account."""
    server, fake, gateway = moving
    client = oai
    tool = {"type": "function", "name": "get_weather", "description": "Weather for a city",
            "parameters": WEATHER["input_schema"]}
    raw = client.responses.with_raw_response.create(
        model=MODEL, tools=[tool], reasoning={"effort": "low"},
        input='[[think]] weather? [[tool:get_weather {"city": "Rome"}]]')
    first_worker, first = raw.headers["x-poolgate-worker"], raw.parse()
    call = next(item for item in first.output if item.type == "function_call")
    _account_out(server, fake, first_worker, "rate_limited")
    raw = client.responses.with_raw_response.create(
        model=MODEL, tools=[tool], reasoning={"effort": "low"}, previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Hot"}])
    assert raw.headers["x-poolgate-worker"] == _other(first_worker)
    assert raw.parse().output_text == "tool said: Hot"
    assert _thinking_sent(fake) == [] and "thinking" not in fake.last.body
    _idle(gateway)
