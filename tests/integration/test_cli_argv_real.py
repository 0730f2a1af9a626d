"""The real Qwen Code and Claude Code get a client's system prompt as text,
never as arguments (issue 20, section 2): a prompt that reads as an option,
prompts beginning with ``- `` and ``---``, and one of 1 MiB, each through
poolgate to a fake upstream, with no process's command line holding it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import anthropic
import httpx
import pytest

from app.settings import WorkerSettings
from tests.fakes.upstreams import FakeUpstream
from tests.integration.clis import CLAUDE_CODE, NPM_PREFIX, QWEN_CODE, _base_env, ensure_cli
from tests.support.cli_accounts import claude_home, wait_for
from tests.support.cli_fakes import CLIENT_KEY, serve, worker_info

pytestmark = [pytest.mark.cli, pytest.mark.slow]

QWEN_KEY = "sk-qwen-real-account"
QWEN_MODEL = "qwen3-coder-plus"
CLAUDE_TOKEN = "sk-ant-oat01-planted-for-tests"
CLAUDE_MODEL = "claude-sonnet-4-6"
PROMPTS = {"option": "--openai-base-url={elsewhere}", "dash": "- a list item first",
           "rule": "--- a rule first", "1MiB": "A system prompt of one mebibyte. " * 32768}


def _on_a_command_line(text: str) -> list[int]:
    """The pids whose command line holds ``text`` (what ``ps`` shows any user)."""
    needle = text[:60].encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _ask(srv, model: str, system: str, text: str) -> str:
    with anthropic.Anthropic(base_url=srv.url, api_key=CLIENT_KEY, max_retries=0,
                             timeout=120) as ant:
        out = ant.messages.create(model=model, max_tokens=64, system=system,
                                  messages=[{"role": "user", "content": text}])
    return out.content[0].text


@pytest.fixture(scope="module")
def qwen_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Qwen Code")
    path = ensure_cli(*QWEN_CODE)
    assert path is not None
    return path


@pytest.mark.parametrize("name", list(PROMPTS))
def test_real_qwen_gets_the_system_prompt_as_text(tmp_path: Path, qwen_bin: str, name: str):
    with FakeUpstream(api_key=QWEN_KEY, models=(QWEN_MODEL,)) as upstream, \
            FakeUpstream(models=(QWEN_MODEL,)) as elsewhere:
        system = PROMPTS[name].format(elsewhere=elsewhere.url)
        worker = WorkerSettings(
            name="qwen-real", kind="cli", cli="qwen", models=(QWEN_MODEL,),
            home=str(tmp_path / "acct"), command=(qwen_bin,), ready_timeout=60,
            env={"OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": QWEN_KEY,
                 "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
            wait_for(lambda: worker_info(http)["qwen-real"]["state"] == "ready", timeout=60)
            assert _ask(srv, QWEN_MODEL, system, "who are you") == "echo: who are you"
            assert _on_a_command_line(system) == []
        posts = [r.body for r in upstream.requests if r.body is not None]
        assert len(posts) == 1 and elsewhere.requests == []
        # Qwen appends its own context after the prompt; the prompt itself is intact
        assert posts[0]["messages"][0]["content"].startswith(system)


@pytest.fixture(scope="module")
def claude_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Claude Code")
    assert ensure_cli(*CLAUDE_CODE) is not None
    native = NPM_PREFIX / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    assert native.exists()
    return str(native)


@pytest.mark.parametrize("name", list(PROMPTS))
def test_real_claude_gets_the_system_prompt_as_text(tmp_path: Path, claude_bin: str, name: str):
    with FakeUpstream(api_key=CLAUDE_TOKEN, models=(CLAUDE_MODEL,)) as upstream:
        system = PROMPTS[name].format(elsewhere="https://elsewhere.invalid/v1")
        env = _base_env(tmp_path / "os-home")
        env.update(ANTHROPIC_BASE_URL=upstream.anthropic_url,
                   ANTHROPIC_SMALL_FAST_MODEL=CLAUDE_MODEL)
        home = claude_home(tmp_path / "account", CLAUDE_TOKEN)
        worker = WorkerSettings(
            name="claude-real", kind="cli", cli="claude", models=(CLAUDE_MODEL,),
            home=str(home), command=(claude_bin,), env=env, ready_timeout=60)
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
            wait_for(lambda: worker_info(http)["claude-real"]["state"] == "ready", timeout=60)
            assert _ask(srv, CLAUDE_MODEL, system, "who are you") == "echo: who are you"
            assert _on_a_command_line(system) == []
            assert list(home.glob(".poolgate-prompt-*")) == []  # read at startup, then removed
        bodies = [r.body for r in upstream.requests if r.body and r.path == "/v1/messages"]
        assert any(system in [b.get("text") for b in body["system"]] for body in bodies), \
            json.dumps([body["system"] for body in bodies])[:500]


def test_real_qwen_agent_mode_appends_the_clients_prompt_to_its_own(tmp_path: Path,
                                                                   qwen_bin: str):
    system = "- agent rules: be brief"
    with FakeUpstream(api_key=QWEN_KEY, models=(QWEN_MODEL,)) as upstream:
        worker = WorkerSettings(
            name="qwen-real", kind="cli", cli="qwen", models=(QWEN_MODEL,), mode="agent",
            home=str(tmp_path / "acct"), command=(qwen_bin,), ready_timeout=60,
            env={"OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": QWEN_KEY,
                 "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
            wait_for(lambda: worker_info(http)["qwen-real"]["state"] == "ready", timeout=60)
            assert _ask(srv, QWEN_MODEL, system, "who are you") == "echo: who are you"
            assert _on_a_command_line(system) == []
        posts = [r.body for r in upstream.requests if r.body is not None]
        prompt = posts[0]["messages"][0]["content"]
        # Qwen's own agent prompt (written by Qwen itself), then the client's after a rule
        assert prompt.startswith("You are Qwen Code, ") and len(prompt) > 10_000
        assert f"\n\n---\n\n{system}" in prompt and len(posts[0]["tools"]) > 5
