"""The Responses API through poolgate with the real openai SDK, over a chat
upstream and an Anthropic upstream; stored responses and their chains."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from .conftest import ANTHROPIC_MODEL, CLIENT_KEY, OPENAI_MODEL

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}


@pytest.fixture
def client(gateway):
    with openai.OpenAI(base_url=gateway.openai_base, api_key=CLIENT_KEY, max_retries=0) as c:
        yield c


def test_create_non_stream(client, upstream_model):
    resp = client.responses.create(model=upstream_model, input="hello responses",
                                   instructions="be brief")
    assert resp.status == "completed"
    assert resp.output_text == "echo: hello responses"
    assert resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0
    assert resp.output[0].type == "message"


def test_create_stream_events_in_order(client, upstream_model):
    events = list(client.responses.create(model=upstream_model, input="stream me please",
                                          stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert sum(t in ("response.completed", "response.failed", "response.incomplete")
               for t in types) == 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "echo: stream me please"
    assert events[-1].response.output_text == text


def test_stream_helper(client, upstream_model):
    with client.responses.stream(model=upstream_model, input="helper words") as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == "echo: helper words"


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_is_incomplete(client, upstream_model, stream):
    kwargs = dict(model=upstream_model, input="a b c d e f", max_output_tokens=2)
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        assert events[-1].type == "response.incomplete"
        final = events[-1].response
    else:
        final = client.responses.create(**kwargs)
    assert final.status == "incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"


def test_function_call_round_trip_with_previous_response_id(client, upstream_model, gateway):
    first = client.responses.create(
        model=upstream_model, tools=[WEATHER],
        input='weather? [[tool:get_weather {"city": "Rome"}]]')
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Rome"}
    second = client.responses.create(
        model=upstream_model, tools=[WEATHER], previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Hot, 30C"}])
    assert second.output_text == "tool said: Hot, 30C"
    assert second.previous_response_id == first.id
    # the upstream saw the whole conversation rebuilt from the store
    sent = json.dumps(gateway.fake.last.body)
    assert "weather?" in sent and call.call_id in sent
    # and the previous turn's worker served this one
    assert gateway.fake.last.path == ("/v1/chat/completions" if upstream_model == OPENAI_MODEL
                                      else "/v1/messages")


@pytest.mark.parametrize("stream", [False, True])
def test_custom_tool_round_trip(client, upstream_model, stream):
    kwargs = dict(model=upstream_model, tools=[PATCH],
                  input='patch it [[tool:apply_patch {"input": "*** Begin Patch"}]]')
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        types = [e.type for e in events]
        assert "response.custom_tool_call_input.done" in types
        first = events[-1].response
    else:
        first = client.responses.create(**kwargs)
    call = next(item for item in first.output if item.type == "custom_tool_call")
    assert call.name == "apply_patch" and call.input == "*** Begin Patch"
    second = client.responses.create(
        model=upstream_model, tools=[PATCH], previous_response_id=first.id,
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"}])
    assert second.output_text == "tool said: Done!"


def test_retrieve_delete_and_input_items(client, upstream_model):
    first = client.responses.create(model=upstream_model, input="turn one")
    second = client.responses.create(model=upstream_model, input="turn two",
                                     previous_response_id=first.id)
    assert client.responses.retrieve(second.id).output_text == "echo: turn two"
    items = list(client.responses.input_items.list(second.id, order="asc", limit=1))
    # earlier turns of the chain are included, oldest first, across pages
    texts = [json.dumps(i.model_dump()) for i in items]
    assert len(items) == 3
    assert "turn one" in texts[0] and "echo: turn one" in texts[1] and "turn two" in texts[2]
    newest_first = client.responses.input_items.list(second.id)
    assert "turn two" in json.dumps(newest_first.data[0].model_dump())
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(second.id)


def test_store_false_keeps_nothing(client):
    resp = client.responses.create(model=OPENAI_MODEL, input="forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)


def test_unknown_previous_response_is_404_naming_it(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=OPENAI_MODEL, input="x", previous_response_id="resp_nope")
    assert err.value.body["param"] == "previous_response_id"


def test_forcing_a_hosted_tool_is_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=OPENAI_MODEL, input="x", tools=[{"type": "web_search"}],
                                tool_choice={"type": "web_search"})
    assert err.value.body["param"] == "tool_choice"


def test_bad_pagination_params(gateway, client):
    resp = client.responses.create(model=OPENAI_MODEL, input="page")
    with httpx.Client(base_url=gateway.url,
                      headers={"authorization": f"Bearer {CLIENT_KEY}"}) as http:
        r = http.get(f"/v1/responses/{resp.id}/input_items", params={"limit": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
        r = http.get(f"/v1/responses/{resp.id}/input_items", params={"order": "up"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "order"


@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
def test_failure_mid_stream_is_one_failed_event(client, model):
    events = list(client.responses.create(model=model, stream=True,
                                          input="[[die-after:3]] a b c d e"))
    types = [e.type for e in events]
    assert types[-1] == "response.failed" and "response.completed" not in types
    assert events[-1].response.status == "failed"
    assert events[-1].response.error.message


def test_failed_stream_terminal_event_raw(gateway):
    with httpx.Client(base_url=gateway.url,
                      headers={"authorization": f"Bearer {CLIENT_KEY}"}) as http:
        r = http.post("/v1/responses", json={"model": OPENAI_MODEL, "stream": True,
                                             "input": "[[truncate-after:2]] a b c"})
    events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert events[-1] == "response.failed"
    assert sum(e in ("response.completed", "response.failed", "response.incomplete")
               for e in events) == 1


async def test_200_concurrent_stored_responses(gateway):
    async with openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=CLIENT_KEY,
                                  max_retries=0) as client:
        made = await asyncio.gather(*(client.responses.create(model=OPENAI_MODEL, input=f"n{i}")
                                      for i in range(200)))
        got = await asyncio.gather(*(client.responses.retrieve(r.id) for r in made))
    assert [g.output_text for g in got] == [f"echo: n{i}" for i in range(200)]
    assert len({r.id for r in made}) == 200
    stats = gateway.state.responses.stats()
    assert stats["items"] <= stats["max_items"]
