"""``item_reference`` input items (what the Vercel AI SDK sends back for earlier
assistant output by default) resolved from the stored responses, through a
real poolgate with the real openai SDK, over both upstream dialects."""

from __future__ import annotations

import json

import openai
import pytest

from .conftest import CLIENT_KEY, OPENAI_MODEL

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@pytest.fixture
def client(gateway):
    with openai.OpenAI(base_url=gateway.openai_base, api_key=CLIENT_KEY, max_retries=0) as c:
        yield c


@pytest.fixture
def other_client(gateway):
    with openai.OpenAI(base_url=gateway.openai_base, api_key="sk-team-b", max_retries=0) as c:
        yield c


def user(text: str) -> dict:
    return {"role": "user", "content": text}


@pytest.mark.parametrize("stream", [False, True])
def test_assistant_message_by_reference(client, gateway, upstream_model, stream):
    first = client.responses.create(model=upstream_model, input="first question")
    message = next(item for item in first.output if item.type == "message")
    kwargs = dict(model=upstream_model, input=[
        user("first question"), {"type": "item_reference", "id": message.id},
        user("second question")])
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        assert events[-1].type == "response.completed"
        second = events[-1].response
    else:
        second = client.responses.create(**kwargs)
    assert second.output_text == "echo: second question"
    # the upstream saw the referenced answer as the assistant's turn, in place
    sent = json.dumps(gateway.fake.last.body)
    assert sent.index("first question") < sent.index("echo: first question") \
        < sent.index("second question")
    assert "item_reference" not in sent
    # what was stored is the resolved item: input_items lists it, not the reference
    items = [i.model_dump(warnings=False) for i in client.responses.input_items.list(second.id, order="asc")]
    assert [i["type"] for i in items] == ["message", "message", "message"]
    assert items[1]["id"] == message.id and items[1]["role"] == "assistant"


def test_function_call_by_reference(client, upstream_model):
    first = client.responses.create(model=upstream_model, tools=[WEATHER],
                                    input='weather? [[tool:get_weather {"city": "Oslo"}]]')
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(model=upstream_model, tools=[WEATHER], input=[
        user('weather? [[tool:get_weather {"city": "Oslo"}]]'),
        {"type": "item_reference", "id": call.id},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Cold, -3C"}])
    assert second.output_text == "tool said: Cold, -3C"


def test_unknown_reference_is_404_naming_it(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=OPENAI_MODEL, input=[
            user("x"), {"type": "item_reference", "id": "msg_nothere"}])
    assert "msg_nothere" in err.value.body["message"]
    assert err.value.body["param"] == "input[1].id"
    assert err.value.body["code"] == "item_not_found"


def test_another_keys_item_is_not_found_like_an_unknown_one(client, other_client):
    first = client.responses.create(model=OPENAI_MODEL, input="mine")
    mine = first.output[0].id
    with pytest.raises(openai.NotFoundError) as theirs:
        other_client.responses.create(model=OPENAI_MODEL, input=[
            user("x"), {"type": "item_reference", "id": mine}])
    with pytest.raises(openai.NotFoundError) as unknown:
        other_client.responses.create(model=OPENAI_MODEL, input=[
            user("x"), {"type": "item_reference", "id": mine + "0"}])
    assert theirs.value.body == {**unknown.value.body,
                                 "message": unknown.value.body["message"].replace(mine + "0",
                                                                                  mine)}
    # the owner still resolves it
    again = client.responses.create(model=OPENAI_MODEL, input=[
        user("mine"), {"type": "item_reference", "id": mine}, user("more")])
    assert again.output_text == "echo: more"


def test_deleted_response_takes_its_items_with_it(client):
    first = client.responses.create(model=OPENAI_MODEL, input="short lived")
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=OPENAI_MODEL, input=[
            {"type": "item_reference", "id": first.output[0].id}, user("x")])


def test_reference_without_an_id_is_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=OPENAI_MODEL, input=[user("x"), {"type": "item_reference"}])
    assert err.value.body["param"] == "input[1].id"
