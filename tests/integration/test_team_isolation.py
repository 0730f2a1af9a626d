"""Isolation between API keys: a stored response belongs to the key that made
it, and affinity bindings are per key. Real uvicorn, the real openai SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

from .conftest import CLIENT_KEY, OPENAI_MODEL, UPSTREAM_KEY

TEAM_B_KEY = "sk-team-b"  # the second key of the shared gateway (conftest)
TEAM_C_KEY = "sk-team-c"
UNKNOWN = "resp_0000000000000000deadbeef"


def _client(gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.openai_base, api_key=key, max_retries=0)


@pytest.fixture
def teams(gateway):
    with _client(gateway, CLIENT_KEY) as a, _client(gateway, TEAM_B_KEY) as b:
        yield a, b


def _not_found_body(exc: openai.NotFoundError, response_id: str) -> dict:
    """The error body with the id replaced, to compare two ids' answers."""
    body = exc.response.json()
    body["error"]["message"] = body["error"]["message"].replace(response_id, "<id>")
    return body


def _unknown(call, response_id: str = UNKNOWN) -> dict:
    with pytest.raises(openai.NotFoundError) as info:
        call(response_id)
    return _not_found_body(info.value, response_id)


def test_another_keys_response_is_not_found_like_an_unknown_id(teams):
    a, b = teams
    mine = a.responses.create(model=OPENAI_MODEL, input="team a secret plans")
    assert a.responses.retrieve(mine.id).output_text == "echo: team a secret plans"

    for call in (b.responses.retrieve, b.responses.input_items.list, b.responses.delete):
        assert _unknown(call, mine.id) == _unknown(call), call
    # b's delete did nothing: a still has it, with its input items
    assert a.responses.retrieve(mine.id).id == mine.id
    items = a.responses.input_items.list(mine.id)
    assert [i.content[0].text for i in items.data] == ["team a secret plans"]


def test_previous_response_id_of_another_key_is_not_found(teams):
    a, b = teams
    mine = a.responses.create(model=OPENAI_MODEL, input="remember the number 42")

    def follow(previous: str) -> None:
        b.responses.create(model=OPENAI_MODEL, input="what was the number?",
                           previous_response_id=previous)

    theirs = _unknown(follow, mine.id)
    assert theirs == _unknown(follow)
    assert theirs["error"]["param"] == "previous_response_id"
    # the owner continues its own chain
    second = a.responses.create(model=OPENAI_MODEL, input="and again",
                                previous_response_id=mine.id)
    assert second.output_text == "echo: and again"


def test_owner_deletes_and_then_nobody_finds_it(teams):
    a, b = teams
    mine = a.responses.create(model=OPENAI_MODEL, input="short lived")
    assert a.responses.delete(mine.id) is None
    for client in (a, b):
        assert _unknown(client.responses.retrieve, mine.id) == _unknown(client.responses.retrieve)


def test_stream_stored_response_belongs_to_its_key(teams):
    a, b = teams
    events = list(a.responses.create(model=OPENAI_MODEL, input="streamed and stored",
                                     stream=True))
    response_id = events[-1].response.id
    assert a.responses.retrieve(response_id).output_text == "echo: streamed and stored"
    assert _unknown(b.responses.retrieve, response_id) == _unknown(b.responses.retrieve)


@pytest.fixture
def affinity_gateway(fake_upstream):
    """Two workers for one model, so the affinity policy decides; two keys."""
    workers = tuple(WorkerSettings(name=f"w{i}", dialect="openai", models=("m",),
                                   api_key=UPSTREAM_KEY, url=fake_upstream.url)
                    for i in range(2))
    app = create_app(Settings(server=ServerSettings(
        api_keys={"team-a": CLIENT_KEY, "team-b": TEAM_B_KEY, "team-c": TEAM_C_KEY}),
        workers=workers))
    with ServerThread(app) as srv:
        yield srv.url, app.state.gateway


def test_three_keys_with_one_session_id_get_three_bindings(affinity_gateway):
    url, gw = affinity_gateway
    body = {"model": "m", "messages": [{"role": "user", "content": "same conversation"}]}
    session = {"x-session-id": "shared-session-1"}

    def ask(key: str) -> httpx.Response:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30,
                       headers={"authorization": f"Bearer {key}", **session})
        assert r.status_code == 200, r.text
        return r

    teams = (CLIENT_KEY, TEAM_B_KEY, TEAM_C_KEY)
    for key in teams:
        ask(key)
    stats = gw.stats()["routing"]["default"]
    # each team's first turn is a new binding, not a hit on another team's
    assert (stats["binds"], stats["hits"]) == (3, 0)
    assert gw.bindings.stats()["items"] == 3
    for key in teams:
        ask(key)
    stats = gw.stats()["routing"]["default"]
    assert (stats["binds"], stats["hits"]) == (3, 3)


def test_with_auth_off_everyone_is_anonymous_and_shares(fake_upstream):
    workers = tuple(WorkerSettings(name=f"w{i}", dialect="openai", models=("m",),
                                   api_key=UPSTREAM_KEY, url=fake_upstream.url)
                    for i in range(2))
    app = create_app(Settings(workers=workers))
    with ServerThread(app) as srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="any",
                                                 max_retries=0) as first, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="other", max_retries=0) as second:
        made = first.responses.create(model="m", input="open gateway")
        assert second.responses.retrieve(made.id).id == made.id
