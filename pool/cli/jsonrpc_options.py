"""The ``[workers.cli_options]`` of a ``cli = "jsonrpc"`` worker: method names
and JSON paths, with the Agent Client Protocol's as defaults.

Paths are dotted (``update.content.text``) and read from a notification's
``params`` or a prompt's ``result``. An ACP agent (``qwen --acp``, Zed-style
agents) needs no options; a Lingma-style agent with other names sets e.g.::

    [workers.cli_options]
    initialize = "chat/init"
    start_session = "chat/start"
    session_id_path = "conversation.id"
    send_prompt = "chat/ask"
    session_field = "conversationId"
    prompt_field = "content"
    notification = "chat/delta"
    notification_session_path = "conversationId"
    update_kind_path = "delta.kind"
    text_kind = "text"
    text_path = "delta.text"
    stop_reason_path = "finishReason"
    usage_path = "usage"
    cancel = "chat/stop"
    end_session = "chat/end"
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from .driver import DriverError

__all__ = ["JsonRpcOptions"]

_NULLABLE = {"initialize", "cancel", "end_session", "thinking_kind", "tool_call_kind",
             "tool_update_kind", "permission_request"}


@dataclass(frozen=True, slots=True)
class JsonRpcOptions:
    # methods the gateway calls (None: the agent has no such method)
    initialize: str | None = "initialize"
    initialize_params: Mapping[str, Any] = field(default_factory=lambda: {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False},
                               "terminal": False}})
    start_session: str = "session/new"
    session_params: Mapping[str, Any] = field(default_factory=lambda: {"mcpServers": []})
    session_id_path: str = "sessionId"        # in start_session's result
    send_prompt: str = "session/prompt"
    session_field: str = "sessionId"          # the session id's name in prompt/cancel/end params
    prompt_field: str = "prompt"              # the content blocks' name in prompt params
    cancel: str | None = "session/cancel"     # sent as a notification
    end_session: str | None = None            # ACP has none; Lingma-style agents do
    # what the agent sends
    notification: str = "session/update"
    notification_session_path: str = "sessionId"
    update_kind_path: str = "update.sessionUpdate"
    text_kind: str = "agent_message_chunk"
    text_path: str = "update.content.text"
    thinking_kind: str | None = "agent_thought_chunk"
    thinking_path: str = "update.content.text"
    tool_call_kind: str | None = "tool_call"          # agent mode: a tool the agent runs
    tool_update_kind: str | None = "tool_call_update"
    permission_request: str | None = "session/request_permission"
    stop_reason_path: str = "stopReason"     # in send_prompt's result
    usage_path: str = "_meta.usage"          # in send_prompt's result, else:
    update_usage_path: str = "update._meta.usage"  # in notifications (qwen --acp), summed
    auth_error_code: int = -32000            # JSON-RPC error code meaning "log in first"
    jsonrpc_field: bool = True               # send "jsonrpc": "2.0" (Codex-style agents omit it)

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> JsonRpcOptions:
        """Validate ``options``; DriverError names the first bad one."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in options.items():
            spec = known.get(key)
            if spec is None:
                raise DriverError(f"cli_options.{key}: not an option of the jsonrpc driver")
            default = getattr(cls(), key)
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif isinstance(default, Mapping):
                ok = isinstance(value, Mapping)
            elif key in _NULLABLE and value == "":
                value, ok = None, True  # TOML has no null: "" turns the method off
            else:
                ok = isinstance(value, str) and bool(value)
            if not ok:
                raise DriverError(f"cli_options.{key}: {value!r} is not a valid value")
            values[key] = value
        return cls(**values)
