"""A conversation's history as a Qwen Code session on disk, for ``--resume``.

Qwen Code 0.15.10 keeps sessions in
``$HOME/.qwen/projects/<cwd, non-alphanumerics as ->/chats/<session id>.jsonl``,
one record per message chained by ``parentUuid``, messages in Gemini's shape
(``{"role": "user" | "model", "parts": [{"text": ...}]}``). A transcript the
gateway writes in that shape was verified to load: ``qwen --resume <id>`` sent
it upstream as the conversation (Qwen may copy it to a new session id, which
the CLI then reports in ``system/init``).

Tool calls and results are written as Qwen records them (seen on 0.24.4): a
call is a ``functionCall`` part (``id``, ``name``, ``args``) of the model's
message, the results a record of type ``tool_result`` whose user message holds
``functionResponse`` parts (``id``, ``name``, ``response: {"output": ...}``).
Qwen then sends them upstream as the assistant's ``tool_calls`` and ``tool``
messages, as they were sent, not as text.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from ..model import Message, TextPart, ToolCallPart, ToolResultPart
from .content import message_text
from .history import tool_result_text
from .private import private_dir, remove_quietly, write_private
from .qwen_tools import PREFIX

__all__ = ["chats_dir", "write_transcript", "forget_session", "forget_sessions"]


def _project(cwd: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]", "-", cwd)


def chats_dir(home: str | Path, cwd: str) -> Path:
    return Path(home) / ".qwen" / "projects" / _project(cwd) / "chats"


def forget_session(home: str | Path, cwd: str, session_id: str) -> None:
    """Delete a session's transcript: its conversation ended."""
    remove_quietly(chats_dir(home, cwd) / f"{session_id}.jsonl")


def forget_sessions(home: str | Path, cwd: str) -> None:
    """Delete every session of the account's cwd (at start, when none is live)."""
    shutil.rmtree(chats_dir(home, cwd), ignore_errors=True)


def write_transcript(home: str | Path, cwd: str, history: Sequence[Message], *,
                     version: str | None, client_tools: frozenset[str] = frozenset()) -> str:
    """Write ``history`` (user and assistant messages) as a new session; its id.
    A call of one of ``client_tools`` is named as Qwen offers it (``mcp__gw__<name>``)."""
    session_id = str(uuid.uuid4())
    names: dict[str, str] = {}  # call id -> the name Qwen knows the tool by
    records = []
    for message in history:
        if message.role == "assistant":
            calls = [p for p in message.parts if isinstance(p, ToolCallPart)]
            for call in calls:
                names[call.id] = PREFIX + call.name if call.name in client_tools else call.name
            records.append(("assistant", {"role": "model", "parts": _model_parts(message, names)}))
        elif message.role == "user":
            results = [p for p in message.parts if isinstance(p, ToolResultPart)]
            if results:
                records.append(("tool_result", {"role": "user", "parts": [
                    _response(r, names.get(r.call_id, "")) for r in results]}))
            if not results or any(isinstance(p, TextPart) and p.text for p in message.parts):
                rest = Message("user", tuple(p for p in message.parts
                                             if not isinstance(p, ToolResultPart)))
                records.append(("user", {"role": "user", "parts": [{"text": message_text(rest)}]}))
        # the system prompt is passed in a file (QWEN_SYSTEM_MD)
    parent: str | None = None
    lines = []
    for kind, body in records:
        record_id = str(uuid.uuid4())
        lines.append(json.dumps({
            "uuid": record_id, "parentUuid": parent, "sessionId": session_id,
            "timestamp": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
            "type": kind, "cwd": cwd, "version": version or "0.15.10", "message": body}))
        parent = record_id
    directory = private_dir(home, ".qwen", "projects", _project(cwd), "chats")
    write_private(directory / f"{session_id}.jsonl", ("\n".join(lines) + "\n").encode())
    return session_id


def _model_parts(message: Message, names: dict[str, str]) -> list[dict[str, Any]]:
    text = message_text(Message("assistant", tuple(
        p for p in message.parts if not isinstance(p, ToolCallPart))))
    parts: list[dict[str, Any]] = [{"text": text}] if text else []
    for call in message.parts:
        if isinstance(call, ToolCallPart):
            parts.append({"functionCall": {"id": call.id, "name": names[call.id],
                                           "args": _arguments(call.arguments)}})
    return parts


def _response(result: ToolResultPart, name: str) -> dict[str, Any]:
    key = "error" if result.is_error else "output"
    return {"functionResponse": {"id": result.call_id, "name": name,
                                 "response": {key: tool_result_text(result)}}}


def _arguments(arguments: str) -> Any:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"input": arguments}
    return value if isinstance(value, dict) else {"input": value}
