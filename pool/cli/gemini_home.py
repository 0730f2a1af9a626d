"""A Gemini CLI account's home: the settings the driver needs, the files of a
conversation's system prompt, and whether the home holds credentials.

``$HOME/.gemini/settings.json`` gets usage statistics, telemetry and
auto-update off, and an auth type when it has none (``gemini-api-key`` when
the worker's environment has ``GEMINI_API_KEY``, else ``oauth-personal``: a
Google account logged in with ``oauth_creds.json``). In chat mode
``tools.exclude`` lists every built-in tool, so the CLI offers the model none
of its own (48 KB first request with its 16 tools → 0.8 KB, measured on
0.61.0). Not ``tools.core``: that allow-list also hides the client's tools
(MCP, seen by the model as ``mcp_gw_<name>``).
Every other key the account's settings hold is kept.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from .driver import credentials_stamp
from .private import FILE_MODE, private_dir, remove_quietly, write_private
from .qwen_home import QwenHome, _merge

__all__ = ["GeminiHome", "API_KEY_AUTH", "OAUTH_AUTH", "CHAT_EXCLUDED_TOOLS"]

API_KEY_AUTH = "gemini-api-key"
OAUTH_AUTH = "oauth-personal"
#: ``tools.exclude`` in chat mode: every built-in tool of Gemini CLI 0.61.0
CHAT_EXCLUDED_TOOLS = [
    "update_topic", "list_directory", "read_file", "grep_search", "glob", "replace", "write_file",
    "web_fetch", "run_shell_command", "list_background_processes", "read_background_output",
    "google_web_search", "write_todos", "enter_plan_mode", "invoke_agent", "activate_skill",
    "read_many_files", "save_memory", "ask_user", "exit_plan_mode", "complete_task",
]
_SETTINGS: dict[str, Any] = {
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
}


class GeminiHome(QwenHome):
    """The ``HOME`` of one Gemini CLI account (its files under ``.gemini``)."""

    def __init__(self, home: Path, env: Mapping[str, str], mode: str) -> None:
        auth = API_KEY_AUTH if env.get("GEMINI_API_KEY") or env.get("GOOGLE_API_KEY") else OAUTH_AUTH
        super().__init__(home, auth, env)
        self.mode = mode

    def settings_path(self) -> Path:
        return self.home / ".gemini" / "settings.json"

    def oauth_path(self) -> Path:
        return self.home / ".gemini" / "oauth_creds.json"

    def write(self) -> None:
        """The driver's settings merged into the account's (a file that is not
        strict JSON is refused, never replaced)."""
        path = self.settings_path()
        settings = self.strict_settings()
        defaults: dict[str, Any] = dict(_SETTINGS)
        security = settings.get("security")
        auth = security.get("auth") if isinstance(security, dict) else None
        if not isinstance(auth.get("selectedType") if isinstance(auth, dict) else None, str):
            defaults["security"] = {"auth": {"selectedType": self.auth_type}}
        tools = settings.get("tools")
        changed = False
        if self.mode == "chat":
            defaults["tools"] = {"exclude": CHAT_EXCLUDED_TOOLS}
        elif isinstance(tools, dict) and tools.get("exclude") == CHAT_EXCLUDED_TOOLS:
            del tools["exclude"]  # left by chat mode: the CLI's tools back on
            changed = True
        private_dir(self.home, ".gemini")
        if _merge(settings, defaults) or changed or not path.exists():
            write_private(path, json.dumps(settings, indent=2).encode())
        else:
            os.chmod(path, FILE_MODE)

    def select_auth(self, auth: str) -> None:
        """Make ``auth`` the account's auth type (a login picks Google's)."""
        settings = self.strict_settings()
        _merge(settings, {"security": {"auth": {"selectedType": auth}}})
        private_dir(self.home, ".gemini")
        write_private(self.settings_path(), json.dumps(settings, indent=2).encode())

    def selected_auth(self) -> str:
        auth = self.read_settings().get("security", {}).get("auth", {})
        selected = auth.get("selectedType") if isinstance(auth, dict) else None
        return selected if isinstance(selected, str) else self.auth_type

    def has_credentials(self) -> bool:
        """An API key (the environment, or an ``.env`` the CLI reads), or a Google
        login's ``oauth_creds.json``."""
        if self.selected_auth() == API_KEY_AUTH:
            return bool(self.env.get("GEMINI_API_KEY") or self.env.get("GOOGLE_API_KEY")
                        or self._dotenv_key())
        if self.selected_auth() == OAUTH_AUTH:
            return self.oauth_path().is_file()
        return True  # Vertex, a gateway: known by the first turn

    def _dotenv_key(self) -> bool:
        for dotenv in (self.home / ".gemini" / ".env", self.home / ".env"):
            try:
                lines = dotenv.read_text().splitlines()
            except OSError:
                continue
            if any(line.strip().startswith(("GEMINI_API_KEY=", "GOOGLE_API_KEY="))
                   and line.split("=", 1)[1].strip() for line in lines):
                return True
        return False

    def credentials_stamp(self) -> str | None:
        return credentials_stamp(str(self.oauth_path()))

    def system_prompt_file(self, text: str) -> Path:
        """A 0600 file holding a conversation's system prompt (``GEMINI_SYSTEM_MD``):
        client text never goes on a command line."""
        directory = private_dir(self.home, ".gemini", "poolgate-system")
        path = directory / f"{os.urandom(8).hex()}.md"
        write_private(path, text.encode())
        return path

    @staticmethod
    def forget(path: Path | None) -> None:
        if path is not None:
            remove_quietly(path)
