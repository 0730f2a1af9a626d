"""A real poolgate on 127.0.0.1 in front of fake OpenAI and Anthropic upstreams."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.upstreams import FakeUpstream
from tests.support.server import ServerThread

CLIENT_KEY = "sk-team-a"
ADMIN_TOKEN = "admin-secret-token"
METRICS_TOKEN = "metrics-secret-token"
UPSTREAM_KEY = "sk-upstream-secret"

OPENAI_MODEL = "gpt-4o-mini"      # served by the OpenAI-dialect upstream
ANTHROPIC_MODEL = "claude-sonnet-4-6"  # served by the Anthropic-dialect upstream
SLOW_MODEL = "slow-model"         # an OpenAI upstream with a short first-byte timeout


@dataclass
class Gateway:
    url: str
    app: Any
    fake: FakeUpstream

    @property
    def openai_base(self) -> str:
        return self.url + "/v1"

    @property
    def state(self) -> Any:
        return self.app.state.gateway


def gateway_settings(fake: FakeUpstream, **server: Any) -> Settings:
    server_settings = {"api_keys": {"team-a": CLIENT_KEY, "team-b": "sk-team-b"},
                       "admin_token": ADMIN_TOKEN, "metrics_token": METRICS_TOKEN,
                       "max_body_bytes": 2 * 1024 * 1024, **server}
    return Settings(
        server=ServerSettings(**server_settings),
        workers=(
            WorkerSettings(name="openai-up", dialect="openai", url=fake.url,
                           api_key=UPSTREAM_KEY, models=(OPENAI_MODEL,),
                           aliases={"fast": OPENAI_MODEL}),
            WorkerSettings(name="anthropic-up", dialect="anthropic", url=fake.anthropic_url,
                           api_key=UPSTREAM_KEY, models=(ANTHROPIC_MODEL,)),
            WorkerSettings(name="slow-up", dialect="openai", url=fake.url,
                           api_key=UPSTREAM_KEY, models=(SLOW_MODEL,), first_byte_timeout=1.0,
                           idle_timeout=1.0),
        ),
    )


@pytest.fixture(scope="session")
def fake_upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=UPSTREAM_KEY,
                      models=(OPENAI_MODEL, ANTHROPIC_MODEL, SLOW_MODEL)) as fake:
        yield fake


@pytest.fixture(scope="session")
def gateway(fake_upstream: FakeUpstream) -> Iterator[Gateway]:
    app = create_app(gateway_settings(fake_upstream))
    with ServerThread(app) as server:
        yield Gateway(server.url, app, fake_upstream)


@pytest.fixture(params=[OPENAI_MODEL, ANTHROPIC_MODEL], ids=["to-openai", "to-anthropic"])
def upstream_model(request: pytest.FixtureRequest) -> str:
    """Each test using this runs against both upstream dialects."""
    return request.param
