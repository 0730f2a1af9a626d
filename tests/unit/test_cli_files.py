"""What poolgate writes for an account is private whatever the umask: 0600
files in 0700 directories (transcripts, Qwen's settings, imported bundles)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pool.cli import claude_transcript, qwen_transcript
from pool.cli.qwen_home import QwenHome
from pool.model import Message, TextPart
from sessions.bundles import export_bundle, import_bundle

HISTORY = (Message("user", (TextPart("my secret plan"),)), Message("assistant", (TextPart("ok"),)))
CWD = "/srv/acct/workspace"


@pytest.fixture
def open_umask():
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _private(root: Path, path: Path) -> None:
    """``path`` is 0600 and every directory from ``root`` down to it is 0700."""
    assert _mode(path) == 0o600, (path, oct(_mode(path)))
    for directory in [root, *[p for p in path.parents if p.is_relative_to(root) and p != root]]:
        assert _mode(directory) == 0o700, (directory, oct(_mode(directory)))


def test_claude_transcript_is_private_and_forgotten(tmp_path, open_umask):
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    path = Path(claude_transcript.write_transcript(str(home), CWD, "sid-1", "m", HISTORY, ()))
    assert _mode(path) == 0o600
    _private(home / "projects", path)
    claude_transcript.forget_session(str(home), CWD, "sid-1")
    assert not path.exists()


def test_qwen_transcript_is_private_and_forgotten(tmp_path, open_umask):
    home = tmp_path / "home"
    sid = qwen_transcript.write_transcript(home, CWD, HISTORY, version=None)
    path = qwen_transcript.chats_dir(home, CWD) / f"{sid}.jsonl"
    _private(home, path)
    qwen_transcript.forget_session(home, CWD, sid)
    assert not path.exists()


def test_qwen_settings_are_private(tmp_path, open_umask):
    home = tmp_path / "home"
    QwenHome(home, "openai", {}).write()
    _private(home, home / ".qwen" / "settings.json")


def test_an_imported_bundle_is_private(tmp_path, open_umask):
    source = tmp_path / "source"
    (source / ".qwen").mkdir(parents=True)
    (source / ".qwen" / "settings.json").write_text('{"security": {"auth": {"apiKey": "k"}}}')
    data = export_bundle("qwen", source)
    home = tmp_path / "target"
    home.mkdir(mode=0o777)
    import_bundle(data, "qwen", home)
    _private(home, home / ".qwen" / "settings.json")
