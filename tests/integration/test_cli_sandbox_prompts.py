"""A client's system prompt reaches the CLI as a private file under the
account's home (never argv): Claude's ``--system-prompt-file``, Qwen's
``QWEN_SYSTEM_MD``. In agent mode the CLI runs sandboxed, so the file must be
readable from inside every sandbox: under bubblewrap (the home is bound in)
and as the account's own uid (the home is handed to that uid at each start).
The fake CLIs, run by the system's Python (a uid of its own cannot enter the
gateway's own interpreter under /root), read it as the real ones do."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import anthropic
import openai
import httpx
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from pool.cli.sandbox import SandboxUnavailable, resolve_sandbox
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import FAKE_CLAUDE, claude_home, wait_for
from tests.support.cli_fakes import FAKE_QWEN, worker_info
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

TOKEN = "sk-ant-oat01-prompt-account"
KEY = "sk-qwen-prompt-account"
SYSTEM = "You are the prompt-file marker 5c2e."
PYTHON = "/usr/bin/python3"


def _works(setting: str, home: Path) -> bool:
    try:
        resolve_sandbox(setting, name="acct", mode="agent", cli="claude", home=str(home),
                        env={"PATH": "/usr/bin:/bin"})
    except SandboxUnavailable:
        return False
    return True


@pytest.fixture
def root():
    # /var/tmp and 0755: the account's uid walks through it to its home
    path = Path(tempfile.mkdtemp(prefix="poolgate-prompt-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _worker(cli: str, home: Path, root: Path, upstream: FakeUpstream, sandbox: str,
            model: str) -> WorkerSettings:
    log = home / "fake.log"  # in the home: the account's uid may write there
    if cli == "claude":
        env = {"ANTHROPIC_BASE_URL": upstream.anthropic_url, "FAKE_CLAUDE_LOG": str(log)}
        script = FAKE_CLAUDE
    else:
        env = {"OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": KEY, "FAKE_QWEN_LOG": str(log)}
        script = FAKE_QWEN
    env["PATH"] = "/usr/bin:/bin"
    return WorkerSettings(name="acct", kind="cli", cli=cli, models=(model,), home=str(home),
                          command=(PYTHON, str(script)), env=env, mode="agent",
                          sandbox=sandbox, workspace_root=str(root / "workspaces"),
                          health_interval=0.5, health_timeout=2.0, backoff_initial=0.2,
                          backoff_max=2.0, stop_timeout=5.0, ready_timeout=30)


@pytest.mark.parametrize("sandbox", ["bwrap", "uid"])
@pytest.mark.parametrize("cli", ["claude", "qwen"])
def test_the_system_prompt_file_is_read_inside_the_sandbox(root, cli, sandbox):
    if not os.path.exists(PYTHON):
        pytest.skip(f"{PYTHON} is not there")
    if not _works(sandbox, root):
        pytest.skip(f"sandbox = {sandbox!r} does not work on this machine")
    model = "claude-sonnet-4-6" if cli == "claude" else "qwen-coder"
    home = claude_home(root / "home", TOKEN) if cli == "claude" else root / "home"
    with FakeUpstream(api_key=TOKEN if cli == "claude" else KEY, models=(model,)) as upstream:
        worker = _worker(cli, home, root, upstream, sandbox, model)
        settings = Settings(server=ServerSettings(admin_token="admin-token",
                                                  api_keys={"team-a": "sk-team-a"}),
                            workers=(worker,))
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30) as http:
            wait_for(lambda: worker_info(http)["acct"]["state"] == "ready", timeout=30)
            assert worker_info(http)["acct"]["sandbox"] == sandbox
            before = len(upstream.requests)
            with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-team-a",
                               max_retries=0, timeout=60) as client:
                answer = client.chat.completions.create(model=model, messages=[
                    {"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}])
            assert answer.choices[0].message.content
            sent = [json.dumps(r.body) for r in upstream.requests[before:] if r.body]
            assert sent and any(SYSTEM in body for body in sent), sent[-1][:2000]


@pytest.mark.parametrize("sandbox", ["bwrap", "uid"])
def test_a_tool_reaches_its_key_s_workspace_by_its_absolute_path(root, sandbox):
    """The CLIs name files by absolute path (Claude's Read takes only those):
    the key's workspace must be reachable from the root down, also as the
    account's uid (the worker child creates directories 0700)."""
    if not os.path.exists(PYTHON):
        pytest.skip(f"{PYTHON} is not there")
    if not _works(sandbox, root):
        pytest.skip(f"sandbox = {sandbox!r} does not work on this machine")
    model = "claude-sonnet-4-6"
    home = claude_home(root / "home", TOKEN)
    with FakeUpstream(api_key=TOKEN, models=(model,)) as upstream:
        worker = _worker("claude", home, root, upstream, sandbox, model)
        settings = Settings(server=ServerSettings(admin_token="admin-token",
                                                  api_keys={"team-a": "sk-team-a"}),
                            workers=(worker,))
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30) as http, \
                anthropic.Anthropic(base_url=srv.url, api_key="sk-team-a",
                                    max_retries=0, timeout=60) as client:
            wait_for(lambda: worker_info(http)["acct"]["state"] == "ready", timeout=30)
            client.messages.create(model=model, max_tokens=16,
                                   messages=[{"role": "user", "content": "hi"}])
            todo = root / "workspaces" / "team-a" / "todo.txt"  # made by the first turn
            todo.write_text("team-a's own file")
            todo.chmod(0o644)
            read = json.dumps({"file_path": str(todo)})
            out = client.messages.create(model=model, max_tokens=64, messages=[
                {"role": "user", "content": f"[[tool:Read {read}]]"}])
    result = next(b.to_dict() for b in out.content if b.type == "mcp_tool_result")
    assert result["is_error"] is False, result
    assert result["content"][0]["text"] == "team-a's own file"
