"""How a ``codex app-server`` is started, and the gateway's data in Codex's shapes.

- :func:`native_binary`: the Rust binary inside the npm package, so a worker
  does not carry a 44 MB node shim per account;
- :func:`app_server_argv`: offline switches always, and in chat mode every
  Codex feature that adds tools or prompt text turned off (measured on 0.169.0:
  a first request of 3.1 KB, only ``request_user_input`` left among the tools);
- :func:`user_input` and :func:`history_items`: canonical messages as
  ``turn/start`` input and as the Responses items ``thread/inject_items`` takes.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..model import (ExecutedToolPart, ImagePart, Message, TextPart, Tool, ToolCallPart,
                     ToolResultPart, executed_text)
from .driver import DriverError

__all__ = ["native_binary", "app_server_argv", "toml_value", "user_input", "history_items",
           "dynamic_tools", "codex_name", "tool_outputs", "CodexOptions", "DEFAULT_CHAT_SYSTEM", "RESERVED_TOOLS",
           "ALIAS_PREFIX"]

#: chat mode's system prompt when neither the client nor the gateway chose one
DEFAULT_CHAT_SYSTEM = "You are a helpful assistant."

# Nothing may reach the network but the model provider (these are checked keys).
_OFFLINE: dict[str, Any] = {
    "check_for_update_on_startup": False,
    "analytics.enabled": False,
    "feedback.enabled": False,
    "otel.exporter": "none",
    "history.persistence": "none",
    "features.plugins": False,  # else: git clone of github.com/openai/plugins
}
# Chat mode: no Codex tool, no agent prompt text (each measured on the request body).
_CHAT_CONFIG: dict[str, Any] = {
    "web_search": "disabled",
    "skills.bundled.enabled": False,            # <skills_instructions>, 2.1 KB
    "include_permissions_instructions": False,  # <permissions instructions>
    "include_environment_context": False,       # <environment_context>
    "include_apps_instructions": False,
}
_CHAT_FEATURES_OFF = ("goals", "shell_tool", "unified_exec", "view_image", "multi_agent", "apps")
# Names a dynamic tool cannot have (0.169.0, measured): Codex drops ``exec_command``
# and ``shell_command`` from the request even with its shell off, and a call to
# ``request_user_input`` goes to its own tool. Such client tools get a prefix.
RESERVED_TOOLS = frozenset({"exec_command", "shell_command", "request_user_input"})
ALIAS_PREFIX = "client_"
_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}


class CodexOptions:
    """The worker's ``[workers.cli_options]`` for Codex, checked.

    ``config``: extra ``-c key=value`` overrides (dotted keys; strings, numbers,
    booleans, lists), e.g. a ``model_providers.<id>`` entry and
    ``model_provider``; ``features``: ``{name = true|false}``; ``sandbox``
    (agent mode, default ``read-only``); ``tool_gather_seconds``: how long
    to wait for further parallel ``item/tool/call`` requests after the first
    when ``raw_events`` is false (true: threads report when a model response
    is complete, which 0.169.0 does with ``experimentalRawEvents``);
    ``watchdog_seconds``: how often ``account/read`` checks that the process
    still answers (a hung one is killed)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        known = {"config", "features", "sandbox", "tool_gather_seconds", "watchdog_seconds",
                 "raw_events"}
        for key in options:
            if key not in known:
                raise DriverError(f"cli_options.{key}: unknown Codex option "
                                  f"(one of {', '.join(sorted(known))})")
        config = options.get("config", {})
        if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
            raise DriverError("cli_options.config must be a table of dotted keys")
        for key, value in config.items():
            if not isinstance(value, (str, int, float, bool, list)):
                raise DriverError(f"cli_options.config.{key}: must be a string, number, "
                                  "boolean or list")
        features = options.get("features", {})
        if not isinstance(features, Mapping) or not all(
                isinstance(v, bool) for v in features.values()):
            raise DriverError("cli_options.features must map feature names to true/false")
        sandbox = options.get("sandbox", "read-only")
        if sandbox not in ("read-only", "workspace-write", "danger-full-access"):
            raise DriverError("cli_options.sandbox must be read-only, workspace-write or "
                              "danger-full-access")
        gather = options.get("tool_gather_seconds", 0.05)
        if not isinstance(gather, (int, float)) or isinstance(gather, bool) or not 0 <= gather <= 5:
            raise DriverError("cli_options.tool_gather_seconds must be a number from 0 to 5")
        watchdog = options.get("watchdog_seconds", 10.0)
        if not isinstance(watchdog, (int, float)) or isinstance(watchdog, bool) or watchdog <= 0:
            raise DriverError("cli_options.watchdog_seconds must be a positive number")
        self.watchdog: float = float(watchdog)
        raw = options.get("raw_events", True)
        if not isinstance(raw, bool):
            raise DriverError("cli_options.raw_events must be true or false")
        self.raw_events: bool = raw
        self.config: dict[str, Any] = dict(config)
        self.features: dict[str, bool] = dict(features)
        self.sandbox: str = sandbox
        self.tool_gather: float = float(gather)


def native_binary(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``argv`` with the npm package's node shim (``@openai/codex/bin/codex.js``)
    replaced by the platform binary it would have spawned."""
    argv = list(argv)
    found = shutil.which(argv[0], path=env.get("PATH")) if os.sep not in argv[0] else argv[0]
    if found is None or not os.access(found, os.X_OK):
        raise DriverError(f"codex binary not found: {argv[0]!r} (set the worker's command)")
    real = Path(found).resolve()
    is_shim = real.suffix == ".js" and real.parent.name == "bin"
    argv[0] = str(_vendor_binary(real.parent.parent)) if is_shim else found
    return argv


def _vendor_binary(package: Path) -> Path:
    arch = _ARCH.get(platform.machine().lower(), platform.machine().lower())
    name = f"codex-linux-{arch}"
    for root in (package / "node_modules" / "@openai" / name, package.parent / name, package):
        for candidate in sorted((root / "vendor").glob("*/bin/codex")):
            if os.access(candidate, os.X_OK):
                return candidate
    raise DriverError(f"the codex npm package at {package} has no native binary "
                      f"(@openai/{name} missing)")


def toml_value(value: Any) -> str:
    """A ``-c`` value: JSON strings, numbers, booleans and arrays are valid TOML."""
    return json.dumps(value)


def app_server_argv(binary: Sequence[str], *, chat: bool, options: CodexOptions) -> list[str]:
    config = {**_OFFLINE, **(_CHAT_CONFIG if chat else {}), **options.config}
    features = {**({f: False for f in _CHAT_FEATURES_OFF} if chat else {}), **options.features}
    argv = [*binary, "app-server"]
    for key, value in config.items():
        argv += ["-c", f"{key}={toml_value(value)}"]
    for name, on in features.items():
        argv += ["--enable" if on else "--disable", name]
    return argv


# --- canonical messages in Codex's shapes ---------------------------------------------------

def _image_url(part: ImagePart) -> str | None:
    if part.url:
        return part.url
    if part.data:
        return f"data:{part.media_type or 'image/png'};base64,{part.data}"
    return None


def user_input(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """``turn/start`` input: the new turn's text and images, in order."""
    items: list[dict[str, Any]] = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, TextPart):
                items.append({"type": "text", "text": part.text})
            elif isinstance(part, ImagePart) and (url := _image_url(part)):
                items.append({"type": "image", "url": url})
    return items


def _tool_output(part: ToolResultPart) -> str:
    return "".join(p.text for p in part.content if isinstance(p, TextPart))


def codex_name(name: str) -> str:
    """The name Codex (and the model behind it) knows a client tool by."""
    return ALIAS_PREFIX + name if name in RESERVED_TOOLS else name


def dynamic_tools(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    return [{"type": "function", "name": codex_name(t.name), "description": t.description or "",
             "inputSchema": dict(t.parameters or {"type": "object", "properties": {}})}
            for t in tools]


def tool_outputs(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The tool results among ``messages`` as ``function_call_output`` items: a
    rebuilt conversation's new turn can be the answer to a call in its history."""
    return [i for i in history_items(messages) if i["type"] == "function_call_output"]


def history_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Responses API items for ``thread/inject_items`` (reasoning is dropped:
    without its encrypted content it cannot be replayed)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = "developer" if message.role == "system" else message.role
        content: list[dict[str, Any]] = []
        text_type = "output_text" if role == "assistant" else "input_text"

        def flush() -> None:
            if content:
                items.append({"type": "message", "role": role, "content": list(content)})
                content.clear()

        for part in message.parts:
            if isinstance(part, TextPart):
                content.append({"type": text_type, "text": part.text})
            elif isinstance(part, ExecutedToolPart):  # already ran: the model sees what it did
                content.append({"type": text_type, "text": executed_text(part)})
            elif isinstance(part, ImagePart) and role != "assistant" and (url := _image_url(part)):
                content.append({"type": "input_image", "image_url": url})
            elif isinstance(part, ToolCallPart):
                flush()
                items.append({"type": "function_call", "name": codex_name(part.name),
                              "arguments": part.arguments, "call_id": part.id})
            elif isinstance(part, ToolResultPart):
                flush()
                items.append({"type": "function_call_output", "call_id": part.call_id,
                              "output": _tool_output(part)})
        flush()
    return items
