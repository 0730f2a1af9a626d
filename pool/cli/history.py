"""Which conversation a request continues: pure functions shared by the
gateway (routing to the worker that holds it) and the worker child (finding
the CLI process or thread that holds it).

A stateless API request carries the whole conversation. It is split into
``history`` (everything up to and including the last assistant message) and
the new turn after it (user text, or tool results answering held calls). The
conversation a CLI holds is named by :func:`conversation_hash`: the API key's
*name* (two teams never share an upstream session), the model, the system
prompt, the tool set and the messages, normalised so that what a client sends
back equals what the CLI produced (text joined per message, tool arguments as
canonical JSON, reasoning left out: not every dialect returns it). A tool
the CLI ran itself (agent mode) counts as its :func:`~pool.model.executed_text`
within the message's text: a chat-completions client gets it back as that
text, an Anthropic or Responses client as an executed-tool block, and all of
them must name the same conversation.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Iterable, Sequence

import orjson

from ..model import (ChatRequest, ExecutedToolPart, ImagePart, Message, Part, TextPart, Tool,
                     ToolCallPart, ToolResultPart, executed_text)
from .events import Turn

__all__ = ["split", "system_text", "conversation_hash", "request_prefix_hash", "answer_message",
           "flatten", "tool_result_text", "canonical_arguments", "ends_in_tool_calls",
           "results_message"]


def system_text(messages: Iterable[Message]) -> str | None:
    """The system and developer messages, joined (``None`` when there are none)."""
    texts = [_text(m.parts) for m in messages if m.role in ("system", "developer")]
    return "\n\n".join(texts) if texts else None


def split(request: ChatRequest) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """``(history, new)``: the conversation up to and including the last
    assistant message, and the messages after it. System and developer
    messages are in neither (see :func:`system_text`)."""
    chat = tuple(m for m in request.messages if m.role not in ("system", "developer"))
    last = max((i for i, m in enumerate(chat) if m.role == "assistant"), default=-1)
    return chat[:last + 1], chat[last + 1:]


def conversation_hash(key_name: str | None, model: str, system: str | None,
                      tools: Sequence[Tool], messages: Iterable[Message]) -> str:
    digest = blake2b(digest_size=20)
    head = {"k": key_name or "", "m": model, "s": system or "",
            "t": [[t.name, t.description or "", _canonical(t.parameters)] for t in tools]}
    digest.update(orjson.dumps(head))
    for message in messages:
        digest.update(b"\x1e")
        digest.update(orjson.dumps(_normal(message)))
    return digest.hexdigest()


def request_prefix_hash(request: ChatRequest) -> str | None:
    """The hash of ``request``'s history (``None`` for a first turn: nothing to continue)."""
    history, _new = split(request)
    if not history:
        return None
    return conversation_hash(request.key_name, request.model, system_text(request.messages),
                             request.tools, history)


def answer_message(parts: Sequence[Part]) -> Message:
    """The assistant message a client will send back for what the CLI produced."""
    return Message("assistant", tuple(parts))


def canonical_arguments(arguments: str) -> str:
    try:
        return _canonical(orjson.loads(arguments or "{}"))
    except orjson.JSONDecodeError:
        return arguments


def tool_result_text(part: ToolResultPart) -> str:
    return _text(part.content)


def ends_in_tool_calls(history: Sequence[Message]) -> bool:
    """True when ``history`` ends with an assistant message that calls tools."""
    return bool(history) and history[-1].role == "assistant" and any(
        isinstance(p, ToolCallPart) for p in history[-1].parts)


def results_message(turn: Turn) -> Message | None:
    """The turn as the one user message that follows the calls (the tool results
    first, as Anthropic wants them); None when it answers no call."""
    parts = [p for m in turn.messages for p in m.parts]
    if not any(isinstance(p, ToolResultPart) for p in parts):
        return None
    return Message("user", tuple(sorted(parts, key=lambda p: not isinstance(p, ToolResultPart))))


def flatten(history: Sequence[Message], new: Sequence[Message]) -> Message:
    """History and new turn as one user message, for a CLI that cannot load a transcript."""
    lines = ["This conversation so far (continue it; answer the last user message):"]
    for message in history:
        lines.append(f"\n[{message.role}]")
        for part in message.parts:
            if isinstance(part, (TextPart, ExecutedToolPart)):
                lines.append(_text((part,)))
            elif isinstance(part, ToolCallPart):
                lines.append(f"(called tool {part.name} with {part.arguments}, id {part.id})")
            elif isinstance(part, ToolResultPart):
                lines.append(f"(result of tool call {part.call_id}: {tool_result_text(part)})")
    lines.append("\n[user]")
    for message in new:
        for part in message.parts:
            if isinstance(part, TextPart):
                lines.append(part.text)
            elif isinstance(part, ToolResultPart):
                lines.append(f"(result of tool call {part.call_id}: {tool_result_text(part)})")
    return Message("user", (TextPart("\n".join(lines)),))


def _text(parts: Iterable[object]) -> str:
    return "".join(p.text if isinstance(p, TextPart) else executed_text(p)
                   for p in parts if isinstance(p, (TextPart, ExecutedToolPart)))


def _canonical(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode() if value is not None else ""


def _normal(message: Message) -> list[object]:
    out: list[object] = [message.role, _text(message.parts)]
    for part in message.parts:
        if isinstance(part, ToolCallPart):
            out.append(["c", part.id, part.name, canonical_arguments(part.arguments)])
        elif isinstance(part, ToolResultPart):
            out.append(["r", part.call_id, tool_result_text(part), part.is_error])
        elif isinstance(part, ImagePart):
            out.append(["i", part.url or blake2b((part.data or "").encode(),
                                                 digest_size=16).hexdigest()])
    return out
