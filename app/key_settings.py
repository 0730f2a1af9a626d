"""The ``[server.keys.<name>]`` tables: one API key with its policy.

Part of the one settings object (``ServerSettings.keys``); the secret is
resolved by ``load_settings`` from ``secret_env`` or ``secret_file`` into the
``secret`` field (tests may set ``secret`` directly).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

__all__ = ["BudgetSettings", "KeySettings", "resolve_key_secrets", "missing_key_secrets"]


class BudgetSettings(BaseModel):
    """``budget_tokens = {day = …, month = …}``: input + output tokens per UTC day / month."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    day: int | None = Field(None, gt=0)
    month: int | None = Field(None, gt=0)


class KeySettings(BaseModel):
    """One ``[server.keys.<name>]`` table; every limit is optional."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    secret_env: str | None = None
    secret_file: str | None = None
    secret: SecretStr | None = None  # resolved from secret_env / secret_file
    models: tuple[str, ...] | None = None  # glob patterns; None: every model
    max_in_flight: int | None = Field(None, gt=0)
    rpm: int | None = Field(None, gt=0)
    tpm: int | None = Field(None, gt=0)
    budget_tokens: BudgetSettings | None = None

    @model_validator(mode="after")
    def _one_source(self) -> KeySettings:
        sources = [s for s in ("secret_env", "secret_file") if getattr(self, s) is not None]
        if len(sources) > 1:
            raise ValueError("give secret_env or secret_file, not both")
        if not sources and self.secret is None:
            raise ValueError("a key needs secret_env or secret_file")
        if self.models is not None and any(not m for m in self.models):
            raise ValueError("model patterns must not be empty")
        return self


def missing_key_secrets(server: Any, environ: Mapping[str, str]) -> list[str]:
    """A problem line for each key whose secret cannot be found (names, never secrets)."""
    keys = server.get("keys") if isinstance(server, dict) else None
    if not isinstance(keys, dict):
        return []
    problems = []
    for name, key in keys.items():
        if not isinstance(key, dict):
            continue
        env, path = key.get("secret_env"), key.get("secret_file")
        if isinstance(env, str) and not environ.get(env):
            problems.append(f"server.keys.{name}.secret_env: environment variable {env} is not set")
        elif isinstance(path, str):
            try:
                with open(path, encoding="utf-8") as fh:
                    empty = not fh.read().strip()
            except OSError as exc:
                problems.append(f"server.keys.{name}.secret_file: cannot read {path} ({exc.strerror})")
                continue
            if empty:
                problems.append(f"server.keys.{name}.secret_file: {path} is empty")
    return problems


def resolve_key_secrets(keys: Mapping[str, KeySettings],
                        environ: Mapping[str, str]) -> dict[str, KeySettings]:
    """``keys`` with each ``secret`` read from its ``secret_env`` or ``secret_file``
    (:func:`missing_key_secrets` has checked both exist)."""
    resolved = {}
    for name, key in keys.items():
        if key.secret_env is not None:
            secret = environ[key.secret_env]
        elif key.secret_file is not None:
            with open(key.secret_file, encoding="utf-8") as fh:
                secret = fh.read().strip()
        else:
            resolved[name] = key
            continue
        resolved[name] = key.model_copy(update={"secret": SecretStr(secret)})
    return resolved
