"""Fold an event stream into a :class:`~pool.model.Completion`.

Non-streaming answers are produced by feeding the very events a streaming
client would see through this one accumulator, so the two paths cannot drift.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, AsyncIterable, Iterable

from .model import (
    Completion, Event, ExecutedTool, ExecutedToolPart, Finish, Logprobs, ReasoningDelta, ReasoningEnd, ReasoningPart, Start,
    TextDelta, TextPart, ToolCallDelta, ToolCallEnd, ToolCallPart, ToolCallStart, Usage,
)

__all__ = ["Accumulator", "accumulate", "fold", "fold_answer", "merge_usage"]


def merge_usage(old: Usage, new: Usage) -> Usage:
    """Field-wise: the newest non-None value wins."""
    if (old.input_tokens is None and old.output_tokens is None and old.cached_tokens is None
            and old.cache_creation_tokens is None and old.reasoning_tokens is None):
        return new  # the first report (usually the only one): nothing to keep of ``old``
    return Usage(
        input_tokens=new.input_tokens if new.input_tokens is not None else old.input_tokens,
        output_tokens=new.output_tokens if new.output_tokens is not None else old.output_tokens,
        cached_tokens=new.cached_tokens if new.cached_tokens is not None else old.cached_tokens,
        cache_creation_tokens=(new.cache_creation_tokens if new.cache_creation_tokens is not None
                               else old.cache_creation_tokens),
        reasoning_tokens=(new.reasoning_tokens if new.reasoning_tokens is not None
                          else old.reasoning_tokens),
    )


class Accumulator:
    """Sans-IO: ``feed(event)`` for each event, then read ``completion``."""

    __slots__ = ("completion", "_text", "_reasoning", "_calls", "_call_slot")

    def __init__(self) -> None:
        self.completion = Completion()
        self._text: list[str] | None = None          # open text part
        self._reasoning: list[str] | None = None     # open reasoning part
        self._calls: dict[int, list[str]] = {}       # index -> argument chunks
        self._call_slot: dict[int, int] = {}         # index -> position in parts

    def feed(self, event: Event) -> None:
        c = self.completion
        t = type(event)
        if t is TextDelta:
            if self._text is None:
                self._close_reasoning()
                self._text = []
                c.parts.append(TextPart(""))
            self._text.append(event.text)
        elif t is ReasoningDelta:
            if self._reasoning is None:
                self._close_text()
                self._reasoning = []
                c.parts.append(ReasoningPart(""))
            self._reasoning.append(event.text)
        elif t is ReasoningEnd:
            self._close_text()
            if event.redacted_data is not None:
                # a redacted block is a part of its own, never the end of an open one
                self._close_reasoning()
            text = "".join(self._reasoning) if self._reasoning is not None else ""
            if self._reasoning is None:
                c.parts.append(ReasoningPart(""))
            c.parts[-1] = ReasoningPart(text, signature=event.signature,
                                        redacted_data=event.redacted_data,
                                        encrypted_content=event.encrypted_content)
            self._reasoning = None
        elif t is ToolCallStart:
            self._close_text()
            self._close_reasoning()
            self._calls[event.index] = []
            self._call_slot[event.index] = len(c.parts)
            c.parts.append(ToolCallPart(event.id, event.name, "", event.kind))
        elif t is ToolCallDelta:
            chunks = self._calls.get(event.index)
            if chunks is not None:
                chunks.append(event.arguments)
        elif t is ToolCallEnd:
            self._close_call(event.index)
        elif t is ExecutedTool:
            self._close_text()
            self._close_reasoning()
            c.parts.append(ExecutedToolPart(event.id, event.name, event.arguments, event.output,
                                            event.is_error, event.server))
        elif t is Usage:
            c.usage = merge_usage(c.usage, event)
        elif t is Finish:
            c.finish = event
        elif t is Logprobs:
            c.logprobs.extend(event.tokens)
        elif t is Start:
            if event.id is not None:
                c.id = event.id
            if event.model is not None:
                c.model = event.model

    def finish(self) -> Completion:
        """Close whatever is still open and return the completion."""
        self._close_text()
        self._close_reasoning()
        for index in list(self._calls):
            self._close_call(index)
        return self.completion

    def _close_text(self) -> None:
        if self._text is not None:
            self.completion.parts[-1] = TextPart("".join(self._text))
            self._text = None

    def _close_reasoning(self) -> None:
        if self._reasoning is not None:
            self.completion.parts[-1] = ReasoningPart("".join(self._reasoning))
            self._reasoning = None

    def _close_call(self, index: int) -> None:
        chunks = self._calls.pop(index, None)
        if chunks is None:
            return
        slot = self._call_slot.pop(index)
        part = self.completion.parts[slot]
        self.completion.parts[slot] = replace(part, arguments="".join(chunks))


def fold(events: Iterable[Event]) -> Completion:
    acc = Accumulator()
    for event in events:
        acc.feed(event)
    return acc.finish()


async def accumulate(events: AsyncIterable[Event]) -> Completion:
    acc = Accumulator()
    async for event in events:
        acc.feed(event)
    return acc.finish()


async def fold_answer(items: AsyncIterable[Any]) -> Completion | bytes:
    """A worker's whole answer: its events (or lists of events, one per
    upstream read) folded into a Completion, or the body a forwarding worker
    yielded; read to the end and closed, so an upstream connection is reused."""
    acc = Accumulator()
    body = None
    try:
        async for item in items:
            t = type(item)
            if t is list:
                for event in item:
                    acc.feed(event)
            elif t is bytes:
                body = item
            else:
                acc.feed(item)
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()
    return body if body is not None else acc.finish()
