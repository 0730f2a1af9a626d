"""An account's files through real worker children started under umask 0:
transcripts, settings and the home are private (0600 in 0700), and a
conversation's transcript leaves the disk when the conversation ends."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import claude_home, fake_claude_worker, wait_for
from tests.support.cli_fakes import fake_cli_worker, worker_info
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

TOKEN = "sk-ant-oat01-team-account"
KEY = "sk-qwen-account-a"
ADMIN = {"authorization": "Bearer admin-token"}


@pytest.fixture
def open_umask():
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _gateway(*workers):
    return ServerThread(create_app(Settings(
        server=ServerSettings(admin_token="admin-token", api_keys={"team-a": "sk-team-a"}),
        workers=tuple(workers))))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _transcripts(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.jsonl")) if root.exists() else []


def _two_conversations(srv, model: str) -> None:
    """A rebuilt conversation (a transcript written by poolgate), then another
    one that evicts it (``max_conversations = 1``)."""
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-team-a", max_retries=0) as oai:
        oai.chat.completions.create(model=model, messages=[
            {"role": "user", "content": "my secret plan"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "go on"}])


def _check_private(home: Path, files: list[Path]) -> None:
    assert files
    for path in files:
        assert _mode(path) == 0o600, (path, oct(_mode(path)))
        for parent in path.parents:
            if not parent.is_relative_to(home):
                break
            assert _mode(parent) == 0o700, (parent, oct(_mode(parent)))


def test_claude_transcripts_are_private_and_go_with_their_conversation(tmp_path, open_umask):
    with FakeUpstream(api_key=TOKEN, models=("claude-sonnet-4-6",)) as upstream:
        home = claude_home(tmp_path / "a", TOKEN)
        worker = fake_claude_worker("claude-a", home, upstream.anthropic_url,
                                    tmp_path / "claude.log", max_conversations=1)
        with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            wait_for(lambda: worker_info(http)["claude-a"]["state"] == "ready")
            _two_conversations(srv, "claude-sonnet-4-6")
            first = _transcripts(home / "projects")
            assert len(first) == 1 and b"my secret plan" in first[0].read_bytes()
            _check_private(home, first)
            assert _mode(home / "workspace") == 0o700
            _two_conversations(srv, "claude-sonnet-4-6")  # evicts the first conversation
            wait_for(lambda: not first[0].exists(), timeout=10)
            assert len(_transcripts(home / "projects")) == 1
            http.post("/internal/workers/claude-a/stop", headers=ADMIN).raise_for_status()
            wait_for(lambda: not _transcripts(home / "projects"), timeout=15)


def test_qwen_transcripts_and_settings_are_private_and_transcripts_go(tmp_path, open_umask):
    with FakeUpstream(api_key=KEY, models=("qwen-coder",)) as upstream:
        home = tmp_path / "q"
        worker = fake_cli_worker("qwen", "qwen-a", home, upstream.url, tmp_path / "qwen.log",
                                 api_key=KEY, max_conversations=1)
        with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            wait_for(lambda: worker_info(http)["qwen-a"]["state"] == "ready")
            _two_conversations(srv, "qwen-coder")
            first = _transcripts(home / ".qwen" / "projects")
            assert first and any(b"my secret plan" in p.read_bytes() for p in first)
            _check_private(home, [*first, home / ".qwen" / "settings.json"])
            _two_conversations(srv, "qwen-coder")
            wait_for(lambda: not any(p.exists() for p in first), timeout=10)
            http.post("/internal/workers/qwen-a/stop", headers=ADMIN).raise_for_status()
            wait_for(lambda: not _transcripts(home / ".qwen" / "projects"), timeout=15)


NOT_STRICT = b'{\n  // the account\'s key\n  "security": {"auth": {"apiKey": "sk-keep-me"}},\n}\n'


def test_qwen_settings_that_are_not_strict_json_are_refused_never_rewritten(tmp_path, capfd):
    settings = tmp_path / "q" / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_bytes(NOT_STRICT)
    with FakeUpstream(api_key=KEY, models=("qwen-coder",)) as upstream:
        worker = fake_cli_worker("qwen", "qwen-a", tmp_path / "q", upstream.url,
                                 tmp_path / "qwen.log", api_key=KEY)
        with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            said: list[str] = []
            wait_for(lambda: said.extend(capfd.readouterr()) or "cli.start_refused" in "".join(said),
                     timeout=15)
            # the operator sees why in the worker's status, not only in the log
            wait_for(lambda: (worker_info(http)["qwen-a"].get("last_exit") or {}).get("detail"),
                     timeout=15)
            info = worker_info(http)["qwen-a"]
            assert info["state"] != "ready"
            assert info["last_exit"]["code"] == 78, info["last_exit"]  # EX_CONFIG, not a kill
            assert "is not strict JSON (line 2, column 3" in info["last_exit"]["detail"]
            assert "sk-keep-me" not in str(info)
    assert settings.read_bytes() == NOT_STRICT
    text = "".join(said) + "".join(capfd.readouterr())
    assert "is not strict JSON (line 2, column 3" in text and "sk-keep-me" not in text


def _workspace_transcripts(home: Path) -> list[Path]:
    return [p for p in _transcripts(home) if "workspaces" in p.parent.as_posix()
            or "workspaces" in p.parent.parent.as_posix()]


@pytest.mark.parametrize("cli", ["claude", "qwen"])
def test_agent_mode_transcripts_keyed_by_the_key_s_workspace_go_too(tmp_path, cli):
    """In agent mode a conversation runs in its key's workspace, so the CLI
    keys its transcript by that directory: it goes when the conversation ends,
    and one left by a worker killed mid-conversation goes at the next start."""
    model = "claude-sonnet-4-6" if cli == "claude" else "qwen-coder"
    with FakeUpstream(api_key=TOKEN if cli == "claude" else KEY, models=(model,)) as upstream:
        if cli == "claude":
            home = claude_home(tmp_path / "a", TOKEN)
            worker = fake_claude_worker("acct", home, upstream.anthropic_url,
                                        tmp_path / "cli.log", max_conversations=1,
                                        mode="agent", sandbox="none",
                                        workspace_root=str(tmp_path / "workspaces"))
        else:
            home = tmp_path / "q"
            worker = fake_cli_worker("qwen", "acct", home, upstream.url, tmp_path / "cli.log",
                                     api_key=KEY, models=(model,), max_conversations=1,
                                     mode="agent", sandbox="none",
                                     workspace_root=str(tmp_path / "workspaces"))
        with _gateway(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            wait_for(lambda: worker_info(http)["acct"]["state"] == "ready")
            _two_conversations(srv, model)
            first = _workspace_transcripts(home)
            assert first and any(b"my secret plan" in p.read_bytes() for p in first)
            _two_conversations(srv, model)  # evicts the first conversation
            wait_for(lambda: not any(p.exists() for p in first), timeout=10)
            left = _workspace_transcripts(home)
            assert left
            pid = worker_info(http)["acct"]["pid"]
            os.kill(pid, 9)  # dies with its conversation open: nothing closes it
            wait_for(lambda: worker_info(http)["acct"]["pid"] not in (None, pid)
                     and worker_info(http)["acct"]["state"] == "ready", timeout=30)
            assert not any(p.exists() for p in left), left
