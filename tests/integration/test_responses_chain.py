"""Issue 15 item 8 through a real gateway and the openai SDK: stored chains
cost what each turn adds, one key's long chain does not evict another key's
responses, and a chain with a missing link is refused, never shortened."""

from __future__ import annotations

import openai
import pytest

from app.factory import create_app
from app.settings import ResponsesSettings
from tests.support.server import ServerThread

from .conftest import CLIENT_KEY, OPENAI_MODEL, gateway_settings

TEXT = "a turn of a long agent session " * 20


@pytest.fixture
def small_store(fake_upstream):
    settings = gateway_settings(fake_upstream).model_copy(
        update={"responses": ResponsesSettings(max_items=10_000, max_bytes=64 * 1024)})
    with ServerThread(create_app(settings)) as server:
        yield server.url + "/v1"


def test_a_long_chain_does_not_evict_another_keys_response(small_store):
    with openai.OpenAI(base_url=small_store, api_key=CLIENT_KEY, max_retries=0) as team_a, \
            openai.OpenAI(base_url=small_store, api_key="sk-team-b", max_retries=0) as codex:
        kept = team_a.responses.create(model=OPENAI_MODEL, input="remember me")
        previous, turns = None, 0
        with pytest.raises(openai.NotFoundError) as caught:
            for turns in range(200):  # ~1.5 KiB a turn of its own: the chain outgrows the store
                previous = codex.responses.create(model=OPENAI_MODEL, input=f"{turns} {TEXT}",
                                                  previous_response_id=previous).id
        assert turns > 20
        # the long chain lost its own first turn: continuing it is refused, clearly
        assert caught.value.body["param"] == "previous_response_id"
        assert caught.value.body["code"] == "response_chain_broken"
        # and the other key's response was not pushed out by it
        assert team_a.responses.retrieve(kept.id).output_text == "echo: remember me"


def test_a_deleted_middle_turn_breaks_the_chain(gateway):
    with openai.OpenAI(base_url=gateway.openai_base, api_key=CLIENT_KEY, max_retries=0) as c:
        first = c.responses.create(model=OPENAI_MODEL, input="one")
        second = c.responses.create(model=OPENAI_MODEL, input="two",
                                    previous_response_id=first.id)
        third = c.responses.create(model=OPENAI_MODEL, input="three",
                                   previous_response_id=second.id)
        items = [i.id for i in c.responses.input_items.list(third.id, order="asc")]
        assert len(items) == 5  # one, its answer, two, its answer, three
        c.responses.delete(second.id)
        with pytest.raises(openai.NotFoundError) as caught:
            c.responses.create(model=OPENAI_MODEL, input="four", previous_response_id=third.id)
        assert second.id in caught.value.body["message"]
        with pytest.raises(openai.NotFoundError):
            c.responses.input_items.list(third.id)
        assert c.responses.retrieve(third.id).id == third.id  # the response itself is still there
