"""Keys have an immutable id that owns what they create: a deleted key's
stored responses are deleted with it, a new key with an old name inherits
nothing (responses, usage, budget), and ``anonymous`` cannot be created."""

from __future__ import annotations

import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

from .conftest import ADMIN_TOKEN, OPENAI_MODEL, UPSTREAM_KEY

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def gateway(fake_upstream, tmp_path):
    settings = Settings(server=ServerSettings(admin_token=ADMIN_TOKEN, state_dir=str(tmp_path)),
                        workers=(WorkerSettings(name="openai-up", dialect="openai",
                                                url=fake_upstream.url, api_key=UPSTREAM_KEY,
                                                models=(OPENAI_MODEL,)),))
    app = create_app(settings)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        yield srv.url, http, app.state.gateway


def _client(url: str, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=secret, max_retries=0)


def _create(http: httpx.Client, name: str, **policy) -> dict:
    r = http.post("/internal/keys", headers=ADMIN, json={"name": name, **policy})
    assert r.status_code == 201, r.text
    return r.json()


def test_anonymous_cannot_be_created(gateway):
    _, http, _ = gateway
    r = http.post("/internal/keys", headers=ADMIN, json={"name": "anonymous"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "name" and "anonymous" in r.json()["error"]["message"]


def test_a_new_key_with_an_old_name_inherits_nothing(gateway):
    url, http, gw = gateway
    first = _create(http, "team-x", budget_tokens={"day": 1_000_000})
    with _client(url, first["secret"]) as client:
        stored = client.responses.create(model=OPENAI_MODEL, input="remember me", store=True)
        assert client.responses.retrieve(stored.id).id == stored.id
    assert gw.responses.stats()["items"] == 1

    assert http.delete("/internal/keys/team-x", headers=ADMIN).status_code == 200
    assert gw.responses.stats()["items"] == 0  # the key's stored responses went with it

    second = _create(http, "team-x", budget_tokens={"day": 1_000_000})
    assert second["id"] != first["id"]
    assert second["usage_today"] == {"requests": 0, "input_tokens": 0, "output_tokens": 0}
    with _client(url, second["secret"]) as client:
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(stored.id)
        client.responses.create(model=OPENAI_MODEL, input="again", store=False)
    listed = {k["name"]: k for k in http.get("/internal/keys", headers=ADMIN).json()["keys"]}
    assert listed["team-x"]["id"] == second["id"]
    assert listed["team-x"]["usage_today"]["requests"] == 1  # only its own request
    by_id = http.get("/internal/usage", headers=ADMIN,
                     params={"group_by": "key"}).json()["rows"]
    assert sorted((r["key"], r["key_id"], r["requests"]) for r in by_id) == sorted(
        [("team-x", first["id"], 1), ("team-x", second["id"], 1)])


def test_after_a_restart_budgets_count_the_keys_id_not_its_name(fake_upstream, tmp_path):
    """Budgets start at the ledger's totals of the key's id: a key made under a
    used-up key's name starts at zero, also after a restart."""
    settings = Settings(server=ServerSettings(admin_token=ADMIN_TOKEN, state_dir=str(tmp_path)),
                        workers=(WorkerSettings(name="openai-up", dialect="openai",
                                                url=fake_upstream.url, api_key=UPSTREAM_KEY,
                                                models=(OPENAI_MODEL,)),))
    budget = {"budget_tokens": {"day": 5}}  # one answer uses it up
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        old = _create(http, "team-b", **budget)["secret"]
        with _client(srv.url, old) as client:
            client.chat.completions.create(model=OPENAI_MODEL,
                                           messages=[{"role": "user", "content": "hi"}])
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        with _client(srv.url, old) as client, pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model=OPENAI_MODEL,  # seeded from the ledger
                                           messages=[{"role": "user", "content": "hi"}])
        assert http.delete("/internal/keys/team-b", headers=ADMIN).status_code == 200
        new = _create(http, "team-b", **budget)["secret"]
    with ServerThread(create_app(settings)) as srv:
        with _client(srv.url, new) as client:
            reply = client.chat.completions.create(
                model=OPENAI_MODEL, messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "echo: hi"
