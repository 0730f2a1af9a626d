"""A cli worker's account keys: ``bundle``, ``bundle_env`` and the ``[workers.login]`` table.

Part of the one settings object (``WorkerSettings.login`` and friends); the
secrets named by ``*_env`` keys are resolved by ``load_settings`` into
``SecretStr`` fields, so a missing variable fails at start-up naming the key,
and nothing else reads the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = ["LoginSettings", "missing_account_secrets", "resolve_account"]

_LOGIN_ENVS = ("username_env", "password_env", "totp_secret_env")


class LoginSettings(BaseModel):
    """``[workers.login]``: how the account logs in without a person (docs/accounts.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recipe: str | None = None  # a recipe file (TOML/JSON) or the name of a built-in one
    username_env: str | None = None
    password_env: str | None = None
    totp_secret_env: str | None = None
    username: SecretStr | None = None  # resolved from the *_env keys
    password: SecretStr | None = None
    totp_secret: SecretStr | None = None
    relogin: bool = True  # log in by itself (with the browser) when found logged out
    timeout: float = Field(120.0, gt=0)  # one attempt, browser and CLI together
    attempts: int = Field(3, gt=0)  # then the operator path
    backoff: float = Field(30.0, gt=0)  # first delay between attempts, doubling

    @property
    def automatic(self) -> bool:
        """Credentials and a recipe: a browser can do it."""
        return bool(self.recipe and self.username and self.password)


def missing_account_secrets(index: int, worker: Any, environ: Mapping[str, str]) -> list[str]:
    """A problem line for each variable a worker's account keys name but is not set."""
    if not isinstance(worker, dict):
        return []
    problems = []
    var = worker.get("bundle_env")
    if isinstance(var, str) and not environ.get(var):
        problems.append(f"workers[{index}].bundle_env: environment variable {var} is not set")
    login = worker.get("login")
    for key in _LOGIN_ENVS:
        var = login.get(key) if isinstance(login, dict) else None
        if isinstance(var, str) and not environ.get(var):
            problems.append(f"workers[{index}].login.{key}: environment variable {var} is not set")
    return problems


def resolve_account(worker: Any, environ: Mapping[str, str]) -> dict[str, Any]:
    """The update that puts the named secrets into a worker's settings."""
    update: dict[str, Any] = {}
    if worker.bundle_env:
        update["bundle_b64"] = SecretStr(environ[worker.bundle_env])
    login = worker.login
    if login is not None:
        found = {key[:-4]: SecretStr(environ[getattr(login, key)])
                 for key in _LOGIN_ENVS if getattr(login, key)}
        if found:
            update["login"] = login.model_copy(update=found)
    return update
