"""An upstream that refuses the gateway's own key (HTTP 401/403) is not the
client's 401: the client gets a 502 "upstream credentials refused" in its
dialect, another worker serves when one can, the refused worker shows as
unhealthy in /internal/workers, and no fragment of a key reaches the client
or the logs."""

from __future__ import annotations

from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest
import structlog

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.upstreams import FakeUpstream
from tests.support.server import ServerThread

from .conftest import UPSTREAM_KEY

BAD_KEY = "sk-bad-key-9f8e7d6c5b4a"
ADMIN = {"authorization": "Bearer admin-tok"}


@pytest.fixture
def served(fake_upstream: FakeUpstream) -> Iterator[str]:
    def worker(name: str, key: str, model: str, dialect: str = "openai") -> WorkerSettings:
        url = fake_upstream.url if dialect == "openai" else fake_upstream.anthropic_url
        return WorkerSettings(name=name, dialect=dialect, url=url, api_key=key, models=(model,))

    settings = Settings(
        server=ServerSettings(admin_token="admin-tok"),
        workers=(worker("solo-bad", BAD_KEY, "solo"),
                 worker("ant-bad", BAD_KEY, "claude-solo", "anthropic"),
                 worker("pair-bad", BAD_KEY, "pair"), worker("pair-good", UPSTREAM_KEY, "pair")))
    with ServerThread(create_app(settings)) as srv:
        yield srv.url


def _states(url: str) -> dict[str, str]:
    r = httpx.get(url + "/internal/workers", headers=ADMIN, timeout=10)
    return {w["name"]: w["state"] for w in r.json()["workers"]}


def _no_key_fragment(text: str) -> None:
    assert "sk-" not in text and BAD_KEY[-4:] not in text and UPSTREAM_KEY not in text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_refused_credentials_are_a_502_not_the_clients_401(served: str, stream: bool) -> None:
    with structlog.testing.capture_logs() as logs:
        r = httpx.post(served + "/v1/chat/completions", timeout=30, json={
            "model": "solo", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert err["message"] == "upstream credentials refused" and err["type"] == "api_error"
        _no_key_fragment(r.text)

        # the refused worker is out of service now: still never the client's 401
        with openai.OpenAI(base_url=served + "/v1", api_key="x", max_retries=0) as oai:
            with pytest.raises(openai.APIStatusError) as info:
                oai.chat.completions.create(model="solo", messages=[{"role": "user", "content": "x"}])
        assert info.value.status_code == 503  # out for a lasting reason, which it names
        assert "refused the gateway's credentials" in info.value.message
        assert not isinstance(info.value, (openai.AuthenticationError, openai.PermissionDeniedError))

        with anthropic.Anthropic(base_url=served, api_key="x", max_retries=0) as ant:
            with pytest.raises(anthropic.APIStatusError) as ainfo:
                ant.messages.create(model="claude-solo", max_tokens=10, stream=stream,
                                    messages=[{"role": "user", "content": "hi"}])
        assert ainfo.value.status_code == 502
        assert not isinstance(ainfo.value, anthropic.AuthenticationError)
        body = ainfo.value.response.json()
        assert body["type"] == "error" and body["error"]["message"] == "upstream credentials refused"
        _no_key_fragment(ainfo.value.response.text)
    states = _states(served)
    assert states["solo-bad"] == "unhealthy" and states["ant-bad"] == "unhealthy"
    _no_key_fragment(repr(logs))
    assert any(line["event"] == "remote.credentials_refused" for line in logs)


def test_another_worker_serves_and_the_refused_one_is_marked(served: str) -> None:
    served_by = set()
    with httpx.Client(base_url=served, timeout=30) as http:
        for i in range(12):  # different sessions: some are placed on the refused worker first
            r = http.post("/v1/chat/completions", headers={"x-session-id": f"s{i}"},
                          json={"model": "pair", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
            served_by.add(r.headers["x-poolgate-worker"])
    assert served_by == {"pair-good"}
    states = _states(served)
    assert states["pair-bad"] == "unhealthy" and states["pair-good"] == "ready"
