"""Agent-mode cli workers behind a real poolgate, driven by the real SDKs: the
CLI runs its own tools, and clients see executed tool-use/result pairs they
need not answer (Anthropic ``mcp_tool_use``/``mcp_tool_result``, Responses
``mcp_call``). Sending those back as history still continues the CLI's
session. Also: a logged-out account becomes ready once credentials appear."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import shutil

import anthropic
import httpx
import openai
import pytest
from anthropic.types.beta import BetaMCPToolResultBlock, BetaMCPToolUseBlock

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.responses_upstream import ResponsesUpstream
from tests.fakes.upstreams import FakeUpstream
from tests.integration.clis import CODEX, command_executions, ensure_cli, final_message, run_codex
from tests.support.cli_accounts import claude_home, fake_claude_worker, user_lines, wait_for
from tests.support.codex_accounts import CODEX_MODEL, codex_home, codex_worker, turn_inputs
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

ADMIN = {"authorization": "Bearer admin-token"}
TOKEN = "sk-ant-oat01-team-account"
CODEX_KEY = "sk-codex-team-account"
MODEL = "claude-sonnet-4-6"
READ = '[[tool:Read {"file_path": "notes.txt"}]]'
SHELL = '[[tool:shell_command {"command": "cat notes.txt"}]]'
NOTES = "the notes say 42"


def _gateway(*workers: WorkerSettings) -> ServerThread:
    settings = Settings(server=ServerSettings(admin_token="admin-token",
                                              api_keys={"team-a": "sk-team-a"}),
                        workers=workers)
    return ServerThread(create_app(settings))


def _plant_notes(home: Path) -> None:
    """In the workspace of key ``team-a`` (agent mode: one per key, beside the home)."""
    workspace = Path(f"{home}-workspaces") / "team-a"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "notes.txt").write_text(NOTES)


@pytest.fixture
def claude(tmp_path: Path) -> Iterator[tuple[Any, httpx.Client, Path]]:
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        home = claude_home(tmp_path / "a", TOKEN)
        _plant_notes(home)
        log = home / "fake-claude.log"  # in the home: the sandbox shows the CLI nothing else
        worker = fake_claude_worker("claude-a", home, upstream.anthropic_url, log, mode="agent")
        with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            yield srv, http, log


@pytest.fixture
def codex(tmp_path: Path) -> Iterator[tuple[Any, httpx.Client, Path]]:
    with ResponsesUpstream(api_key=CODEX_KEY, models=(CODEX_MODEL,)) as upstream:
        home = codex_home(tmp_path / "c", CODEX_KEY)
        _plant_notes(home)
        worker = codex_worker("codex-a", home, upstream.url, mode="agent")
        with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            yield srv, http, home


def _ant(srv: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="sk-team-a", max_retries=0)


def _oai(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-team-a", max_retries=0)


def _stats(http: httpx.Client, worker: str, hits: int) -> dict[str, int]:
    return wait_for(lambda: (s := http.get("/internal/stats", headers=ADMIN).json()
                             ["cli_sessions"]["workers"][worker])["hits"] == hits and s)


# --- Claude ----------------------------------------------------------------------------

def _assert_read_pair(content: list[dict[str, Any]]) -> None:
    use, result, text = content
    assert use["type"] == "mcp_tool_use" and use["name"] == "Read"
    assert use["server_name"] == "claude" and use["input"] == {"file_path": "notes.txt"}
    assert result == {"type": "mcp_tool_result", "tool_use_id": use["id"], "is_error": False,
                      "content": [{"type": "text", "text": NOTES}]}
    assert text == {"type": "text", "text": f"tool said: {NOTES}"}


def test_claude_agent_turn_shows_the_executed_pair_to_anthropic_clients(claude):
    srv, http, log = claude
    history: list[dict[str, Any]] = [{"role": "user", "content": READ}]
    with _ant(srv) as ant:
        first = ant.messages.create(model=MODEL, max_tokens=64, messages=history)
        assert first.stop_reason == "end_turn"  # nothing for the client to answer
        _assert_read_pair([b.to_dict() for b in first.content])
        # streamed: the same blocks, folded by the SDK's own accumulator
        with ant.messages.stream(model=MODEL, max_tokens=64, messages=history) as stream:
            kinds = [e.content_block.type for e in stream if e.type == "content_block_start"]
            streamed = stream.get_final_message()
        assert kinds == ["mcp_tool_use", "mcp_tool_result", "text"]
        assert streamed.stop_reason == "end_turn"
        _assert_read_pair([b.to_dict() for b in streamed.content])
        # the beta client parses them as its MCP block types
        beta = ant.beta.messages.create(model=MODEL, max_tokens=64, messages=history)
        assert isinstance(beta.content[0], BetaMCPToolUseBlock)
        assert isinstance(beta.content[1], BetaMCPToolResultBlock)
        assert beta.content[1].content[0].text == NOTES
        # the pair comes back as history: the second turn continues the first's CLI
        history += [{"role": "assistant", "content": [b.to_dict() for b in first.content]},
                    {"role": "user", "content": "and now?"}]
        second = ant.messages.create(model=MODEL, max_tokens=64, messages=history)
    assert second.content[0].text == "echo: and now?"
    sent = user_lines(log)
    assert sent[-1]["message"]["content"] in ("and now?", [{"type": "text", "text": "and now?"}])
    assert sent[-1]["pid"] == sent[0]["pid"]  # the first turn's process got only the new turn
    assert _stats(http, "claude-a", 1)["hits"] == 1


def test_claude_agent_turn_as_a_responses_mcp_call(claude):
    srv, http, log = claude
    with _oai(srv) as oai:
        first = oai.responses.create(model=MODEL, input=READ)
        assert first.status == "completed"
        call, message = first.output
        assert (call.type, call.name, call.server_label, call.status) == (
            "mcp_call", "Read", "claude", "completed")
        assert call.arguments == '{"file_path":"notes.txt"}' and call.output == NOTES
        assert call.error is None and message.content[0].text == f"tool said: {NOTES}"
        with oai.responses.stream(model=MODEL, input=READ) as stream:
            types = [e.type for e in stream]
            streamed = stream.get_final_response()
        assert types.count("response.mcp_call.completed") == 1
        assert "response.mcp_call_arguments.done" in types and types[-1] == "response.completed"
        assert [o.type for o in streamed.output] == ["mcp_call", "message"]
        assert streamed.output[0].output == NOTES
        second = oai.responses.create(model=MODEL, input=[
            {"role": "user", "content": READ},
            *[o.model_dump(exclude_none=True) for o in first.output],
            {"role": "user", "content": "and now?"}])
        assert second.output_text == "echo: and now?"
        sent = user_lines(log)
        assert sent[-1]["pid"] == sent[0]["pid"]
        assert _stats(http, "claude-a", 1)["hits"] == 1
        # chained by previous_response_id: the stored mcp_call is history as well
        third = oai.responses.create(model=MODEL, previous_response_id=second.id,
                                     input="and then?")
    assert third.output_text == "echo: and then?"
    assert user_lines(log)[-1]["pid"] == sent[0]["pid"]
    assert _stats(http, "claude-a", 2)["hits"] == 2


def test_claude_agent_turn_in_chat_completions_is_readable_text_and_reused(claude):
    srv, http, log = claude
    history: list[dict[str, Any]] = [{"role": "user", "content": READ}]
    with _oai(srv) as oai:
        first = oai.chat.completions.create(model=MODEL, messages=history)
        content = first.choices[0].message.content
        assert content == (f'\n[Read {{"file_path":"notes.txt"}}]\n[result: {NOTES}]\n'
                           f"tool said: {NOTES}")
        history += [{"role": "assistant", "content": content},
                    {"role": "user", "content": "and now?"}]
        oai.chat.completions.create(model=MODEL, messages=history)
    assert _stats(http, "claude-a", 1)["hits"] == 1


# --- Codex -------------------------------------------------------------------------------

def test_codex_agent_turn_shows_the_executed_command_in_both_dialects(codex):
    srv, http, home = codex
    with _oai(srv) as oai:
        first = oai.responses.create(model=CODEX_MODEL, input=SHELL)
        assert first.status == "completed"
        call, message = first.output
        assert (call.type, call.name, call.server_label, call.output) == (
            "mcp_call", "shell", "codex", NOTES)
        assert '"command":"cat notes.txt"' in call.arguments
        assert message.content[0].text == f"tool said: {NOTES}"
        second = oai.responses.create(model=CODEX_MODEL, input=[
            {"role": "user", "content": SHELL},
            *[o.model_dump(exclude_none=True) for o in first.output],
            {"role": "user", "content": "and now?"}])
    assert second.output_text == "echo: and now?"
    turns = turn_inputs(home)
    assert [t["text"] for t in turns] == [SHELL, "and now?"]  # only the new turn
    assert turns[0]["thread"] == turns[1]["thread"]
    assert _stats(http, "codex-a", 1)["hits"] == 1
    with _ant(srv) as ant:
        out = ant.messages.create(model=CODEX_MODEL, max_tokens=64,
                                  messages=[{"role": "user", "content": SHELL.replace(
                                      "notes.txt", "missing.txt")}])
    use, result, text = [b.to_dict() for b in out.content]
    assert out.stop_reason == "end_turn" and use["type"] == "mcp_tool_use"
    assert use["name"] == "shell" and use["server_name"] == "codex"
    assert result["is_error"] is True and "No such file" in result["content"][0]["text"]
    assert text["text"].startswith("tool said: cat: missing.txt")


def test_codex_cli_as_a_client_takes_the_mcp_call_of_an_agent_worker(codex, tmp_path):
    """The real Codex CLI (``codex exec``) → poolgate's Responses API → an
    agent-mode codex worker whose app-server runs the command itself: the
    client gets an ``mcp_call`` item it has nothing to do for, and finishes."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install the Codex CLI")
    assert ensure_cli(*CODEX) is not None
    srv, http, home = codex
    workspace = tmp_path / "client-ws"
    workspace.mkdir()
    events = run_codex(srv.url + "/v1", "sk-team-a", f"What do the notes say? {SHELL}",
                       model=CODEX_MODEL, cwd=workspace, home=tmp_path / "client-home",
                       timeout=120)
    assert final_message(events) == f"tool said: {NOTES}"
    assert command_executions(events) == []  # the worker ran it; the client ran nothing
    errors = [e["item"]["message"] for e in events if (e.get("item") or {}).get("type") == "error"]
    assert [m for m in errors if "Model metadata" not in m] == []  # the mcp_call parsed


# --- login recheck ---------------------------------------------------------------------

def test_a_logged_out_account_is_ready_once_credentials_appear(tmp_path):
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        home = claude_home(tmp_path / "a", None)
        worker = fake_claude_worker("claude-a", home, upstream.anthropic_url,
                                    tmp_path / "claude.log")
        with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            def login() -> str:
                workers = http.get("/internal/workers", headers=ADMIN).json()["workers"]
                return workers[0]["login"]

            assert wait_for(lambda: login() == "logged_out")
            with _ant(srv) as ant, pytest.raises(anthropic.APIStatusError) as err:
                ant.messages.create(model=MODEL, max_tokens=10,
                                    messages=[{"role": "user", "content": "hi"}])
            assert err.value.status_code == 503 and "logged out" in err.value.message
            claude_home(tmp_path / "a", TOKEN)  # someone logs the account in
            assert wait_for(lambda: login() == "ready")
            with _ant(srv) as ant:
                out = ant.messages.create(model=MODEL, max_tokens=10,
                                          messages=[{"role": "user", "content": "hi"}])
    assert out.content[0].text == "echo: hi"
