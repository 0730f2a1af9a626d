"""Which sandbox agent mode gets (pool/cli/sandbox.py): the real bwrap probe,
the refusal when none works, and the per-key workspace names."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pydantic
import pytest

from app.worker_settings import WorkerSettings
from pool.cli.sandbox import Sandbox, SandboxUnavailable, key_dir, resolve_sandbox


def _resolve(setting: str, tmp_path: Path, *, path: str | None = None, **kw):
    env = {"PATH": path if path is not None else os.environ.get("PATH", "/usr/bin:/bin")}
    kw.setdefault("mode", "agent")
    kw.setdefault("cli", "claude")
    return resolve_sandbox(setting, name="w1", home=str(tmp_path / "home"), env=env, **kw)


def _empty_path(tmp_path: Path) -> str:
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    return str(empty)


def test_chat_mode_and_an_explicit_none_run_without_a_sandbox(tmp_path):
    assert _resolve("auto", tmp_path, mode="chat", path=_empty_path(tmp_path)).kind == "none"
    assert _resolve("none", tmp_path, path=_empty_path(tmp_path)).kind == "none"
    assert Sandbox().command(["claude", "-p"], cwd="/x") == ["claude", "-p"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_auto_takes_bubblewrap_when_it_runs(tmp_path):
    box = _resolve("auto", tmp_path)
    assert box.kind == "bwrap" and box.home == str(tmp_path / "home")
    argv = box.command(["/usr/bin/env"], cwd=str(tmp_path / "ws"), writable=[str(tmp_path / "ws")])
    assert argv[0] == box.tool and argv[-2:] == ["--", "/usr/bin/env"]
    assert "--unshare-pid" in argv and argv[argv.index("--proc") + 1] == "/proc"


def test_auto_refuses_agent_mode_when_nothing_works_and_says_why(tmp_path):
    with pytest.raises(SandboxUnavailable) as err:
        _resolve("auto", tmp_path, path=_empty_path(tmp_path), is_root=False)
    message = str(err.value)
    assert message.startswith("worker w1: agent mode needs a sandbox")
    assert "bwrap is not on PATH" in message and "does not run as root" in message
    assert 'set sandbox = "none"' in message


def test_an_explicit_choice_that_does_not_work_is_refused(tmp_path):
    with pytest.raises(SandboxUnavailable, match="bwrap: bwrap is not on PATH"):
        _resolve("bwrap", tmp_path, path=_empty_path(tmp_path))
    with pytest.raises(SandboxUnavailable, match="uid: poolgate does not run as root"):
        _resolve("uid", tmp_path, is_root=False)


def test_auto_falls_back_to_codex_own_sandbox_but_not_to_full_access(tmp_path):
    empty = _empty_path(tmp_path)
    assert _resolve("auto", tmp_path, path=empty, is_root=False, cli="codex").kind == "cli"
    with pytest.raises(SandboxUnavailable, match="danger-full-access"):
        _resolve("auto", tmp_path, path=empty, is_root=False, cli="codex",
                 options={"sandbox": "danger-full-access"})


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv")
def test_uid_runs_the_cli_as_the_account_s_own_uid(tmp_path):
    box = _resolve("uid", tmp_path)
    assert box.kind == "uid" and box.uid is not None and box.uid >= 200_000
    assert box.command(["claude"], cwd="/x")[-2:] == ["--", "claude"]
    workspace = tmp_path / "ws" / "team-a"
    box.prepare(str(workspace))
    assert workspace.stat().st_uid == box.uid and (workspace.stat().st_mode & 0o777) == 0o700


def test_a_key_s_workspace_name_never_leaves_the_root():
    assert key_dir("team-a") == "team-a"
    assert key_dir(None) == key_dir("") == "_default"
    for hostile in ("../b", "a/b", ".hidden", "x" * 100, "ö"):
        name = key_dir(hostile)
        assert "/" not in name and not name.startswith(".") and name.startswith("key-")
    assert key_dir("../b") != key_dir("a/b")
    # a run-time key's id (ChatRequest.key_name): the same name each time, safe, its own
    first, second = "key:" + "0a" * 12, "key:" + "0b" * 12
    assert key_dir(first) == key_dir(first) == "key-" + key_dir(first)[4:]
    assert "/" not in key_dir(first) and ":" not in key_dir(first)
    assert key_dir(first) != key_dir(second)


def test_the_setting_is_named_sandbox_and_defaults_to_auto():
    base = dict(name="c", kind="cli", cli="claude", home="/h", models=("m",))
    assert WorkerSettings(**base).sandbox == "auto"
    with pytest.raises(pydantic.ValidationError, match="sandbox"):
        WorkerSettings(**base, sandbox="chroot")


def test_a_script_run_by_an_interpreter_with_options_is_bound_too(tmp_path):
    """Qwen Code 0.24 runs as ``node --expose-gc <npm>/node_modules/…/cli.js``:
    the script's install is bound even though an option comes first."""
    script = tmp_path / "npm" / "node_modules" / "@qwen-code" / "qwen-code" / "cli.js"
    script.parent.mkdir(parents=True)
    script.write_text("")
    node = tmp_path / "node" / "bin" / "node"
    node.parent.mkdir(parents=True)
    node.write_text("")
    box = Sandbox(kind="bwrap", tool="/usr/bin/bwrap", home=str(tmp_path / "home"))
    argv = box.command([str(node), "--expose-gc", str(script), "--model=m"],
                       cwd=str(tmp_path / "home"))
    binds = {argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind-try"}
    assert str(tmp_path / "npm" / "node_modules") in binds
    assert str(tmp_path / "node") in binds
    assert argv[argv.index("--") + 1:] == [str(node), "--expose-gc", str(script), "--model=m"]
