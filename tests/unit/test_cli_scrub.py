"""What a vendor CLI prints, scrubbed for the logs (pool.cli.scrub)."""

from __future__ import annotations

import json
from pathlib import Path

from pool.cli.scrub import REDACTED, account_secrets, scrub


def test_credential_shapes_are_removed():
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
    text = (f"key sk-ant-oat01-AbCdEf012345 header Authorization: Bearer abc.def-ghi_jkl "
            f"jwt {jwt} hex {'0123456789abcdef' * 3} b64 {'QUJDREVGR0hJSktMTU5PUFFSU1RVVldY' * 2}")
    clean = scrub(text, limit=None)
    for secret in ("sk-ant-oat01-AbCdEf012345", "abc.def-ghi_jkl", jwt, "0123456789abcdef" * 3,
                   "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"):
        assert secret not in clean
    assert clean.startswith("key [redacted] header Authorization: [redacted]")


def test_every_secret_of_the_account_files_and_environment_is_removed(tmp_path: Path):
    (tmp_path / ".credentials.json").write_text(json.dumps(
        {"claudeAiOauth": {"accessToken": "plain-access-value", "refreshToken": "plain-refresh"}}))
    (tmp_path / "auth.json").write_text(json.dumps({"tokens": {"id_token": "codex-id-value"}}))
    (tmp_path / ".qwen").mkdir()
    (tmp_path / ".qwen" / "settings.json").write_text(json.dumps(
        {"security": {"auth": {"apiKey": "qwen-settings-key"}}, "ui": {"theme": "GitHub Dark"}}))
    (tmp_path / ".env").write_text("OPENAI_API_KEY='dotenv-key-value'\nOTHER=plain-words-here\n")
    secrets = account_secrets(tmp_path, {"OPENAI_API_KEY": "env-key-value", "PATH": "/usr/bin:/bin"})
    assert secrets == {"plain-access-value", "plain-refresh", "codex-id-value", "qwen-settings-key",
                       "dotenv-key-value", "env-key-value"}
    text = "got plain-access-value then qwen-settings-key and GitHub Dark"
    assert scrub(text, secrets) == f"got {REDACTED} then {REDACTED} and GitHub Dark"


def test_vendor_text_is_cut():
    assert len(scrub("word " * 1000)) == 300
    assert scrub("short") == "short"
