"""CLI login drivers: which CLI logs in how."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pool.cli.login import ClaudeLogin, CodexLogin, LoginFailed, LoginUnsupported, make_login

FAKE_CLAUDE = (sys.executable, str(Path(__file__).resolve().parents[1] / "fakes" /
                                    "fake_claude.py"))


def test_each_cli_gets_its_own_login_and_qwen_none(tmp_path: Path) -> None:
    assert isinstance(make_login("claude", home=str(tmp_path), env={},
                                 command=FAKE_CLAUDE), ClaudeLogin)
    assert isinstance(make_login("codex", home=str(tmp_path), env={},
                                 command=("codex",)), CodexLogin)
    for cli in ("qwen", "jsonrpc"):
        with pytest.raises(LoginUnsupported) as info:
            make_login(cli, home=str(tmp_path), env={})
        assert info.value.reason == "unsupported" and "API key" in str(info.value)


async def test_claude_login_shows_the_url_and_a_wrong_state_is_refused(tmp_path: Path) -> None:
    login = ClaudeLogin(home=str(tmp_path / "h"),
                        env={"FAKE_CLAUDE_OAUTH_URL": "http://127.0.0.1:9"}, command=FAKE_CLAUDE)
    try:
        challenge = await login.begin(30)
        assert challenge.url.startswith("http://127.0.0.1:9/oauth/authorize?")
        assert challenge.wants_code
        with pytest.raises(LoginFailed) as info:
            await login.submit("secret-code#not-its-state", 30)
        assert info.value.reason == "code_refused"
        assert "secret-code" not in str(info.value)
    finally:
        await login.close()
