"""Agent mode in a sandbox, over a real gateway process: a fake Claude Code
(stdlib, running its ``Read`` tool itself, as the real one does) is told by
the fake upstream to read what a tool must never see: the gateway's
environment, its config file, another account's credentials and another
key's workspace. Under ``sandbox = "auto"`` (bubblewrap here) every read
fails; the same worker with ``sandbox = "none"`` reads them all (which is
what the sandbox is for, and shows the test can see a leak). A machine that
can give no sandbox refuses agent mode at start, saying why."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import pytest

from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import FAKE_CLAUDE, claude_home
from tests.support.ports import free_port

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")]

REPO = Path(__file__).resolve().parents[2]
TOKEN = "sk-ant-oat01-account-a-token"
OTHER_TOKEN = "sk-ant-oat01-account-b-must-stay-hidden"
ADMIN_SECRET = "admin-secret-in-the-gateway-env"
KEY_A, KEY_B = "sk-team-a-secret-key", "sk-team-b-secret-key"
CONFIG_MARKER = "config-file-marker-5b1e"
B_WORKSPACE_SECRET = "team-b private notes 9d0c"
BOXED, OPEN = "claude-sonnet-4-6", "claude-open-model"
SECRETS = (ADMIN_SECRET, KEY_A, KEY_B, OTHER_TOKEN, CONFIG_MARKER, B_WORKSPACE_SECRET)


def _worker(name: str, model: str, home: Path, upstream: FakeUpstream, *, sandbox: str,
            mode: str = "agent") -> str:
    log = home / "fake-claude.log"
    return textwrap.dedent(f"""
        [[workers]]
        name = "{name}"
        kind = "cli"
        cli = "claude"
        models = ["{model}"]
        home = "{home}"
        command = [{json.dumps(sys.executable)}, {json.dumps(str(FAKE_CLAUDE))}]
        env = {{ ANTHROPIC_BASE_URL = "{upstream.anthropic_url}", FAKE_CLAUDE_LOG = "{log}" }}
        mode = "{mode}"
        sandbox = "{sandbox}"
        health_interval = 0.5
        """)


def _start_gateway(config: Path, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``poolgate serve`` as its own process (its output in ``<config>.log``)."""
    with open(f"{config}.log", "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--config", str(config), "--host",
             "127.0.0.1", "--port", str(port), "--log-format", "json"],
            env=env, cwd=str(REPO), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)


def _gateway_env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
            "HOME": os.environ.get("HOME", "/root"), "POOLGATE_ADMIN_TOKEN": ADMIN_SECRET,
            "POOLGATE_API_KEYS": f"team-a={KEY_A},team-b={KEY_B}", **extra}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sandbox")
    with FakeUpstream(api_key=TOKEN, models=(BOXED, OPEN)) as upstream:
        home_a = claude_home(tmp / "a", TOKEN)
        home_open = claude_home(tmp / "open", TOKEN)
        home_b = claude_home(tmp / "b", OTHER_TOKEN)  # another account of the same gateway
        for home in (home_a, home_open):
            workspace_b = Path(f"{home}-workspaces") / "team-b"
            workspace_b.mkdir(parents=True)
            (workspace_b / "notes.txt").write_text(B_WORKSPACE_SECRET)
        config = tmp / "poolgate.toml"
        config.write_text(f"# {CONFIG_MARKER}\n"
                          + _worker("boxed", BOXED, home_a, upstream, sandbox="auto")
                          + _worker("open", OPEN, home_open, upstream, sandbox="none")
                          + _worker("other", "claude-other", home_b, upstream, sandbox="auto",
                                    mode="chat"))
        config.chmod(0o600)
        port = free_port()
        proc = _start_gateway(config, port, _gateway_env())
        url = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=url, timeout=30,
                              headers={"authorization": f"Bearer {ADMIN_SECRET}"}) as http:
                deadline = time.monotonic() + 60
                while True:
                    assert proc.poll() is None, Path(f"{config}.log").read_text()[-3000:]
                    try:
                        workers = http.get("/internal/workers").json()["workers"]
                        if all(w["state"] == "ready" for w in workers) and len(workers) == 3:
                            break
                    except (httpx.HTTPError, KeyError, ValueError):
                        pass
                    assert time.monotonic() < deadline, "the gateway did not get ready"
                    time.sleep(0.2)
                yield {"url": url, "pid": proc.pid, "upstream": upstream, "config": config,
                       "home_b": home_b, "workers": {w["name"]: w for w in workers}, "tmp": tmp}
        finally:
            _stop(proc)


def _targets(gw: dict[str, Any], home: Path) -> dict[str, str]:
    return {"gateway environment": f"/proc/{gw['pid']}/environ",
            "gateway config": str(gw["config"]),
            "other account's credentials": str(gw["home_b"] / ".credentials.json"),
            "other key's workspace": str(Path(f"{home}-workspaces") / "team-b" / "notes.txt")}


def _read_through_the_cli(gw: dict[str, Any], model: str, path: str) -> list[dict[str, Any]]:
    """Ask as team-a for a Read of ``path``; the content blocks the client got."""
    before = len(gw["upstream"].requests)
    with anthropic.Anthropic(base_url=gw["url"], api_key=KEY_A, max_retries=0) as client:
        out = client.messages.create(model=model, max_tokens=64, messages=[
            {"role": "user", "content": f'[[tool:Read {json.dumps({"file_path": path})}]]'}])
    blocks = [b.to_dict() for b in out.content]
    # what the CLI sent back upstream as the tool's result
    sent = [r.body for r in gw["upstream"].requests[before:] if r.body]
    return blocks + [m for body in sent for m in body["messages"]]


def _leaked(blocks: list[dict[str, Any]]) -> list[str]:
    text = json.dumps(blocks)
    return [s for s in SECRETS if s in text]


@pytest.mark.parametrize("what", ["gateway environment", "gateway config",
                                  "other account's credentials", "other key's workspace"])
def test_a_sandboxed_tool_reads_none_of_the_secrets(gateway, what):
    path = _targets(gateway, gateway["tmp"] / "a")[what]
    assert gateway["workers"]["boxed"]["sandbox"] == "bwrap"
    blocks = _read_through_the_cli(gateway, BOXED, path)
    results = [b for b in blocks if b.get("type") == "mcp_tool_result"]
    assert results and results[0]["is_error"] is True  # the file is not there for the tool
    assert _leaked(blocks) == []


def test_without_a_sandbox_the_same_reads_leak(gateway):
    """``sandbox = "none"``, written out: the tool reads everything the gateway's user can."""
    assert gateway["workers"]["open"]["sandbox"] == "none"
    home_open = gateway["tmp"] / "open"
    leaked = set()
    for path in _targets(gateway, home_open).values():
        leaked.update(_leaked(_read_through_the_cli(gateway, OPEN, path)))
    assert {ADMIN_SECRET, KEY_A, CONFIG_MARKER, OTHER_TOKEN, B_WORKSPACE_SECRET} <= leaked


def test_the_key_works_in_its_own_workspace(gateway):
    home_a = gateway["tmp"] / "a"
    mine = Path(f"{home_a}-workspaces") / "team-a"
    (mine / "todo.txt").write_text("team-a's own file")
    blocks = _read_through_the_cli(gateway, BOXED, "todo.txt")
    result = next(b for b in blocks if b.get("type") == "mcp_tool_result")
    assert result["is_error"] is False and result["content"][0]["text"] == "team-a's own file"


def test_agent_mode_without_any_sandbox_is_refused_at_start(tmp_path):
    """No bwrap on PATH, not root (or no setpriv): ``auto`` refuses, saying why."""
    with FakeUpstream(api_key=TOKEN, models=(BOXED,)) as upstream:
        home = claude_home(tmp_path / "a", TOKEN)
        config = tmp_path / "poolgate.toml"
        config.write_text(_worker("boxed", BOXED, home, upstream, sandbox="auto"))
        empty = tmp_path / "empty-path"
        empty.mkdir()
        proc = _start_gateway(config, free_port(), _gateway_env(PATH=str(empty)))
        try:
            proc.wait(timeout=60)
        finally:
            _stop(proc)
    text = Path(f"{config}.log").read_text()
    assert proc.returncode != 0
    assert "agent mode needs a sandbox" in text and "bwrap is not on PATH" in text
    assert 'sandbox = \\"none\\"' in text or 'sandbox = "none"' in text
