"""A turn's messages as the content a CLI takes (text, Anthropic-style blocks)."""

from __future__ import annotations

from typing import Any

from ..model import ImagePart, Message, TextPart, ToolResultPart
from .events import Turn

__all__ = ["turn_text", "turn_blocks", "message_text", "dig"]


def _part_text(part: Any) -> str | None:
    if isinstance(part, TextPart):
        return part.text
    if isinstance(part, ToolResultPart):
        return "\n".join(p.text for p in part.content if isinstance(p, TextPart))
    return None


def message_text(message: Message) -> str:
    """The text of a message's text parts and tool results, one per line."""
    return "\n".join(t for t in (_part_text(p) for p in message.parts) if t)


def turn_text(turn: Turn) -> str:
    """The turn as one prompt string (images dropped: say so in the caller's docs)."""
    return "\n\n".join(t for t in (message_text(m) for m in turn.messages) if t)


def _image_block(part: ImagePart) -> dict[str, Any]:
    if part.data is not None:
        return {"type": "image", "source": {"type": "base64",
                                            "media_type": part.media_type or "image/png",
                                            "data": part.data}}
    return {"type": "image", "source": {"type": "url", "url": part.url}}


def turn_blocks(turn: Turn) -> list[dict[str, Any]]:
    """The turn as Anthropic-style content blocks (text and images)."""
    blocks: list[dict[str, Any]] = []
    for message in turn.messages:
        for part in message.parts:
            if isinstance(part, ImagePart):
                blocks.append(_image_block(part))
                continue
            text = _part_text(part)
            if text:
                blocks.append({"type": "text", "text": text})
    return blocks


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
