"""The real Codex CLI (``codex exec --json``, from npm) completes a one-turn
answer and function-call and custom-tool round trips through a real poolgate
in front of a chat-only upstream and an Anthropic upstream, and still sends
what ``fixtures/clients/codex-responses-*`` recorded.

The fake (:mod:`tests.fakes.responses_upstream`) answers ``echo: <text>``; a
prompt holding ``[[tool:exec_command {"cmd": ...}]]`` makes it call Codex's
shell tool, and after the ``function_call_output`` it answers
``tool said: <output>``. The file the command reads holds a random secret, so
seeing it in the next request proves Codex ran the command itself and sent
the output back. A run takes under a second; the first one also installs
Codex into ``.cache/npm`` (about 15 s).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.responses_upstream import ENCRYPTED_REASONING, ResponsesUpstream
from tests.fakes.upstreams import Received
from tests.integration.clis import (
    CODEX,
    PINNED_VERSIONS,
    CLIError,
    CLITimeout,
    command_executions,
    ensure_cli,
    final_message,
    run_codex,
    turn_completed,
)
from tests.support.paths import FIXTURES
from tests.support.server import ServerThread

pytestmark = [pytest.mark.cli, pytest.mark.slow]

API_KEY = "sk-poolgate-codex-test"
CODEX_MODEL = "gpt-5-codex"  # what codex-responses-tool-* was recorded with
# A model Codex has metadata for: it also gets apply_patch as a ``custom``
# (freeform) tool, as in codex-responses-custom-tool-02.
PATCH_MODEL = "gpt-5.5"
CODEX_VERSION = PINNED_VERSIONS["@openai/codex"]
SHELL_TOOL = "exec_command"


class CodexTarget(NamedTuple):
    base_url: str  # ends in /v1: Codex posts to <base_url>/responses
    api_key: str
    model: str
    patch_model: str  # a model whose tools include the custom apply_patch
    path: str         # the upstream path Codex's requests reach


@pytest.fixture(scope="session")
def codex_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install the Codex CLI")
    path = ensure_cli(*CODEX)
    assert path is not None
    return path


@pytest.fixture
def responses_upstream() -> Iterator[ResponsesUpstream]:
    """A fresh fake per test, so request counts are exact."""
    with ResponsesUpstream(api_key=API_KEY, models=(CODEX_MODEL, PATCH_MODEL)) as fake:
        yield fake


@pytest.fixture(params=["chat-upstream", "anthropic-upstream"])
def codex_target(request: pytest.FixtureRequest, codex_bin: str,
                 responses_upstream: ResponsesUpstream) -> Iterator[CodexTarget]:
    """Codex -> a real poolgate -> a chat-only (OpenAI chat completions) or an
    Anthropic upstream: every request is translated from the Responses API."""
    dialect = "openai" if request.param == "chat-upstream" else "anthropic"
    url = responses_upstream.url if dialect == "openai" else responses_upstream.anthropic_url
    settings = Settings(server=ServerSettings(api_keys={"codex": API_KEY}), workers=(
        WorkerSettings(name="upstream", dialect=dialect, url=url, api_key=API_KEY,
                       models=(CODEX_MODEL, PATCH_MODEL)),))
    with ServerThread(create_app(settings)) as server:
        yield CodexTarget(base_url=server.url + "/v1", api_key=API_KEY, model=CODEX_MODEL,
                          patch_model=PATCH_MODEL,
                          path="/v1/chat/completions" if dialect == "openai" else "/v1/messages")


@pytest.fixture
def direct(codex_bin: str, responses_upstream: ResponsesUpstream) -> CodexTarget:
    """Codex straight at the fake Responses server: what this Codex version sends."""
    return CodexTarget(base_url=responses_upstream.url, api_key=API_KEY, model=CODEX_MODEL,
                       patch_model=PATCH_MODEL, path="/v1/responses")


@pytest.fixture
def workspace(tmp_path: Path) -> tuple[Path, Path, str]:
    """(cwd with hello.txt holding a fresh secret, isolated HOME, the secret)."""
    cwd, home = tmp_path / "ws", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    secret = f"MANGO-{secrets.token_hex(4)}"
    (cwd / "hello.txt").write_text(f"The secret word is {secret}.\n")
    return cwd, home, secret


def _codex(target: CodexTarget, prompt: str, workspace: tuple[Path, Path, str],
           **kwargs: Any) -> list[dict]:
    cwd, home, _ = workspace
    return run_codex(target.base_url, target.api_key, prompt, model=target.model,
                     cwd=cwd, home=home, **kwargs)


def _turns(fake: ResponsesUpstream, target: CodexTarget) -> list[Received]:
    return [r for r in fake.requests if r.path == target.path]


def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def test_one_turn_answer(codex_target: CodexTarget, responses_upstream: ResponsesUpstream,
                         workspace: tuple[Path, Path, str]) -> None:
    events = _codex(codex_target, "Say hello to poolgate", workspace)

    assert final_message(events) == "echo: Say hello to poolgate"
    assert command_executions(events) == []
    usage = turn_completed(events)["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    (req,) = _turns(responses_upstream, codex_target)
    assert req.body["model"] == CODEX_MODEL and req.body["stream"] is True
    # Offline: the one translated call is all that reached the upstream.
    assert [r.path for r in responses_upstream.requests] == [codex_target.path]


def test_function_call_round_trip(codex_target: CodexTarget,
                                  responses_upstream: ResponsesUpstream,
                                  workspace: tuple[Path, Path, str]) -> None:
    _, _, secret = workspace
    prompt = f'What is the secret word? [[tool:{SHELL_TOOL} {{"cmd": "cat hello.txt"}}]]'
    events = _codex(codex_target, prompt, workspace)

    # Codex ran the command locally: only the file knows the secret.
    (run,) = command_executions(events)
    assert run["status"] == "completed" and run["exit_code"] == 0
    assert "cat hello.txt" in run["command"] and secret in run["aggregated_output"]
    # ...and poolgate carried its output to the upstream in a second request,
    # translated into the upstream's own tool-result shape.
    first, second = _turns(responses_upstream, codex_target)
    assert SHELL_TOOL in {(t.get("function") or t).get("name") for t in first.body["tools"]}
    assert secret not in json.dumps(first.body)
    assert secret in _tool_result_text(second.body)
    # ...and finished with the fake's answer to that output.
    message = final_message(events)
    assert message.startswith("tool said: ") and secret in message


def _tool_result_text(body: dict[str, Any]) -> str:
    """The last tool result the upstream received, in either dialect."""
    last = body["messages"][-1]
    if last["role"] == "tool":  # OpenAI chat
        content = last["content"]
        return content if isinstance(content, str) else "".join(p["text"] for p in content)
    results = [b for b in last["content"] if b.get("type") == "tool_result"]  # Anthropic
    content = results[-1]["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def test_custom_tool_round_trip(codex_target: CodexTarget,
                                responses_upstream: ResponsesUpstream,
                                workspace: tuple[Path, Path, str]) -> None:
    """apply_patch is a ``custom`` tool: the call carries free text ``input``
    (no JSON arguments) and its result comes back as ``custom_tool_call_output``."""
    cwd, home, _ = workspace
    patch = "*** Begin Patch\n*** Add File: new.txt\n+hello patch\n*** End Patch\n"
    prompt = f"Create new.txt [[tool:apply_patch {json.dumps({'input': patch})}]]"
    events = run_codex(codex_target.base_url, codex_target.api_key, prompt,
                       model=codex_target.patch_model, cwd=cwd, home=home,
                       sandbox="workspace-write")

    assert (cwd / "new.txt").read_text() == "hello patch\n"  # Codex applied it
    first, second = _turns(responses_upstream, codex_target)
    # offered to the upstream as a function with one string argument
    offered = {(t.get("function") or t).get("name") for t in first.body["tools"]}
    assert "apply_patch" in offered
    assert "Success" in _tool_result_text(second.body)
    assert final_message(events).startswith("tool said: ")


def test_reasoning_is_sent_back_encrypted(direct: CodexTarget,
                                          responses_upstream: ResponsesUpstream,
                                          workspace: tuple[Path, Path, str]) -> None:
    """With ``store: false`` the only memory of a reasoning item is the
    ``encrypted_content`` Codex replays; it must come back byte for byte (what
    a Responses-speaking worker must preserve)."""
    prompt = f'Think first. [[think]] [[tool:{SHELL_TOOL} {{"cmd": "cat hello.txt"}}]]'
    events = _codex(direct, prompt, workspace)

    assert final_message(events).startswith("tool said: ")
    _, second = _turns(responses_upstream, direct)
    reasoning, call, output = second.body["input"][-3:]
    assert reasoning["type"] == "reasoning"
    assert reasoning["encrypted_content"] == ENCRYPTED_REASONING
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Thinking about: Think first."}]
    assert (call["type"], output["type"]) == ("function_call", "function_call_output")


def test_codex_sends_what_the_fixtures_recorded(direct: CodexTarget,
                                                responses_upstream: ResponsesUpstream,
                                                workspace: tuple[Path, Path, str]) -> None:
    """The request shape the gateway must accept is still what this version sends."""
    recorded = _fixture("codex-responses-tool-02-POST-v1_responses.json")
    events = _codex(direct, "hi", workspace)
    turn_completed(events)

    (req,) = _turns(responses_upstream, direct)
    body, want = req.body, recorded["body"]
    assert set(body) == set(want) - {"_n_tools"}
    assert body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"] == want["include"]
    assert body["prompt_cache_key"] == req.headers["session-id"]  # the thread id
    for key in ("tool_choice", "parallel_tool_calls", "reasoning", "stream"):
        assert body[key] == want[key], key
    assert "instructions" not in body
    kinds = [(t["type"], t.get("name")) for t in body["tools"]]
    assert kinds == [(t["type"], t.get("name")) for t in want["tools"]]
    assert {t["type"] for t in body["tools"]} == {"function", "namespace", "web_search"}
    assert [(i["type"], i.get("role")) for i in body["input"]] == [
        ("message", "developer"), ("message", "developer"), ("message", "user"),
        ("message", "user")]
    assert all(i["id"] for i in body["input"])  # input items carry ids
    assert body["input"][-1]["content"] == [{"type": "input_text", "text": "hi"}]
    assert set(body["client_metadata"]) == set(want["client_metadata"])
    headers = req.headers
    assert headers["authorization"] == f"Bearer {API_KEY}"
    assert headers["accept"] == "text/event-stream"
    assert headers["originator"] == "codex_exec"
    assert headers["user-agent"].startswith(f"codex_exec/{CODEX_VERSION} ")
    metadata = json.loads(headers["x-codex-turn-metadata"])
    assert metadata["analytics_enabled"] is False and metadata["sandbox_mode"] == "read-only"


def test_upstream_error_fails_the_turn(codex_target: CodexTarget,
                                      responses_upstream: ResponsesUpstream,
                                      workspace: tuple[Path, Path, str]) -> None:
    """A 400 is final: no retry, the turn fails with the upstream's message."""
    with pytest.raises(CLIError) as caught:
        _codex(codex_target, "bad [[error:400]]", workspace)

    assert caught.value.returncode == 1
    failed = [e for e in caught.value.events if e.get("type") == "turn.failed"]
    # the upstream's 400 reached Codex through poolgate, message and all
    assert len(failed) == 1 and "fake upstream says 400" in failed[0]["error"]["message"]
    assert len(_turns(responses_upstream, codex_target)) == 1


def test_hung_upstream_hits_the_hard_timeout(codex_target: CodexTarget,
                                             responses_upstream: ResponsesUpstream,
                                             workspace: tuple[Path, Path, str]) -> None:
    started = time.monotonic()
    with pytest.raises(CLITimeout) as caught:
        _codex(codex_target, "wait [[sleep:60]]", workspace, timeout=5)

    assert time.monotonic() - started < 15
    assert caught.value.returncode == -9
    assert len(_turns(responses_upstream, codex_target)) == 1  # it was waiting on us
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(caught.value.pid, 0)


@pytest.mark.parametrize(("prompt", "fixture"), [
    pytest.param("hi", "codex-responses-hi-02-POST-v1_responses.json", id="text"),
    pytest.param('x [[tool:exec_command {"cmd": "cat hello.txt"}]]',
                 "codex-responses-tool-02-POST-v1_responses.json", id="function-call"),
    pytest.param("x [[think]]", "codex-responses-reasoning-02-POST-v1_responses.json",
                 id="reasoning"),
])
def test_fake_streams_what_the_recorder_answered(responses_upstream: ResponsesUpstream,
                                                 prompt: str, fixture: str) -> None:
    """No CLI needed: the fake's event sequence is the one Codex was recorded
    against (event kinds in order, deltas collapsed), each frame with an
    ``event:`` line and a ``sequence_number`` counting from 0."""
    body = {"model": CODEX_MODEL, "stream": True, "store": False, "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}]}
    response = httpx.post(responses_upstream.url + "/responses", json=body,
                          headers={"authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 200
    frames = [f for f in response.text.split("\n\n") if f.strip()]
    events = [json.loads(f.split("\ndata: ", 1)[1]) for f in frames]
    assert [f.split("\n", 1)[0] for f in frames] == [f"event: {e['type']}" for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))

    def collapsed(kinds: list[str]) -> list[str]:
        return [k for n, k in enumerate(kinds) if not (k.endswith(".delta") and kinds[n - 1] == k)]

    recorded = _fixture(fixture)["recorder_response"]["sse_events"]
    assert collapsed([e["type"] for e in events]) == collapsed(recorded)
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["output"] == [
        e["item"] for e in events if e["type"] == "response.output_item.done"]


def test_ensure_cli_without_npm_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert ensure_cli(*CODEX) is None
