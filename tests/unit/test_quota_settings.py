"""``quota_reserve`` in the configuration: per cli worker and per model
(``[routing.quota_reserve]``), checked at load, and what the gateway builds
of it (:func:`app.factory.quota_routing`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.factory import quota_routing
from app.settings import ConfigError, load_settings

CLI = """
[[workers]]
name = "claude-a"
kind = "cli"
cli = "claude"
home = "{home}/a"
models = ["claude-sonnet-4-6"]
aliases = {{ sonnet = "claude-sonnet-4-6" }}
quota_reserve = 15
"""


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "poolgate.toml"
    path.write_text(text.format(home=tmp_path))
    return load_settings(str(path), {})


def problems(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return "\n".join(info.value.problems)


def test_worker_and_model_reserves_load_and_an_alias_means_its_model(tmp_path: Path) -> None:
    settings = load(tmp_path, "[routing]\nquota_routing = false\n"
                              "[routing.quota_reserve]\nsonnet = 25\n" + CLI)
    assert settings.workers[0].quota_reserve == 15
    rules = quota_routing(settings)
    assert dict(rules.reserves) == {"claude-sonnet-4-6": 25}
    assert rules.by_headroom is False
    assert quota_routing(load(tmp_path, CLI)).by_headroom is True


@pytest.mark.parametrize(("text", "says"), [
    (CLI.replace("quota_reserve = 15", "quota_reserve = 101"), "quota_reserve"),
    (CLI.replace("quota_reserve = 15", "quota_reserve = -1"), "quota_reserve"),
    ("[routing.quota_reserve]\nsonnet = 120\n" + CLI, "quota_reserve['sonnet'] must be a percent"),
    ("[routing.quota_reserve]\nopus = 10\n" + CLI, "routing.quota_reserve names 'opus'"),
    ('[[workers]]\nname = "r"\ndialect = "openai"\nurl = "http://127.0.0.1:9"\n'
     'models = ["m"]\nquota_reserve = 10\n', "only cli workers"),
])
def test_bad_reserves_are_refused_naming_quota_reserve(tmp_path: Path, text: str,
                                                       says: str) -> None:
    assert says in problems(tmp_path, text)
