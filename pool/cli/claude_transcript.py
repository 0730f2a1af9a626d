"""Claude Code's on-disk sessions: turning a stateless API history into a
transcript that ``claude --resume <id>`` loads (verified on the real binary:
a hand-written jsonl was sent upstream verbatim).

Sessions live in ``$CLAUDE_CONFIG_DIR/projects/<cwd, every non-alphanumeric
character replaced by '-'>/<session id>.jsonl``, one record per message
chained by ``parentUuid``; resume is keyed by that directory, which is why a
cli worker keeps one fixed cwd per account.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import uuid
from typing import Any, Iterable, Sequence

import orjson

from ..model import (ExecutedToolPart, ImagePart, Message, ReasoningPart, TextPart, ToolCallPart,
                     ToolResultPart, executed_text)
from .history import tool_result_text
from .private import private_dir, remove_quietly, write_private

__all__ = ["project_dir", "write_transcript", "forget_session", "forget_sessions",
           "content_blocks", "MCP_PREFIX"]

MCP_PREFIX = "mcp__gw__"  # how the model sees a client tool served by the in-band MCP server


def _project(cwd: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "-", cwd)


def project_dir(home: str, cwd: str) -> str:
    return os.path.join(home, "projects", _project(cwd))


def forget_session(home: str, cwd: str, session_id: str) -> None:
    """Delete a session's transcript (and the CLI's side files of it): the
    conversation ended, and its text must not outlive it on disk."""
    directory = project_dir(home, cwd)
    remove_quietly(os.path.join(directory, f"{session_id}.jsonl"))
    shutil.rmtree(os.path.join(directory, session_id), ignore_errors=True)


def forget_sessions(home: str, cwd: str) -> None:
    """Delete every session of the account's cwd (at start: none is live, and a
    worker that died left its conversations' transcripts behind)."""
    shutil.rmtree(project_dir(home, cwd), ignore_errors=True)


def content_blocks(message: Message, client_tools: frozenset[str]) -> list[dict[str, Any]]:
    """A canonical message as Anthropic content blocks, client tools under their MCP names.

    Signed thinking (and redacted thinking) goes in as it came: the gateway
    sends a worker only what its own account signed (or what it cannot tell
    apart, see :mod:`pool.signatures`), and Anthropic wants the thinking that
    opened a tool-use turn back while thinking is on. Unsigned reasoning (a
    Chat Completions client's) and OpenAI's encrypted reasoning have no form
    the API takes: left out."""
    blocks: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ReasoningPart):
            if part.redacted_data is not None:
                blocks.append({"type": "redacted_thinking", "data": part.redacted_data})
            elif part.signature is not None:
                blocks.append({"type": "thinking", "thinking": part.text,
                               "signature": part.signature})
        elif isinstance(part, TextPart):
            if part.text:
                blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, ExecutedToolPart):  # already ran: the model sees what it did
            blocks.append({"type": "text", "text": executed_text(part)})
        elif isinstance(part, ToolCallPart):
            try:
                arguments = orjson.loads(part.arguments or "{}")
            except orjson.JSONDecodeError:
                arguments = {}
            name = MCP_PREFIX + part.name if part.name in client_tools else part.name
            blocks.append({"type": "tool_use", "id": part.id, "name": name, "input": arguments})
        elif isinstance(part, ToolResultPart):
            blocks.append({"type": "tool_result", "tool_use_id": part.call_id,
                           "content": tool_result_text(part), "is_error": part.is_error})
        elif isinstance(part, ImagePart):
            blocks.append({"type": "image", "source": _image_source(part)})
    return blocks


def _recorded(block: dict[str, Any]) -> dict[str, Any]:
    """A block as Claude Code records it: a tool result's text as a text block
    (the CLI adds its reminders as blocks of their own, the client's text stays
    one), no ``is_error`` unless it is one."""
    if block["type"] != "tool_result":
        return block
    recorded = {"tool_use_id": block["tool_use_id"], "type": "tool_result",
                "content": [{"type": "text", "text": block["content"]}] if block["content"] else ""}
    return {**recorded, "is_error": True} if block["is_error"] else recorded


def _image_source(part: ImagePart) -> dict[str, Any]:
    if part.data is not None:
        return {"type": "base64", "media_type": part.media_type or "image/png", "data": part.data}
    return {"type": "url", "url": part.url}


def write_transcript(home: str, cwd: str, session_id: str, model: str,
                     history: Sequence[Message], client_tools: Iterable[str],
                     version: str | None = None) -> str:
    """Write ``history`` as session ``session_id``; returns the file's path."""
    tools = frozenset(client_tools)
    directory = private_dir(home, "projects", _project(cwd))
    path = os.path.join(directory, f"{session_id}.jsonl")
    parent: str | None = None
    now = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
    lines = []
    for message in history:
        record_id = str(uuid.uuid4())
        content = content_blocks(message, tools)
        if message.role == "assistant":
            body: dict[str, Any] = {
                "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
                "model": model, "content": content, "stop_reason":
                    "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn",
                "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
        else:
            body = {"role": "user", "content": [_recorded(b) for b in content]}
        lines.append(orjson.dumps({
            "parentUuid": parent, "isSidechain": False, "userType": "external", "cwd": cwd,
            "sessionId": session_id, "version": version or "2.1.197",
            "type": "assistant" if message.role == "assistant" else "user",
            "message": body, "uuid": record_id, "timestamp": now}))
        parent = record_id
    write_private(path, b"\n".join(lines) + b"\n")
    return path
