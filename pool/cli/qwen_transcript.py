"""A conversation's history as a Qwen Code session on disk, for ``--resume``.

Qwen Code 0.15.10 keeps sessions in
``$HOME/.qwen/projects/<cwd, non-alphanumerics as ->/chats/<session id>.jsonl``,
one record per message chained by ``parentUuid``, messages in Gemini's shape
(``{"role": "user" | "model", "parts": [{"text": ...}]}``). A transcript the
gateway writes in that shape was verified to load: ``qwen --resume <id>`` sent
it upstream as the conversation (Qwen may copy it to a new session id, which
the CLI then reports in ``system/init``).
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from ..model import Message
from .content import message_text
from .private import private_dir, remove_quietly, write_private

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
                     version: str | None) -> str:
    """Write ``history`` (user and assistant messages) as a new session; its id."""
    session_id = str(uuid.uuid4())
    parent: str | None = None
    lines = []
    for message in history:
        if message.role not in ("user", "assistant"):
            continue  # the system prompt is passed with --system-prompt
        record_id = str(uuid.uuid4())
        lines.append(json.dumps({
            "uuid": record_id, "parentUuid": parent, "sessionId": session_id,
            "timestamp": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
            "type": message.role, "cwd": cwd, "version": version or "0.15.10",
            "message": {"role": "user" if message.role == "user" else "model",
                        "parts": [{"text": message_text(message)}]}}))
        parent = record_id
    directory = private_dir(home, ".qwen", "projects", _project(cwd), "chats")
    write_private(directory / f"{session_id}.jsonl", ("\n".join(lines) + "\n").encode())
    return session_id
