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


FAKE_GEMINI = (sys.executable, str(Path(__file__).resolve().parents[1] / "fakes" /
                                    "fake_gemini.py"))


async def test_gemini_login_shows_google_s_url_and_writes_the_credentials(tmp_path: Path) -> None:
    from pool.cli.gemini_home import GeminiHome
    from pool.cli.gemini_login import GeminiLogin

    home = tmp_path / "h"
    login = make_login("gemini", home=str(home), env={"GEMINI_API_KEY": "k"},
                       command=FAKE_GEMINI)
    assert isinstance(login, GeminiLogin)
    try:
        challenge = await login.begin(30)
        assert challenge.url.startswith("https://accounts.google.com/o/oauth2/v2/auth?")
        assert "codeassist.google.com" in challenge.url and challenge.wants_code
        with pytest.raises(LoginFailed) as info:  # refused: asked again, nothing written
            await login.submit("bad-secret-code", 10)
        assert info.value.reason == "code_refused" and "bad-secret-code" not in str(info.value)
        await login.submit("good-code", 30)
    finally:
        await login.close()
    account = GeminiHome(home, {}, "chat")
    assert account.selected_auth() == "oauth-personal" and account.has_credentials()
    assert login.proc is not None and login.proc.returncode is not None  # ended after the login
