"""A cli worker's account keys: bundle, bundle_env and [workers.login], with the
secrets they name resolved from the environment and never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import ConfigError, load_settings

CONFIG = """
[[workers]]
name = "claude-a"
kind = "cli"
cli = "claude"
models = ["claude-sonnet-4-6"]
home = "/var/lib/poolgate/claude-a"
bundle_env = "A_BUNDLE"

[workers.login]
recipe = "/etc/poolgate/recipes/anthropic.toml"
username_env = "A_USER"
password_env = "A_PASS"
totp_secret_env = "A_TOTP"
attempts = 2
"""
ENV = {"A_BUNDLE": "H4sIAAAA", "A_USER": "a@example.com", "A_PASS": "hunter2",
       "A_TOTP": "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"}


def test_login_and_bundle_secrets_come_from_the_named_variables(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    [w] = load_settings(str(path), ENV).workers
    login = w.login
    assert w.bundle_b64.get_secret_value() == "H4sIAAAA"
    assert (login.username.get_secret_value(), login.password.get_secret_value(),
            login.totp_secret.get_secret_value()) == ("a@example.com", "hunter2",
                                                      "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP")
    assert login.automatic and login.attempts == 2 and login.relogin is True
    for secret in ENV.values():
        assert secret not in repr(w)


def test_missing_variables_are_named(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    with pytest.raises(ConfigError) as info:
        load_settings(str(path), {"A_USER": "a"})
    text = str(info.value)
    assert "workers[0].bundle_env: environment variable A_BUNDLE is not set" in text
    assert "workers[0].login.password_env: environment variable A_PASS is not set" in text
    assert "workers[0].login.username_env" not in text


def test_without_a_recipe_or_a_password_the_login_is_the_operators(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.replace('password_env = "A_PASS"\n', ""))
    [w] = load_settings(str(path), ENV).workers
    assert w.login.password is None and not w.login.automatic
    path.write_text(CONFIG.replace("attempts = 2", "attempts = 0"))
    with pytest.raises(ConfigError, match="attempts"):
        load_settings(str(path), ENV)


def test_login_timeout_and_probe_interval(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    [w] = load_settings(str(path), ENV).workers
    assert (w.login_timeout, w.login_probe_interval) == (600.0, 60.0)
    path.write_text(CONFIG.replace('bundle_env = "A_BUNDLE"',
                                   'bundle_env = "A_BUNDLE"\nlogin_timeout = 30\n'
                                   'login_probe_interval = 5'))
    [w] = load_settings(str(path), ENV).workers
    assert (w.login_timeout, w.login_probe_interval) == (30.0, 5.0)
    path.write_text(CONFIG.replace('bundle_env = "A_BUNDLE"',
                                   'bundle_env = "A_BUNDLE"\nlogin_timeout = 0'))
    with pytest.raises(ConfigError, match="login_timeout"):
        load_settings(str(path), ENV)
