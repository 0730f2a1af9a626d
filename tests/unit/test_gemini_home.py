"""A Gemini CLI account's home: the settings the driver writes, what counts as
credentials, the system prompt files, and its files in a session bundle."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from pool.cli.driver import DriverConfig, DriverError
from pool.cli.gemini import GeminiDriver
from pool.cli.gemini_home import API_KEY_AUTH, CHAT_EXCLUDED_TOOLS, OAUTH_AUTH, GeminiHome
from sessions.bundles import export_bundle, import_bundle, read_bundle


def _settings(home: Path) -> dict:
    return json.loads((home / ".gemini" / "settings.json").read_text())


def test_chat_mode_settings_keep_the_account_s_own_and_turn_tools_off(tmp_path: Path):
    (tmp_path / ".gemini").mkdir()
    (tmp_path / ".gemini" / "settings.json").write_text(
        json.dumps({"model": {"name": "gemini-2.5-pro"}, "security": {"auth": {
            "selectedType": OAUTH_AUTH}}}))
    GeminiHome(tmp_path, {"GEMINI_API_KEY": "k"}, "chat").write()
    settings = _settings(tmp_path)
    assert settings["model"] == {"name": "gemini-2.5-pro"}
    assert settings["security"]["auth"]["selectedType"] == OAUTH_AUTH  # the account's choice
    assert settings["tools"]["exclude"] == CHAT_EXCLUDED_TOOLS and "core" not in settings["tools"]
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert stat.S_IMODE((tmp_path / ".gemini" / "settings.json").stat().st_mode) == 0o600
    # the same account in agent mode: its tools come back
    GeminiHome(tmp_path, {}, "agent").write()
    assert "exclude" not in _settings(tmp_path).get("tools", {})


def test_settings_that_are_not_strict_json_are_refused_untouched(tmp_path: Path):
    (tmp_path / ".gemini").mkdir()
    (tmp_path / ".gemini" / "settings.json").write_text('{"a": 1,}')
    with pytest.raises(DriverError, match="not strict JSON"):
        GeminiHome(tmp_path, {}, "chat").write()
    assert (tmp_path / ".gemini" / "settings.json").read_text() == '{"a": 1,}'


@pytest.mark.parametrize("env, files, expected", [
    ({"GEMINI_API_KEY": "k"}, {}, True),
    ({}, {}, False),
    ({}, {".gemini/.env": "GEMINI_API_KEY=k\n"}, True),
    ({}, {".env": "GEMINI_API_KEY=\n"}, False),
])
def test_api_key_accounts(tmp_path: Path, env, files, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    home = GeminiHome(tmp_path, env, "chat")
    home.write()
    if env:
        assert home.selected_auth() == API_KEY_AUTH
    else:  # no key in the environment: a Google login unless the settings say otherwise
        (tmp_path / ".gemini" / "settings.json").write_text(json.dumps(
            {"security": {"auth": {"selectedType": API_KEY_AUTH}}}))
    assert home.has_credentials() is expected


def test_a_google_login_is_its_oauth_file(tmp_path: Path):
    home = GeminiHome(tmp_path, {}, "chat")
    home.write()
    assert home.selected_auth() == OAUTH_AUTH and not home.has_credentials()
    (tmp_path / ".gemini" / "oauth_creds.json").write_text('{"refresh_token": "r"}')
    assert home.has_credentials() and home.credentials_stamp() is not None


def test_system_prompt_files_are_private_and_removed(tmp_path: Path):
    home = GeminiHome(tmp_path, {}, "chat")
    path = home.system_prompt_file("be brief")
    assert path.read_text() == "be brief" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    home.forget(path)
    assert not path.exists()


def test_a_google_login_travels_in_a_bundle(tmp_path: Path):
    source = tmp_path / "a"
    (source / ".gemini").mkdir(parents=True)
    creds = b'{"access_token": "ya29.x", "refresh_token": "1//r"}'
    (source / ".gemini" / "oauth_creds.json").write_bytes(creds)
    (source / ".gemini" / "google_accounts.json").write_bytes(b'{"active": "a@example.com"}')
    (source / ".gemini" / "tmp").mkdir()  # conversations: never in a bundle
    (source / ".gemini" / "tmp" / "chat.json").write_bytes(b"{}")
    data = export_bundle("gemini", source, version="0.61.0")
    _, members = read_bundle(data, "gemini")
    assert sorted(members) == [".gemini/google_accounts.json", ".gemini/oauth_creds.json"]
    target = tmp_path / "b"
    import_bundle(data, "gemini", target)
    assert (target / ".gemini" / "oauth_creds.json").read_bytes() == creds
    assert GeminiHome(target, {}, "chat").has_credentials()


def test_unknown_cli_options_are_refused_by_name(tmp_path: Path):
    config = DriverConfig(name="g", cli="gemini", home=str(tmp_path), cwd=str(tmp_path / "w"),
                          options={"approval": "yolo"})
    with pytest.raises(DriverError, match="cli_options.approval"):
        GeminiDriver(config)
