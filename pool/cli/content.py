"""A turn's messages as the content a CLI takes, and JSON paths into what it sends."""

from __future__ import annotations

from typing import Any

from ..model import ExecutedToolPart, Message, TextPart, ToolCallPart, ToolResultPart, executed_text
from .claude_transcript import content_blocks
from .events import Turn
from .history import tool_result_text

__all__ = ["turn_blocks", "message_text", "dig"]


def turn_blocks(turn: Turn) -> list[dict[str, Any]]:
    """The turn as Anthropic-style content blocks (what Claude, Qwen and ACP agents take)."""
    return [block for message in turn.messages for block in content_blocks(message, frozenset())]


def message_text(message: Message) -> str:
    """A message as plain text: its text, and its tool calls and results described."""
    lines = []
    for part in message.parts:
        if isinstance(part, TextPart) and part.text:
            lines.append(part.text)
        elif isinstance(part, ExecutedToolPart):  # already ran: the model sees what it did
            lines.append(executed_text(part))
        elif isinstance(part, ToolCallPart):
            lines.append(f"(called tool {part.name} with {part.arguments}, id {part.id})")
        elif isinstance(part, ToolResultPart):
            lines.append(f"(result of tool call {part.call_id}: {tool_result_text(part)})")
    return "\n".join(lines)


def dig(obj: Any, path: str | None) -> Any:
    """``obj`` at a dotted ``path`` (``"update.content.text"``); None when absent.
    An empty path is the object itself."""
    if path is None:
        return None
    for key in filter(None, path.split(".")):
        if isinstance(obj, dict):
            obj = obj.get(key)
        elif isinstance(obj, list) and key.isdigit() and int(key) < len(obj):
            obj = obj[int(key)]
        else:
            return None
    return obj
