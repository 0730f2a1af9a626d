"""A Qwen Code account's home: the settings the driver needs, and whether it
holds credentials.

``$HOME/.qwen/settings.json`` gets managed auto-memory off (otherwise every
prompt costs a second upstream call, verified on 0.15.10), auto-update and
telemetry off, and an auth type when it has none; every other key the
account's settings hold (its API key, say) is kept.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from .driver import DriverError
from .private import FILE_MODE, private_dir, write_private

__all__ = ["QwenHome"]

_SETTINGS: dict[str, Any] = {
    "memory": {"enableManagedAutoMemory": False},
    "general": {"enableAutoUpdate": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "ui": {"enableFollowupSuggestions": False},  # 0.24: one more upstream call per turn
}


def _merge(into: dict[str, Any], defaults: Mapping[str, Any]) -> bool:
    changed = False
    for key, value in defaults.items():
        if isinstance(value, Mapping):
            node = into.get(key)
            if not isinstance(node, dict):
                into[key] = node = {}
                changed = True
            changed |= _merge(node, value)
        elif into.get(key) != value:
            into[key] = value
            changed = True
    return changed


class QwenHome:
    """The ``HOME`` of one Qwen account."""

    def __init__(self, home: Path, auth_type: str, env: Mapping[str, str]) -> None:
        self.home, self.auth_type, self.env = home, auth_type, env

    def settings_path(self) -> Path:
        return self.home / ".qwen" / "settings.json"

    def read_settings(self) -> dict[str, Any]:
        try:
            data = json.loads(self.settings_path().read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def strict_settings(self) -> dict[str, Any]:
        """The settings, or {} when there are none; :class:`DriverError` when the
        file is there but not a strict JSON object (rewriting it would lose what
        it holds, its API key say). The message names the place, never the text."""
        path = self.settings_path()
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise DriverError(f"qwen: cannot read {path} ({exc.strerror}); "
                              "the worker does not start") from None
        try:
            data = json.loads(raw)
        except ValueError as exc:
            where = (f" (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                     if isinstance(exc, json.JSONDecodeError) else "")
            raise DriverError(f"qwen: {path} is not strict JSON{where}; poolgate leaves it "
                              "untouched and the worker does not start: make it plain JSON "
                              "(no comments, no trailing commas)") from None
        if not isinstance(data, dict):
            raise DriverError(f"qwen: {path} is not a JSON object; poolgate leaves it "
                              "untouched and the worker does not start")
        return data

    def write(self) -> None:
        """Turn managed auto-memory, auto-update and telemetry off, keeping
        whatever else the account's settings hold (its API key, say); a file
        that is not strict JSON is refused (:meth:`strict_settings`), never replaced."""
        path = self.settings_path()
        settings = self.strict_settings()
        defaults: dict[str, Any] = dict(_SETTINGS)
        security = settings.get("security")
        auth = security.get("auth") if isinstance(security, dict) else None
        if not isinstance(auth.get("selectedType") if isinstance(auth, dict) else None, str):
            defaults["security"] = {"auth": {"selectedType": self.auth_type}}
        private_dir(self.home, ".qwen")
        if _merge(settings, defaults) or not path.exists():
            write_private(path, json.dumps(settings, indent=2).encode())
        else:
            os.chmod(path, FILE_MODE)

    def has_credentials(self) -> bool:
        """For ``openai`` auth: a key in the environment, settings.json or an .env file."""
        if self.auth_type != "openai":
            return True  # other auth types are only known by the first turn
        if self.env.get("OPENAI_API_KEY"):
            return True
        if self.read_settings().get("security", {}).get("auth", {}).get("apiKey"):
            return True
        for dotenv in (self.home / ".qwen" / ".env", self.home / ".env"):
            try:
                if any(line.strip().startswith("OPENAI_API_KEY=") and line.split("=", 1)[1].strip()
                       for line in dotenv.read_text().splitlines()):
                    return True
            except OSError:
                continue
        return False
