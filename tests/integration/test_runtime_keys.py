"""API keys managed at run time through ``/internal/keys``, used with the real SDKs."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.key_settings import KeySettings
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

from .conftest import ADMIN_TOKEN, ANTHROPIC_MODEL, OPENAI_MODEL, UPSTREAM_KEY

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
ENTRY = {"name", "id", "source", "models", "max_in_flight", "rpm", "tpm", "budget_tokens",
         "usage_today"}


def _workers(fake) -> tuple[WorkerSettings, ...]:
    return (WorkerSettings(name="openai-up", dialect="openai", url=fake.url,
                           api_key=UPSTREAM_KEY, models=(OPENAI_MODEL,)),
            WorkerSettings(name="anthropic-up", dialect="anthropic", url=fake.anthropic_url,
                           api_key=UPSTREAM_KEY, models=(ANTHROPIC_MODEL,)))


@pytest.fixture
def gateway(fake_upstream):
    settings = Settings(server=ServerSettings(
        api_keys={"plain": "sk-plain"}, keys={"team-a": KeySettings(secret="sk-a", rpm=100)},
        admin_token=ADMIN_TOKEN), workers=_workers(fake_upstream))
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        yield srv.url, http


def _ask(url: str, secret: str, model: str = OPENAI_MODEL) -> str:
    with openai.OpenAI(base_url=url + "/v1", api_key=secret, max_retries=0) as client:
        r = client.chat.completions.create(model=model,
                                           messages=[{"role": "user", "content": "hi"}])
    return r.choices[0].message.content


def test_create_use_list_patch_delete(gateway):
    url, http = gateway
    r = http.post("/internal/keys", headers=ADMIN,
                  json={"name": "team-c", "models": ["claude-*"], "max_in_flight": 2,
                        "budget_tokens": {"day": 100000}})
    assert r.status_code == 201, r.text
    made = r.json()
    secret = made.pop("secret")
    assert secret.startswith("sk-pg-") and len(secret) > 30
    assert made.pop("id").startswith("key:")
    assert made == {"name": "team-c", "source": "runtime", "models": ["claude-*"],
                    "max_in_flight": 2, "rpm": None, "tpm": None,
                    "budget_tokens": {"day": 100000, "month": None},
                    "usage_today": {"requests": 0, "input_tokens": 0, "output_tokens": 0}}

    with anthropic.Anthropic(base_url=url, api_key=secret, max_retries=0) as client:
        reply = client.messages.create(model=ANTHROPIC_MODEL, max_tokens=20,
                                       messages=[{"role": "user", "content": "hello"}])
    assert reply.content[0].text == "echo: hello"
    with pytest.raises(openai.NotFoundError):
        _ask(url, secret)  # outside its models

    listed = http.get("/internal/keys", headers=ADMIN)
    assert secret not in listed.text and "sk-a" not in listed.text
    keys = {k["name"]: k for k in listed.json()["keys"]}
    assert list(keys) == ["plain", "team-a", "team-c"]
    assert all(set(k) == ENTRY for k in keys.values())
    assert keys["plain"]["source"] == "config" and keys["plain"]["models"] is None
    assert keys["team-a"]["rpm"] == 100 and keys["team-a"]["budget_tokens"] is None
    today = keys["team-c"]["usage_today"]
    assert today["requests"] == 2 and today["input_tokens"] > 0 and today["output_tokens"] > 0

    patched = http.patch("/internal/keys/team-c", headers=ADMIN, json={"rpm": 2, "models": None})
    assert patched.status_code == 200
    body = patched.json()
    assert body["rpm"] == 2 and body["models"] is None and body["max_in_flight"] == 2
    assert body["budget_tokens"] == {"day": 100000, "month": None}
    # any model now; the minute already counts the Anthropic request (the
    # refused model was not counted): one more, then the limit
    assert _ask(url, secret) == "echo: hi"
    with pytest.raises(openai.RateLimitError):
        _ask(url, secret)

    assert http.delete("/internal/keys/team-c", headers=ADMIN).json() == {
        "name": "team-c", "deleted": True}
    with pytest.raises(openai.AuthenticationError):
        _ask(url, secret)
    with openai.OpenAI(base_url=url + "/v1", api_key=secret, max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model=OPENAI_MODEL, stream=True,
                                           messages=[{"role": "user", "content": "hi"}])
    assert [k["name"] for k in http.get("/internal/keys", headers=ADMIN).json()["keys"]] == [
        "plain", "team-a"]
    assert http.delete("/internal/keys/team-c", headers=ADMIN).status_code == 404


def test_config_keys_are_read_only_and_bad_input_is_named(gateway):
    _, http = gateway
    for name in ("plain", "team-a"):
        r = http.patch(f"/internal/keys/{name}", headers=ADMIN, json={"rpm": 5})
        assert r.status_code == 409 and r.json()["error"]["code"] == "key_read_only"
        assert http.delete(f"/internal/keys/{name}", headers=ADMIN).status_code == 409
    assert _ask(http.base_url.__str__().rstrip("/"), "sk-a") == "echo: hi"
    r = http.post("/internal/keys", headers=ADMIN, json={"name": "team-a"})
    assert r.status_code == 409 and r.json()["error"]["param"] == "name"
    cases = [({"name": "bad name"}, "name"), ({"name": "x", "rpm": "10"}, "rpm"),
             ({"name": "x", "rpm": 0}, "rpm"), ({"name": "x", "budget_tokens": {"week": 1}},
                                                "budget_tokens.week"),
             ({"name": "x", "models": [""]}, "models"), ({"name": "x", "secret": "mine"},
                                                         "secret")]
    for body, param in cases:
        r = http.post("/internal/keys", headers=ADMIN, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    assert http.patch("/internal/keys/nobody", headers=ADMIN, json={}).status_code == 404
    r = http.post("/internal/keys", json={"name": "x"})
    assert r.status_code == 401
    assert [k["name"] for k in http.get("/internal/keys", headers=ADMIN).json()["keys"]] == [
        "plain", "team-a"]


def test_first_run_time_key_closes_an_open_gateway(fake_upstream):
    settings = Settings(server=ServerSettings(admin_token=ADMIN_TOKEN),
                        workers=_workers(fake_upstream))
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        assert _ask(srv.url, "anything") == "echo: hi"  # auth off
        secret = http.post("/internal/keys", headers=ADMIN, json={"name": "only"}).json()["secret"]
        assert _ask(srv.url, secret) == "echo: hi"
        with pytest.raises(openai.AuthenticationError):
            _ask(srv.url, "anything")
        http.delete("/internal/keys/only", headers=ADMIN)
        with pytest.raises(openai.AuthenticationError):
            _ask(srv.url, secret)  # deleting the last key does not open it again


def test_a_drawn_secret_that_another_key_holds_is_drawn_again(gateway, monkeypatch):
    """The gateway draws every run-time secret: a clash (forced here by a CSPRNG
    that repeats itself) gets a new secret, and neither the answer nor the keys
    it identifies ever change hands."""
    import secrets as stdlib_secrets

    draws = iter(["repeated-draw", "repeated-draw", "fresh-draw"])
    monkeypatch.setattr(stdlib_secrets, "token_urlsafe", lambda n=None: next(draws))
    url, http = gateway
    first = http.post("/internal/keys", headers=ADMIN, json={"name": "team-x"})
    second = http.post("/internal/keys", headers=ADMIN, json={"name": "team-y"})
    assert (first.status_code, second.status_code) == (201, 201), second.text
    x, y = first.json()["secret"], second.json()["secret"]
    assert x == "sk-pg-repeated-draw" and y == "sk-pg-fresh-draw"
    assert "team-x" not in second.text
    usage = http.get("/internal/keys", headers=ADMIN).json()["keys"]
    assert {k["name"] for k in usage} >= {"team-x", "team-y"}
    assert _ask(url, x) and _ask(url, y)
    with httpx.Client(base_url=url, timeout=30) as client:
        for secret, name in ((x, "team-x"), (y, "team-y")):
            r = client.delete(f"/internal/keys/{name}", headers=ADMIN)
            assert r.status_code in (200, 204), r.text
            gone = client.post("/v1/chat/completions", headers={"authorization": f"Bearer {secret}"},
                               json={"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "hi"}]})
            assert gone.status_code == 401, (name, gone.status_code)
