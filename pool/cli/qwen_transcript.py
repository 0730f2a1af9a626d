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
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from ..model import Message
from .content import message_text

__all__ = ["chats_dir", "write_transcript"]


def chats_dir(home: str | Path, cwd: str) -> Path:
    return Path(home) / ".qwen" / "projects" / re.sub(r"[^a-zA-Z0-9]", "-", cwd) / "chats"


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
    directory = chats_dir(home, cwd)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{session_id}.jsonl").write_text("\n".join(lines) + "\n")
    return session_id
