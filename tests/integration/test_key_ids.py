"""Keys have an immutable id that owns what they create: a deleted key's
stored responses are deleted with it, a new key with an old name inherits
nothing (responses, usage, budget), and ``anonymous`` cannot be created."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.redis_server import RedisServer
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


def test_a_budget_added_later_counts_what_the_key_already_used(gateway):
    """A key used without a budget, then patched to one it has already spent,
    is refused at once: the budget starts at the ledger's totals of its id."""
    url, http, _ = gateway
    made = _create(http, "team-late")
    with _client(url, made["secret"]) as client:
        client.chat.completions.create(model=OPENAI_MODEL,
                                       messages=[{"role": "user", "content": "hi"}])
        patched = http.patch("/internal/keys/team-late", headers=ADMIN,
                             json={"budget_tokens": {"day": 1}})
        assert patched.status_code == 200, patched.text
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model=OPENAI_MODEL,
                                           messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["code"] == "budget_exceeded"


@pytest.fixture(params=["local", "redis"])
def slots_gateway(request, fake_upstream, tmp_path):
    """A gateway counting keys' in-flight slots here, or in Redis (shared by replicas)."""
    redis = RedisServer().start() if request.param == "redis" else None
    try:
        settings = Settings(server=ServerSettings(
            admin_token=ADMIN_TOKEN, state_dir=str(tmp_path),
            redis_url=redis.url if redis is not None else None),
            workers=(WorkerSettings(name="openai-up", dialect="openai", url=fake_upstream.url,
                                    api_key=UPSTREAM_KEY, models=(OPENAI_MODEL,)),))
        app = create_app(settings)
        with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            yield srv.url, http, app.state.gateway
    finally:
        if redis is not None:
            redis.stop()


def test_a_new_key_with_an_old_name_inherits_no_slot(slots_gateway):
    """A deleted key's stream still open holds its own slot, not one of the
    new key of that name: the new key's max_in_flight is all its own."""
    url, http, gw = slots_gateway
    first = _create(http, "team-s", max_in_flight=1)
    body = {"model": OPENAI_MODEL, "stream": True,
            "messages": [{"role": "user", "content": "[[hang-after:2]] one two three four"}]}
    with http.stream("POST", "/v1/chat/completions", json=body,
                     headers={"authorization": f"Bearer {first['secret']}"}) as held:
        assert held.status_code == 200
        frames = held.iter_bytes()  # kept: a dropped iterator closes the stream
        next(frames)  # the stream is open: the old key's slot is held
        assert gw.stats()["admission"]["in_flight"] == 1
        assert http.delete("/internal/keys/team-s", headers=ADMIN).status_code == 200
        second = _create(http, "team-s", max_in_flight=1)
        with _client(url, second["secret"]) as client:
            reply = client.chat.completions.create(model=OPENAI_MODEL,
                                                   messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "echo: hi"


def test_a_request_of_a_deleted_key_ending_later_is_not_the_new_keys(gateway):
    """A request of the old key that ends after the key was deleted and made
    again under its name is the old key's: its row has the old id and its
    tokens are not charged to the new key's budget."""
    url, http, _ = gateway
    first = _create(http, "team-late-end")
    with ThreadPoolExecutor(1) as pool, _client(url, first["secret"]) as old:
        slow = pool.submit(old.chat.completions.create, model=OPENAI_MODEL,
                           messages=[{"role": "user", "content": "[[sleep:1]] slow"}])
        time.sleep(0.3)  # in flight at the upstream
        assert http.delete("/internal/keys/team-late-end", headers=ADMIN).status_code == 200
        second = _create(http, "team-late-end", budget_tokens={"day": 1})
        assert slow.result(timeout=10).choices[0].message.content == "echo: slow"
    time.sleep(0.2)  # charged as the request ends, just after its answer was sent
    with _client(url, second["secret"]) as new:  # the new key's budget is untouched
        reply = new.chat.completions.create(model=OPENAI_MODEL,
                                            messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "echo: hi"
    rows = http.get("/internal/usage", headers=ADMIN, params={"group_by": "key"}).json()["rows"]
    mine = sorted(r["key_id"] for r in rows if r["key"] == "team-late-end")
    assert mine == sorted([first["id"], second["id"]])


def test_a_request_admitted_before_max_in_flight_was_set_gives_back_no_slot(fake_upstream,
                                                                           tmp_path):
    """A request of a key admitted while it had no ``max_in_flight`` took no
    shared slot; when it ends after a PATCH set one, the slot a later request
    holds stays counted in Redis (the other replicas see it)."""
    redis = RedisServer().start()
    try:
        settings = Settings(server=ServerSettings(
            admin_token=ADMIN_TOKEN, state_dir=str(tmp_path), redis_url=redis.url),
            workers=(WorkerSettings(name="openai-up", dialect="openai", url=fake_upstream.url,
                                    api_key=UPSTREAM_KEY, models=(OPENAI_MODEL,)),))
        app = create_app(settings)
        with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            slots = app.state.gateway.teams.slots
            secret = _create(http, "team-m")["secret"]
            body = {"model": OPENAI_MODEL, "stream": True,
                    "messages": [{"role": "user", "content": "[[hang-after:2]] one two three"}]}
            auth = {"authorization": f"Bearer {secret}"}
            with http.stream("POST", "/v1/chat/completions", json=body, headers=auth) as early:
                frames = early.iter_bytes()
                next(frames)  # in flight, no slot: the key had no max_in_flight
                assert http.patch("/internal/keys/team-m", headers=ADMIN,
                                  json={"max_in_flight": 2}).status_code == 200
                with httpx.Client(base_url=srv.url, timeout=30) as other, \
                        other.stream("POST", "/v1/chat/completions", json=body,
                                     headers=auth) as late:
                    later = late.iter_bytes()
                    next(later)
                    assert slots.stats()["held"] == 1  # the late request's slot
                    early.close()  # the early request ends
                    deadline = time.monotonic() + 5
                    while app.state.gateway.stats()["admission"]["in_flight"] != 1:
                        assert time.monotonic() < deadline, "the early request never ended"
                        time.sleep(0.02)
                    time.sleep(0.1)
                    assert slots.stats()["held"] == 1, "the late request's slot was given back"
    finally:
        redis.stop()
