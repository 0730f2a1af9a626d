"""The real Claude Code and Qwen Code CLIs, from npm, complete a one-turn answer
and a tool round trip against a scripted fake upstream on 127.0.0.1.

The fake answers ``echo: <text>``; a prompt holding ``[[tool:NAME {json}]]``
makes it ask for that tool, and after the tool result it answers
``tool said: <result>``. The file the tool reads holds a random secret, so
seeing it in the fake's next request proves the CLI ran the tool itself and
sent the result back. Each run takes 1-3 s; the first one also installs the
CLIs into ``.cache/npm`` (about 15 s).
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.upstreams import FakeUpstream, Received
from tests.support.server import ServerThread
from tests.integration.clis import (
    CLAUDE_CODE,
    PINNED_VERSIONS,
    QWEN_CODE,
    CLITimeout,
    ensure_cli,
    result_event,
    run_claude,
    run_qwen,
    tool_results,
)

pytestmark = [pytest.mark.cli, pytest.mark.slow]

API_KEY = "sk-poolgate-cli-test"
CLAUDE_MODEL = "claude-opus-4-8"  # what the fixtures were recorded with
QWEN_MODEL = "qwen3-coder-plus"


class CLIGateway(NamedTuple):
    anthropic_url: str  # server root, for ANTHROPIC_BASE_URL
    openai_url: str     # ends in /v1, for OPENAI_BASE_URL
    api_key: str
    models: dict[str, str]  # client name -> model it asks for
    paths: dict[str, str]   # client name -> the upstream path its requests reach


@pytest.fixture(scope="session")
def cli_bins() -> dict[str, str]:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install the vendor CLIs")
    bins = {}
    for name, (package, bin_name) in (("claude", CLAUDE_CODE), ("qwen", QWEN_CODE)):
        path = ensure_cli(package, bin_name)
        assert path is not None
        bins[name] = path
    return bins


@pytest.fixture
def cli_upstream() -> Iterator[FakeUpstream]:
    """A fresh fake per test (so request counts are exact); named apart from
    conftest's session-wide ``fake_upstream``."""
    with FakeUpstream(api_key=API_KEY, models=(CLAUDE_MODEL, QWEN_MODEL)) as fake:
        yield fake


@pytest.fixture(params=["same-dialect", "cross-dialect"])
def cli_gateway(request: pytest.FixtureRequest, cli_bins: dict[str, str],
                cli_upstream: FakeUpstream) -> Iterator[CLIGateway]:
    """A real poolgate in front of the fake. ``same-dialect``: Claude Code's
    model behind an Anthropic upstream and Qwen's behind an OpenAI one;
    ``cross-dialect``: the other way round, so every request is translated."""
    cross = request.param == "cross-dialect"
    anthropic_models = (QWEN_MODEL,) if cross else (CLAUDE_MODEL,)
    openai_models = (CLAUDE_MODEL,) if cross else (QWEN_MODEL,)
    settings = Settings(
        server=ServerSettings(api_keys={"cli": API_KEY}),
        workers=(WorkerSettings(name="anthropic-up", dialect="anthropic",
                                url=cli_upstream.anthropic_url, api_key=API_KEY,
                                models=anthropic_models),
                 WorkerSettings(name="openai-up", dialect="openai", url=cli_upstream.url,
                                api_key=API_KEY, models=openai_models)))
    paths = {"claude": "/v1/messages", "qwen": "/v1/chat/completions"}
    if cross:
        paths = {"claude": "/v1/chat/completions", "qwen": "/v1/messages"}
    with ServerThread(create_app(settings)) as server:
        yield CLIGateway(anthropic_url=server.url, openai_url=server.url + "/v1",
                         api_key=API_KEY, models={"claude": CLAUDE_MODEL, "qwen": QWEN_MODEL},
                         paths=paths)


@pytest.fixture
def direct(cli_bins: dict[str, str], cli_upstream: FakeUpstream) -> CLIGateway:
    """The fake itself, no gateway: to check what the CLI version sends."""
    return CLIGateway(anthropic_url=cli_upstream.anthropic_url, openai_url=cli_upstream.url,
                      api_key=API_KEY, models={"claude": CLAUDE_MODEL, "qwen": QWEN_MODEL},
                      paths={"claude": "/v1/messages", "qwen": "/v1/chat/completions"})


@pytest.fixture
def workspace(tmp_path: Path) -> tuple[Path, Path, str]:
    """(cwd with hello.txt holding a fresh secret, isolated HOME, the secret)."""
    cwd, home = tmp_path / "ws", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    secret = f"PINEAPPLE-{secrets.token_hex(4)}"
    (cwd / "hello.txt").write_text(f"The secret word is {secret}.\n")
    return cwd, home, secret


def _claude(gw: CLIGateway, prompt: str, cwd: Path, home: Path) -> list[dict]:
    return run_claude(gw.anthropic_url, gw.api_key, prompt, model=gw.models["claude"],
                      cwd=cwd, home=home)


def _qwen(gw: CLIGateway, prompt: str, cwd: Path, home: Path) -> list[dict]:
    return run_qwen(gw.openai_url, gw.api_key, prompt, model=gw.models["qwen"],
                    cwd=cwd, home=home)


def _chats(fake: FakeUpstream) -> list[Received]:
    return [r for r in fake.requests if r.path in ("/v1/messages", "/v1/chat/completions")]


def _last_message(req: Received) -> dict[str, Any]:
    messages = [m for m in req.body["messages"] if m.get("role") != "system"]
    return messages[-1]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(block["text"])
        elif block.get("type") == "tool_result":
            parts.append(_text(block.get("content")))
    return "".join(parts)


# client, run, chat path, tool it asks for
CLIENTS = [
    pytest.param("claude", _claude, "Read", id="claude-code"),
    pytest.param("qwen", _qwen, "read_file", id="qwen-code"),
]


@pytest.mark.parametrize(("client", "run", "tool"), CLIENTS)
def test_one_turn_answer(cli_gateway: CLIGateway, cli_upstream: FakeUpstream,
                         workspace: tuple[Path, Path, str],
                         client: str, run: Any, tool: str) -> None:
    path = cli_gateway.paths[client]
    cwd, home, _ = workspace
    events = run(cli_gateway, "Say hello to poolgate", cwd, home)

    result = result_event(events)
    assert result["subtype"] == "success" and result["is_error"] is False
    assert result["result"] == "echo: Say hello to poolgate"
    assert result["num_turns"] == 1
    chats = _chats(cli_upstream)
    assert [r.path for r in chats] == [path]
    assert chats[0].body["model"] == cli_gateway.models[client]
    assert chats[0].body["stream"] is True


@pytest.mark.parametrize(("client", "run", "tool"), CLIENTS)
def test_tool_round_trip(cli_gateway: CLIGateway, cli_upstream: FakeUpstream,
                         workspace: tuple[Path, Path, str],
                         client: str, run: Any, tool: str) -> None:
    path = cli_gateway.paths[client]
    cwd, home, secret = workspace
    prompt = f'What is the secret word? [[tool:{tool} {{"file_path": "{cwd / "hello.txt"}"}}]]'
    events = run(cli_gateway, prompt, cwd, home)

    # The CLI ran the tool locally: only the file knows the secret.
    results = tool_results(events)
    assert len(results) == 1 and results[0].get("is_error") in (None, False)
    assert secret in _text(results[0]["content"])
    # ...and sent the result back upstream in a second request.
    chats = _chats(cli_upstream)
    assert [r.path for r in chats] == [path, path]
    assert tool in {(t.get("function") or t)["name"] for t in chats[0].body["tools"]}
    assert secret not in str(chats[0].body)
    assert secret in _text(_last_message(chats[1])["content"])
    # ...and finished with the fake's answer to that result.
    result = result_event(events)
    assert result["subtype"] == "success" and result["num_turns"] == 2
    assert result["result"].startswith("tool said: ") and secret in result["result"]


def test_claude_sends_what_the_fixtures_recorded(direct: CLIGateway,
                                                 cli_upstream: FakeUpstream,
                                                 workspace: tuple[Path, Path, str]) -> None:
    """The quirks the gateway must accept are still what this version sends."""
    cwd, home, _ = workspace
    _claude(direct, "hi", cwd, home)

    (req,) = _chats(cli_upstream)
    assert req.headers["x-api-key"] == API_KEY
    version = PINNED_VERSIONS["@anthropic-ai/claude-code"]
    assert req.headers["user-agent"].startswith(f"claude-cli/{version}")
    assert "claude-code-20250219" in req.headers["anthropic-beta"]
    assert req.body["thinking"]["type"] == "adaptive"  # 2.1.332 adds "display": "updates"
    assert "output_config" in req.body and "context_management" in req.body
    assert isinstance(req.body["metadata"]["user_id"], str)


def test_qwen_sends_what_the_fixtures_recorded(direct: CLIGateway,
                                               cli_upstream: FakeUpstream,
                                               workspace: tuple[Path, Path, str]) -> None:
    cwd, home, _ = workspace
    _qwen(direct, "hi", cwd, home)

    (req,) = _chats(cli_upstream)
    assert req.headers["authorization"] == f"Bearer {API_KEY}"
    version = PINNED_VERSIONS["@qwen-code/qwen-code"]
    assert req.headers["user-agent"].startswith(f"QwenCode/{version}")
    assert req.body["stream_options"] == {"include_usage": True}
    # 0.24 puts a <system-reminder> (skills) before the prompt in the same message
    assert _last_message(req)["content"][-1] == {"type": "text", "text": "hi"}


@pytest.mark.parametrize(("client", "runner"), [
    pytest.param("claude", run_claude, id="claude-code"),
    pytest.param("qwen", run_qwen, id="qwen-code"),
])
def test_hung_upstream_hits_the_hard_timeout(cli_gateway: CLIGateway,
                                             cli_upstream: FakeUpstream,
                                             workspace: tuple[Path, Path, str],
                                             client: str, runner: Any) -> None:
    path = cli_gateway.paths[client]
    cwd, home, _ = workspace
    url = cli_gateway.anthropic_url if client == "claude" else cli_gateway.openai_url
    started = time.monotonic()
    with pytest.raises(CLITimeout) as caught:
        runner(url, cli_gateway.api_key, "wait [[sleep:60]]", model=cli_gateway.models[client],
               cwd=cwd, home=home, timeout=5)

    assert time.monotonic() - started < 15
    assert caught.value.returncode == -9
    assert any(r.path == path for r in cli_upstream.requests)  # it was waiting on us
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(caught.value.pid, 0)


def test_ensure_cli_without_npm_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert ensure_cli(*CLAUDE_CODE) is None
