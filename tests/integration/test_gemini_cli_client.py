"""The real Gemini CLI 0.61.0 (npm, in .cache/npm-gemini) as a *client* of a
real poolgate's Gemini dialect (``GOOGLE_GEMINI_BASE_URL`` = poolgate,
``GEMINI_API_KEY`` = a poolgate key), over a fake OpenAI, a fake Anthropic and
a fake Gemini upstream: a turn, and a round trip of one of the CLI's own tools
(``read_file`` of a file in its cwd)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.gemini_upstream import FakeGemini
from tests.fakes.upstreams import FakeUpstream
from tests.integration.clis import GEMINI_CLI, GEMINI_PREFIX, ensure_cli, run_gemini
from tests.support.server import ServerThread

pytestmark = [pytest.mark.cli, pytest.mark.slow]

CLIENT_KEY = "sk-gemini-cli-client"
UPSTREAM_KEY = "sk-upstream-secret"
OPENAI_MODEL, ANTHROPIC_MODEL = "gpt-4o-mini", "claude-sonnet-4-6"
GEMINI_MODEL = "gemini-fake-flash"
# a Gemini model name mapped to Claude: the CLI asks it for thinking (and its sampling)
ALIASED = "gemini-2.5-flash"
MODELS = [OPENAI_MODEL, ANTHROPIC_MODEL, ALIASED, GEMINI_MODEL]
IDS = ["to-openai", "to-anthropic", "aliased-to-anthropic", "same-dialect"]


class Upstreams:
    def __init__(self, fake: FakeUpstream, gemini: FakeGemini, url: str) -> None:
        self.fake, self.gemini, self.url = fake, gemini, url

    def bodies(self, model: str) -> list[dict]:
        """What the upstream serving ``model`` was asked, in order."""
        if model == GEMINI_MODEL:
            return [body for path, body in self.gemini.requests if "enerateContent" in path]
        model = ANTHROPIC_MODEL if model == ALIASED else model
        return [r.body for r in self.fake.requests if r.body and r.body.get("model") == model]


@pytest.fixture(scope="module")
def gemini_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Gemini CLI")
    path = ensure_cli(*GEMINI_CLI, prefix=GEMINI_PREFIX)
    assert path is not None
    return path


@pytest.fixture(scope="module")
def upstreams(gemini_bin: str) -> Iterator[Upstreams]:
    with FakeUpstream(api_key=UPSTREAM_KEY, models=(OPENAI_MODEL, ANTHROPIC_MODEL)) as fake, \
            FakeGemini(api_key=UPSTREAM_KEY, models=(GEMINI_MODEL,)) as gemini:
        fake.check_thinking = True  # the CLI asks for thinking: refused as the real API would
        settings = Settings(server=ServerSettings(api_keys={"team": CLIENT_KEY}), workers=(
            WorkerSettings(name="openai-up", dialect="openai", url=fake.url,
                           api_key=UPSTREAM_KEY, models=(OPENAI_MODEL,)),
            WorkerSettings(name="anthropic-up", dialect="anthropic", url=fake.anthropic_url,
                           api_key=UPSTREAM_KEY, models=(ANTHROPIC_MODEL,),
                           aliases={ALIASED: ANTHROPIC_MODEL}),
            WorkerSettings(name="gemini-up", dialect="gemini", url=gemini.url,
                           api_key=UPSTREAM_KEY, models=(GEMINI_MODEL,)),
        ))
        with ServerThread(create_app(settings)) as server:
            yield Upstreams(fake, gemini, server.url)


def _text(events: list[dict]) -> str:
    return "".join(e["content"] for e in events
                   if e.get("type") == "message" and e.get("role") == "assistant")


def _result(events: list[dict]) -> dict:
    results = [e for e in events if e.get("type") == "result"]
    assert results, events
    return results[-1]


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_a_turn(upstreams: Upstreams, tmp_path: Path, model: str) -> None:
    before = len(upstreams.bodies(model))
    events = run_gemini(upstreams.url, CLIENT_KEY, "hello from the gemini cli", model=model,
                        cwd=tmp_path, home=tmp_path / "home")
    assert _text(events) == "echo: hello from the gemini cli"
    result = _result(events)
    assert result["status"] == "success"
    assert result["stats"]["output_tokens"] > 0 and result["stats"]["input_tokens"] > 0
    sent = upstreams.bodies(model)[before:]
    assert len(sent) == 1
    # the CLI's system prompt and tool declarations reached the upstream, translated or not
    assert "Gemini CLI" in json.dumps(sent[0])
    assert "read_file" in json.dumps(sent[0])


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_a_tool_round_trip(upstreams: Upstreams, tmp_path: Path, model: str) -> None:
    (tmp_path / "notes.txt").write_text("the notes say 42")
    before = len(upstreams.bodies(model))
    events = run_gemini(upstreams.url, CLIENT_KEY,
                        '[[tool:read_file {"file_path": "notes.txt"}]]', model=model,
                        cwd=tmp_path, home=tmp_path / "home")
    uses = [e for e in events if e.get("type") == "tool_use"]
    assert [(u["tool_name"], u["parameters"]) for u in uses] == [
        ("read_file", {"file_path": "notes.txt"})]
    results = [e for e in events if e.get("type") == "tool_result"]
    assert [r["status"] for r in results] == ["success"]
    assert _text(events) == "tool said: the notes say 42"
    assert _result(events)["stats"]["tool_calls"] == 1
    sent = upstreams.bodies(model)[before:]
    assert len(sent) == 2
    # the second request carried the file's text back as the tool's result
    last = sent[1]
    if model == GEMINI_MODEL:
        part = last["contents"][-1]["parts"][-1]["functionResponse"]
        assert part["name"] == "read_file" and "the notes say 42" in json.dumps(part)
    elif model == OPENAI_MODEL:
        tool = last["messages"][-1]
        assert tool["role"] == "tool" and "the notes say 42" in json.dumps(tool)
    else:
        block = last["messages"][-1]["content"][-1]
        assert block["type"] == "tool_result" and "the notes say 42" in json.dumps(block)
    if model == ALIASED:  # the CLI asked for thinking: on, but not for the unsigned tool turn
        assert sent[0]["thinking"]["type"] == "enabled" and "top_k" not in sent[0]
        assert "thinking" not in sent[1]
