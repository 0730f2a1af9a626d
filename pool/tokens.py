"""A deterministic estimate of a request's input tokens, for
``POST /v1/messages/count_tokens`` when no worker can count exactly.

Claude Code calls count_tokens to plan its context; a 404 there makes it fall
back to billable calls, so the gateway always answers, with the upstream's
exact count when the worker offers one (``RemoteWorker.count_tokens``) and
with :func:`estimate_tokens` otherwise.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from .model import (
    ChatRequest, ExecutedToolPart, ImagePart, Message, ReasoningPart, TextPart, Tool, ToolCallPart,
    ToolResultPart, executed_text,
)

__all__ = ["estimate_tokens", "BYTES_PER_TOKEN", "IMAGE_TOKENS", "LOW_DETAIL_IMAGE_TOKENS"]

BYTES_PER_TOKEN = 4           # BPE vocabularies average about 4 bytes of English/code a token
IMAGE_TOKENS = 1600           # Anthropic's cost of a full-size image (about 1.15 megapixels)
LOW_DETAIL_IMAGE_TOKENS = 85  # OpenAI's cost of a ``detail: low`` image
_REQUEST_TOKENS = 3           # priming of the assistant turn
_MESSAGE_TOKENS = 4           # role and turn delimiters
_PART_TOKENS = 3              # a tool call's or tool result's framing
_TOOLS_PREAMBLE_TOKENS = 300  # the instructions a server adds when any tool is offered
_TOOL_TOKENS = 10             # per tool definition, besides its text


def _text_tokens(text: str) -> int:
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return -(-size // BYTES_PER_TOKEN)  # rounded up


def _json_tokens(value: Mapping[str, Any] | None) -> int:
    if not value:
        return 0
    return -(-len(orjson.dumps(value, default=dict)) // BYTES_PER_TOKEN)


def _image_tokens(part: ImagePart) -> int:
    return LOW_DETAIL_IMAGE_TOKENS if part.detail == "low" else IMAGE_TOKENS


def _content_tokens(parts: tuple[TextPart | ImagePart, ...]) -> int:
    return sum(_text_tokens(p.text) if type(p) is TextPart else _image_tokens(p) for p in parts)


def _message_tokens(message: Message) -> int:
    total = _MESSAGE_TOKENS
    if message.name:
        total += _text_tokens(message.name)
    for part in message.parts:
        t = type(part)
        if t is TextPart:
            total += _text_tokens(part.text)
        elif t is ImagePart:
            total += _image_tokens(part)
        elif t is ToolCallPart:
            total += (_PART_TOKENS + _text_tokens(part.id) + _text_tokens(part.name)
                      + _text_tokens(part.arguments))
        elif t is ToolResultPart:
            total += _PART_TOKENS + _text_tokens(part.call_id) + _content_tokens(part.content)
        elif t is ExecutedToolPart:  # what a text-only model is shown of it
            total += _PART_TOKENS + _text_tokens(executed_text(part))
        elif t is ReasoningPart:
            # opaque signatures and encrypted reasoning are not model-visible text
            total += _text_tokens(part.text)
    return total


def _tool_tokens(tool: Tool) -> int:
    return (_TOOL_TOKENS + _text_tokens(tool.name) + _text_tokens(tool.description or "")
            + _json_tokens(tool.parameters))


def estimate_tokens(request: ChatRequest) -> int:
    """Estimated input tokens of ``request``: its messages (system and
    developer ones included, as the canonical form keeps them) and its tools.

    How: every text (message text, reasoning text, tool call name, id and
    arguments, tool result text, tool names and descriptions) counts its
    UTF-8 bytes / 4, rounded up per text; a tool's JSON schema counts its
    compact JSON bytes / 4; an image counts 1600 (85 with ``detail: low``).
    On top: 3 per request, 4 per message, 3 per tool call or result, 10 per
    tool, and 300 once when any tool is offered (servers add tool-use
    instructions). Deterministic, and never smaller when content is added.

    Expected error: within about ±25% for English prose and code on the
    common BPE tokenizers (OpenAI o200k/cl100k, Claude). It under-counts
    text whose characters are many tokens each (CJK text can be 30-50% low,
    since a 3-byte character is often one or more tokens) and over-counts
    long runs of repeated characters. Images are a flat guess: a small image
    is over-counted, and the real cost depends on its pixels.
    """
    total = _REQUEST_TOKENS + sum(_message_tokens(m) for m in request.messages)
    if request.tools:
        total += _TOOLS_PREAMBLE_TOKENS + sum(_tool_tokens(t) for t in request.tools)
    return total
