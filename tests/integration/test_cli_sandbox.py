"""Agent mode in a sandbox, over a real gateway process: a fake Claude Code
(stdlib, running its ``Read`` tool itself, as the real one does) is told by
the fake upstream to read what a tool must never see: the gateway's
environment, its config file, another account's credentials and another
key's workspace. Under ``sandbox = "auto"`` (bubblewrap here) every read
fails; the same worker with ``sandbox = "none"`` reads them all (which is
what the sandbox is for, and shows the test can see a leak). A machine that
can give no sandbox refuses agent mode at start, saying why."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import anthropic
import httpx
import pytest

from pool.cli.sandbox import resolve_sandbox
from tests.fakes.upstreams import FakeUpstream
from tests.integration.clis import CLAUDE_CODE, NPM_PREFIX, ensure_cli
from tests.support.cli_accounts import FAKE_CLAUDE, claude_home
from tests.support.ports import free_port
from tests.support.server_http import with_server_http

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
            mode: str = "agent", command: Sequence[str] = (),
            env: Mapping[str, str] | None = None, permission_mode: str | None = None) -> str:
    """One ``[[workers]]`` entry: the fake Claude Code unless ``command`` is given."""
    env = {"ANTHROPIC_BASE_URL": upstream.anthropic_url,
           "FAKE_CLAUDE_LOG": str(home / "fake-claude.log"), **(env or {})}
    command = command or (sys.executable, str(FAKE_CLAUDE))
    options = (f'cli_options = {{ permission_mode = "{permission_mode}" }}\n'
               if permission_mode else "")
    return textwrap.dedent(f"""
        [[workers]]
        name = "{name}"
        kind = "cli"
        cli = "claude"
        models = ["{model}"]
        home = "{home}"
        command = {json.dumps(list(command))}
        env = {{ {", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())} }}
        mode = "{mode}"
        sandbox = "{sandbox}"
        health_interval = 0.5
        ready_timeout = 60
        """) + options


def _start_gateway(config: Path, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``poolgate serve`` as its own process (its output in ``<config>.log``)."""
    with open(f"{config}.log", "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--config", str(config), "--host",
             "127.0.0.1", "--port", str(port), "--log-format", "json"],
            env=with_server_http(env), cwd=str(REPO), stdin=subprocess.DEVNULL, stdout=out,
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


@contextlib.contextmanager
def _serving(tmp: Path, workers: str, upstream: FakeUpstream,
             *homes: Path) -> Iterator[dict[str, Any]]:
    """``workers`` behind ``poolgate serve`` (own process), keys team-a and team-b,
    with a file of team-b's in the workspace root of each of ``homes``; once
    every worker is ready."""
    for home in homes:
        workspace_b = Path(f"{home}-workspaces") / "team-b"
        workspace_b.mkdir(parents=True)
        (workspace_b / "notes.txt").write_text(B_WORKSPACE_SECRET)
    config = tmp / "poolgate.toml"
    config.write_text(f"# {CONFIG_MARKER}\n" + workers)
    config.chmod(0o600)
    port = free_port()
    proc = _start_gateway(config, port, _gateway_env())
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30,
                          headers={"authorization": f"Bearer {ADMIN_SECRET}"}) as http:
            deadline = time.monotonic() + 90
            while True:
                assert proc.poll() is None, Path(f"{config}.log").read_text()[-3000:]
                try:
                    listed = http.get("/internal/workers").json()["workers"]
                    if all(w["state"] == "ready" and w["login"] == "ready" for w in listed):
                        break
                except (httpx.HTTPError, KeyError, ValueError):
                    pass
                assert time.monotonic() < deadline, "the gateway did not get ready"
                time.sleep(0.2)
            yield {"url": url, "pid": proc.pid, "upstream": upstream, "config": config,
                   "workers": {w["name"]: w for w in listed}, "tmp": tmp}
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sandbox")
    with FakeUpstream(api_key=TOKEN, models=(BOXED, OPEN)) as upstream:
        home_a = claude_home(tmp / "a", TOKEN)
        home_open = claude_home(tmp / "open", TOKEN)
        home_b = claude_home(tmp / "b", OTHER_TOKEN)  # another account of the same gateway
        workers = (_worker("boxed", BOXED, home_a, upstream, sandbox="auto")
                   + _worker("open", OPEN, home_open, upstream, sandbox="none")
                   + _worker("other", "claude-other", home_b, upstream, sandbox="auto",
                             mode="chat"))
        with _serving(tmp, workers, upstream, home_a, home_open) as gw:
            yield gw


def _targets(gw: dict[str, Any], home: Path) -> dict[str, str]:
    return {"gateway environment": f"/proc/{gw['pid']}/environ",
            "gateway config": str(gw["config"]),
            "other account's credentials": str(gw["tmp"] / "b" / ".credentials.json"),
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


# --- the real Claude Code binary ---------------------------------------------------------

REAL = "claude-sonnet-4-6"
REAL_OPEN = "claude-opus-4-6"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The real ``claude`` in agent mode, tools allowed without asking, against
    the fake upstream: ``boxed`` under ``sandbox = "auto"``, ``open`` under "none"."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Claude Code")
    assert ensure_cli(*CLAUDE_CODE) is not None
    native = NPM_PREFIX / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    assert native.exists()
    tmp = tmp_path_factory.mktemp("sandbox-real")
    with FakeUpstream(api_key=TOKEN, models=(REAL, REAL_OPEN)) as upstream:
        homes = {name: claude_home(tmp / name, TOKEN) for name in ("a", "open")}
        claude_home(tmp / "b", OTHER_TOKEN)
        workers = ""
        for name, model, sandbox in (("a", REAL, "auto"), ("open", REAL_OPEN, "none")):
            # IS_SANDBOX: Claude Code allows bypassPermissions as root only when told so
            env = {"ANTHROPIC_SMALL_FAST_MODEL": model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
                   "IS_SANDBOX": "1"}
            workers += _worker(name, model, homes[name], upstream, sandbox=sandbox,
                               command=(str(native),), env=env,
                               permission_mode="bypassPermissions")
        with _serving(tmp, workers, upstream, *homes.values()) as gw:
            yield gw


def _calls(gw: dict[str, Any], home: Path) -> dict[str, str]:
    """What the fake upstream has the model call, per secret to reach."""
    targets = _targets(gw, home)
    bash = {"command": f"cat {targets.pop('gateway environment')}", "description": "read"}
    return {"gateway environment": f"[[tool:Bash {json.dumps(bash)}]]",
            **{what: f'[[tool:Read {json.dumps({"file_path": path})}]]'
               for what, path in targets.items()}}


def _tool_results_sent_upstream(gw: dict[str, Any], model: str, prompt: str) -> list[Any]:
    before = len(gw["upstream"].requests)
    with anthropic.Anthropic(base_url=gw["url"], api_key=KEY_A, max_retries=0,
                             timeout=120) as client:
        client.messages.create(model=model, max_tokens=256,
                               messages=[{"role": "user", "content": prompt}])
    return [block for r in gw["upstream"].requests[before:] if r.body
            for m in r.body.get("messages", []) if isinstance(m.get("content"), list)
            for block in m["content"] if block.get("type") == "tool_result"]


@pytest.mark.cli
@pytest.mark.parametrize("what", ["gateway environment", "gateway config",
                                  "other account's credentials", "other key's workspace"])
def test_the_real_claude_in_its_sandbox_sends_no_secret_upstream(real, what):
    assert real["workers"]["a"]["sandbox"] == "bwrap"
    results = _tool_results_sent_upstream(real, REAL, _calls(real, real["tmp"] / "a")[what])
    assert results  # the tool ran and the CLI sent its result back: nothing was there
    assert all(r["is_error"] and ("No such file" in json.dumps(r) or "does not exist" in
                                  json.dumps(r)) for r in results)
    assert _leaked(results) == []


@pytest.mark.cli
def test_the_real_claude_without_a_sandbox_sends_them_all(real):
    """The same calls, ``sandbox = "none"``: what the sandbox keeps in."""
    leaked: set[str] = set()
    for prompt in _calls(real, real["tmp"] / "open").values():
        leaked.update(_leaked(_tool_results_sent_upstream(real, REAL_OPEN, prompt)))
    assert {ADMIN_SECRET, KEY_A, CONFIG_MARKER, OTHER_TOKEN, B_WORKSPACE_SECRET} <= leaked


# --- the real Codex, whose own sandbox runs inside ours ----------------------------------

@pytest.mark.cli
@pytest.mark.parametrize("setting", ["auto", "none"])
async def test_the_real_codex_runs_its_shell_in_the_key_s_workspace_and_no_further(setting):
    """Codex (one app-server per account) in agent mode under ``auto``: its shell
    tool works in the key's workspace (Codex's own bubblewrap inside ours), and
    a ``cat`` of another process's environment or another account's
    ``auth.json`` finds nothing; under ``none`` (Codex's own sandbox alone) the
    other account's file leaks. Homes outside
    ``/tmp``: Codex makes its sandbox helper only there (see cli-workers.md)."""
    from pool.cli.codex import CodexDriver
    from pool.cli.events import ConversationSetup, ToolOutput
    from tests.fakes.responses_upstream import ResponsesUpstream
    from tests.integration.test_codex_driver import (KEY, MODEL, account_home, collect,
                                                     driver_config, real_command, text_of,
                                                     user)

    root = Path(tempfile.mkdtemp(prefix="poolgate-codex-sandbox-", dir="/var/tmp"))
    holder = subprocess.Popen(["sleep", "120"], env={"GW_SECRET": ADMIN_SECRET})
    try:
        other = account_home(root / "other", OTHER_TOKEN)
        with ResponsesUpstream(api_key=KEY, models=(MODEL,)) as upstream:
            config = driver_config(account_home(root / "a", KEY), real_command(), upstream)
            config = replace(config, mode="agent", workspace_root=str(root / "workspaces"),
                             sandbox=resolve_sandbox(setting, name="codex-a", mode="agent",
                                                     cli="codex", home=config.home,
                                                     env=config.env))
            Path(config.cwd).mkdir(parents=True)
            workspace = config.workspace("team-a")
            os.makedirs(workspace)
            Path(workspace, "mine.txt").write_text("team-a's own file")
            codex = CodexDriver(config)
            outputs = []
            try:
                await codex.start()
                for cmd in ("cat mine.txt", f"cat /proc/{holder.pid}/environ",
                            f"cat {other / 'auth.json'}"):
                    conv = await codex.open(ConversationSetup(model=MODEL, system="S",
                                                              workspace=workspace))
                    call = json.dumps({"cmd": cmd})
                    events = await collect(conv.send(user(f"[[tool:exec_command {call}]]")))
                    # the tool's output as reported, and as the model was given it
                    outputs.append(json.dumps([e.content for e in events
                                               if isinstance(e, ToolOutput)]) + text_of(events))
                    await conv.close()
            finally:
                await codex.stop()
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(root, ignore_errors=True)
    assert "team-a's own file" in outputs[0]
    leaked = [s for s in (ADMIN_SECRET, OTHER_TOKEN) if any(s in o for o in outputs[1:])]
    # Codex's own sandbox (read-only) hides other processes, not other files
    assert leaked == ([] if setting == "auto" else [OTHER_TOKEN])


# --- a uid of the account's own (poolgate as root) ---------------------------------------

@pytest.mark.cli
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv")
async def test_the_real_claude_as_the_account_s_own_uid_reads_neither_secret():
    """``sandbox = "uid"``: the real Claude Code runs as the account's uid; a
    Bash tool can read neither a root process's environment nor another
    account's (0700) credentials, and works in its key's workspace."""
    from pool.cli.claude import ClaudeDriver
    from pool.cli.driver import DriverConfig
    from pool.cli.events import ConversationSetup, Turn
    from pool.model import Message, TextPart

    if ensure_cli(*CLAUDE_CODE) is None:
        pytest.skip("cannot install Claude Code")
    native = NPM_PREFIX / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    root = Path(tempfile.mkdtemp(prefix="poolgate-uid-", dir="/var/tmp"))
    root.chmod(0o755)  # the account's uid walks through it to its home
    holder = subprocess.Popen(["sleep", "120"], env={"GW_SECRET": ADMIN_SECRET})
    try:
        with FakeUpstream(api_key=TOKEN, models=(REAL,)) as upstream:
            home = claude_home(root / "a", TOKEN)
            other = claude_home(root / "b", OTHER_TOKEN)
            other.chmod(0o700)
            env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "IS_SANDBOX": "1",
                   "ANTHROPIC_BASE_URL": upstream.anthropic_url,
                   "ANTHROPIC_SMALL_FAST_MODEL": REAL, "ANTHROPIC_DEFAULT_HAIKU_MODEL": REAL}
            sandbox = resolve_sandbox("uid", name="claude-a", mode="agent", cli="claude",
                                      home=str(home), env=env)
            config = DriverConfig(name="claude-a", cli="claude", home=str(home),
                                  cwd=str(root / "cwd"), command=(str(native),), env=env,
                                  mode="agent", options={"permission_mode": "bypassPermissions"},
                                  workspace_root=str(root / "workspaces"), sandbox=sandbox)
            os.makedirs(config.cwd)
            driver = ClaudeDriver(config)
            await driver.start()
            workspace = config.workspace("team-a")
            sandbox.prepare(workspace)
            conv = await driver.open(ConversationSetup(model=REAL, system="S", workspace=workspace))
            outputs = {}
            try:
                for cmd in ("id -u; pwd", f"cat /proc/{holder.pid}/environ",
                            f"cat {other / '.credentials.json'}"):
                    call = json.dumps({"command": cmd, "description": "run"})
                    turn = Turn((Message("user", (TextPart(f"[[tool:Bash {call}]]"),)),))
                    outputs[cmd] = " ".join([e.content async for e in _only(conv.send(turn))])
            finally:
                await conv.close()
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(root, ignore_errors=True)
    first, environ, credentials = outputs.values()
    assert first.split() == [str(sandbox.uid), workspace]
    assert "Permission denied" in environ and ADMIN_SECRET not in environ
    assert "Permission denied" in credentials and OTHER_TOKEN not in credentials


async def _only(events):  # type: ignore[no-untyped-def]
    from pool.cli.events import ToolOutput

    async for event in events:
        if isinstance(event, ToolOutput):
            yield event
