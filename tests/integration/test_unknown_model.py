"""A model nobody serves (Claude Code 2.1.33x asks for ``claude-opus-5-5`` by
default): the 404 says which models the caller's key may use, in the OpenAI
and the Anthropic dialect, capped; and a glob alias maps such names onto a
served model. Real uvicorn, the real openai and anthropic SDKs."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.key_settings import KeySettings
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

from .conftest import ANTHROPIC_MODEL, OPENAI_MODEL, UPSTREAM_KEY

MANY = tuple(f"m-{i:02d}" for i in range(25))
CLAUDE_CODE_DEFAULT = "claude-opus-5-5"


def _settings(fake, **anthropic_worker) -> Settings:
    return Settings(
        server=ServerSettings(api_keys={"plain": "sk-plain"},
                              keys={"claude-only": KeySettings(secret="sk-claude-only",
                                                               models=("claude-*",))}),
        workers=(WorkerSettings(name="openai-up", dialect="openai", url=fake.url,
                                api_key=UPSTREAM_KEY, models=(OPENAI_MODEL,),
                                aliases={"fast": OPENAI_MODEL}),
                 WorkerSettings(name="anthropic-up", dialect="anthropic",
                                url=fake.anthropic_url, api_key=UPSTREAM_KEY,
                                models=(ANTHROPIC_MODEL,), **anthropic_worker),
                 WorkerSettings(name="many-up", dialect="openai", url=fake.url,
                                api_key=UPSTREAM_KEY, models=MANY)))


@pytest.fixture(scope="module")
def url(fake_upstream):
    with ServerThread(create_app(_settings(fake_upstream))) as srv:
        yield srv.url


def test_openai_dialect_lists_the_served_models_capped(url):
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-plain", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as err:
            client.chat.completions.create(model=CLAUDE_CODE_DEFAULT,
                                           messages=[{"role": "user", "content": "hi"}])
    body = err.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    message = body["message"]
    assert f"'{CLAUDE_CODE_DEFAULT}'" in message
    # configuration order, the first 20 of 28 names, then how many more
    listed = [OPENAI_MODEL, "fast", ANTHROPIC_MODEL, *MANY[:17]]
    assert ", ".join(listed) in message
    assert MANY[17] not in message and "and 8 more" in message


def test_anthropic_dialect_lists_only_what_the_key_may_use(url):
    with anthropic.Anthropic(base_url=url, api_key="sk-claude-only", max_retries=0) as client:
        with pytest.raises(anthropic.NotFoundError) as err:
            client.messages.create(model=CLAUDE_CODE_DEFAULT, max_tokens=50,
                                   messages=[{"role": "user", "content": "hi"}])
        assert err.value.body["type"] == "error"
        message = err.value.body["error"]["message"]
        assert CLAUDE_CODE_DEFAULT in message and ANTHROPIC_MODEL in message
        assert OPENAI_MODEL not in message and "m-00" not in message
        # a served model outside the key's list: the same 404, the same list
        with pytest.raises(anthropic.NotFoundError) as outside:
            client.messages.create(model=OPENAI_MODEL, max_tokens=50,
                                   messages=[{"role": "user", "content": "hi"}])
        assert outside.value.body["error"]["message"] == message.replace(CLAUDE_CODE_DEFAULT,
                                                                         OPENAI_MODEL)


def test_responses_and_model_lookup_say_it_too(url):
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-claude-only", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as err:
            client.responses.create(model="gpt-5", input="hi")
        assert ANTHROPIC_MODEL in err.value.body["message"]
        assert OPENAI_MODEL not in err.value.body["message"]
    r = httpx.get(url + "/v1/models/gpt-5", headers={"authorization": "Bearer sk-plain"})
    assert r.status_code == 404 and OPENAI_MODEL in r.json()["error"]["message"]


def test_a_glob_alias_serves_claude_codes_default(fake_upstream):
    app = create_app(_settings(fake_upstream, aliases={"claude-*": ANTHROPIC_MODEL}))
    with ServerThread(app) as srv:
        with anthropic.Anthropic(base_url=srv.url, api_key="sk-claude-only",
                                 max_retries=0) as client:
            answer = client.messages.create(model=CLAUDE_CODE_DEFAULT, max_tokens=50,
                                            messages=[{"role": "user", "content": "hi"}])
    assert answer.content[0].text == "echo: hi"
    assert fake_upstream.last.body["model"] == ANTHROPIC_MODEL
