"""The poolgate configs bench/run.py and bench/open_streams.py write: one OpenAI and one
Anthropic remote worker on the demo upstream, an API key, optionally the usage ledger
(``state_dir``), a key policy (``--teams``), Redis, several OpenAI workers, a higher
in-flight cap and slower health probes."""

from __future__ import annotations

import os
from pathlib import Path

API_KEY = "sk-bench"


def teams_config(keys: int, state_dir: Path) -> tuple[str, dict[str, str]]:
    """``--teams N``: the bench key with a full policy (model globs, in-flight,
    rpm, tpm, budgets; limits far above the load) and the usage ledger in
    ``state_dir``, among N keys in all; the TOML and the environment holding
    the secrets."""
    toml = [f'state_dir = "{state_dir}"', "",
            "[server.keys.bench]", 'secret_env = "BENCH_KEY_0"', 'models = ["mock-*"]',
            "max_in_flight = 100000", "rpm = 1000000000", "tpm = 1000000000000",
            "budget_tokens = { day = 1000000000000000, month = 1000000000000000 }"]
    env = {"BENCH_KEY_0": API_KEY}
    for i in range(1, keys):
        toml += ["", f"[server.keys.k{i}]", f'secret_env = "BENCH_KEY_{i}"', "rpm = 600",
                 'models = ["mock-gpt"]']
        env[f"BENCH_KEY_{i}"] = f"sk-bench-{i}-{os.urandom(8).hex()}"
    return "\n".join(toml) + "\n", env


SLOW_MODEL = "mock-gpt-d1000-n600"   # bench/open_streams.py: a token a second for ten minutes


def config_toml(port: int, upstream_port: int, log_level: str | None, teams: str | None = None,
                redis_url: str | None = None, openai_workers: int = 1,
                max_in_flight: int | None = None, health_interval: float | None = None,
                state_dir: Path | None = None, database_url: str | None = None,
                http: str | None = None) -> str:
    """``log_level`` None: the default (info: the access log on); ``state_dir``: the
    usage ledger on (``teams`` brings its own); ``http``: ``server.http`` (None: the
    default, uvicorn)."""
    up = f"http://127.0.0.1:{upstream_port}"
    keys = teams if teams is not None else f'api_keys = {{ bench = "{API_KEY}" }}\n'
    if state_dir is not None and teams is None:
        keys += f'state_dir = "{state_dir}"\n'
    level = f'log_level = "{log_level}"\n' if log_level else ""
    if http:
        level += f'http = "{http}"\n'
    redis = f'redis_url = "{redis_url}"\n' if redis_url else ""
    if database_url:
        redis += f'database_url = "{database_url}"\n'

    cap = f"max_in_flight = {max_in_flight}\n" if max_in_flight else ""
    if health_interval:
        redis += f"health_interval = {health_interval}\n"
    # more than one worker per model: the routing policy (and its bindings) runs per request
    openai = "".join(f"""
[[workers]]
name = "mock-openai{'' if i == 0 else f'-{i + 1}'}"
kind = "remote"
dialect = "openai"
url = "{up}/v1"
models = ["mock-gpt", "mock-gpt-d5", "{SLOW_MODEL}"]
{cap}""" for i in range(openai_workers))
    return f"""[server]
host = "127.0.0.1"
port = {port}
{level}{redis}{keys}{openai}
[[workers]]
name = "mock-anthropic"
kind = "remote"
dialect = "anthropic"
url = "{up}"
models = ["mock-claude"]
"""
