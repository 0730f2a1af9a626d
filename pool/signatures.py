"""Signed reasoning never crosses accounts.

An Anthropic ``thinking`` block's ``signature`` and a ``redacted_thinking``
block's ``data`` (like OpenAI's ``encrypted_content``) are valid only for the
account that produced them: sent to another, the upstream refuses the whole
turn ("Invalid `signature` in `thinking` block"). When a conversation moves
to another account, poolgate must therefore know which account signed which
block, and leave out what the new account did not sign.

* Every opaque reasoning value a worker hands out is noted, as a digest
  (never the value), against the worker's *signing account*
  (:func:`signing_account`: a remote worker's upstream and key, else the
  worker's name) in a :class:`SignatureBook` (bounded, with a time to live;
  in Redis when replicas share state).
* Before a request goes to a worker, :func:`keep_for` drops the reasoning
  parts another account signed, from the canonical messages and, for an
  Anthropic client's body that a same-dialect upstream gets as it came,
  from that body too.

Why drop, not turn into text: a signed block is the model's private
reasoning, which Anthropic does not show the model again on later turns
anyway (only the blocks of the tool loop in progress count); as text it
would become something the assistant *said*, and a redacted block has no
text at all. The one block that matters — the thinking that opened the last
assistant turn's tool calls, which Anthropic demands back while thinking is
on — cannot be sent to another account in any form, so that turn runs
without thinking (the API allows it; :mod:`pool.remote.anthropic_thinking`
does it for translated bodies, :func:`keep_for` for a body sent as it came).

A value poolgate never saw (the client's own history, or one whose note
expired) goes on as it is — poolgate cannot tell it is foreign — unless
the conversation is evidently moving: the request carries a value another
account is known to have signed, or the worker that served the previous
turn (``previous_account``) has another account. Then it is dropped too:
sending it would most likely be refused, and dropping costs nothing the
model would see.
"""

from __future__ import annotations

from dataclasses import replace
from hashlib import blake2b
from typing import Any, Mapping, Protocol, Sequence

from .model import ChatRequest, Message, ReasoningPart, ToolCallPart

__all__ = ["SignatureBook", "digest", "opaque_value", "request_digests", "keep_for",
           "signing_account", "signs_per_account"]


class SignatureBook(Protocol):
    """Digest of a signed reasoning value → the account that signed it."""

    async def signers(self, digests: Sequence[str]) -> Mapping[str, str]:
        """The known signer of each of ``digests`` (unknown ones are absent)."""
        ...

    def note(self, account: str, digests: Sequence[str]) -> None:
        """``account`` signed ``digests`` (never waits: a shared store writes
        in the background)."""
        ...

    def stats(self) -> dict[str, Any]: ...


def digest(value: str) -> str:
    """What the book keeps of an opaque value: never the value itself."""
    return blake2b(value.encode(), digest_size=16).hexdigest()


def opaque_value(part: ReasoningPart) -> str | None:
    """The value that binds ``part`` to an account (``None``: it has none)."""
    return part.redacted_data or part.signature or part.encrypted_content


def signing_account(worker: Any) -> str:
    """The account whose signatures ``worker``'s answers carry."""
    return getattr(worker, "signing_account", None) or worker.name


def signs_per_account(worker: Any) -> bool:
    """Whether ``worker``'s upstream refuses what another account signed (an
    Anthropic upstream, a Claude account): only those are sent nothing foreign.
    Other upstreams are left as they were: an OpenAI chat upstream has no slot
    for signed reasoning at all (the translators drop it), and a Gemini
    function-calling turn may need its thought signature back whoever made it."""
    return bool(getattr(worker, "signs_per_account", False))


def request_digests(request: ChatRequest) -> dict[str, str]:
    """Opaque value → digest, for the reasoning in ``request``'s assistant turns
    (empty for the many requests that carry none: no hashing then)."""
    found: dict[str, str] = {}
    for message in request.messages:
        if message.role != "assistant":
            continue
        for part in message.parts:
            if type(part) is ReasoningPart:
                value = opaque_value(part)
                if value is not None and value not in found:
                    found[value] = digest(value)
    return found


def keep_for(request: ChatRequest, account: str, digests: Mapping[str, str],
             signers: Mapping[str, str], previous_account: str | None = None,
             ) -> tuple[ChatRequest, int]:
    """``request`` without the reasoning ``account`` cannot take, and how many
    values were left out. ``digests``: :func:`request_digests`; ``signers``:
    what the book knows of them; ``previous_account``: the account of the
    worker that served the conversation's previous turn, when known."""
    moving = (previous_account is not None and previous_account != account) or any(
        signer != account for signer in signers.values())

    def foreign(value: str) -> bool:
        signer = signers.get(digests[value])
        return signer != account if signer is not None else moving

    dropped = {v for v in digests if foreign(v)}
    if not dropped:
        return request, 0
    messages = tuple(_without(m, dropped) if m.role == "assistant" else m
                     for m in request.messages)
    budget = request.thinking_budget
    if budget is not None and _lost_tool_thinking(request.messages, dropped):
        budget = None  # that turn runs without thinking (a cli worker's CLI is told so)
    raw = request.raw
    if request.dialect == "anthropic" and raw:
        raw = _raw_without(raw, dropped)
    elif raw:
        raw = {}  # another dialect's body: translated from the canonical form instead
    return replace(request, messages=messages, raw=raw, thinking_budget=budget), len(dropped)


def _lost_tool_thinking(messages: Sequence[Message], dropped: set[str]) -> bool:
    """The last assistant turn calls a tool and lost signed reasoning."""
    last = next((m for m in reversed(messages) if m.role == "assistant"), None)
    if last is None or not any(type(p) is ToolCallPart for p in last.parts):
        return False
    return any(type(p) is ReasoningPart and opaque_value(p) in dropped for p in last.parts)


def _without(message: Message, dropped: set[str]) -> Message:
    parts = tuple(p for p in message.parts
                  if type(p) is not ReasoningPart or opaque_value(p) not in dropped)
    return message if len(parts) == len(message.parts) else Message(message.role, parts,
                                                                       message.name)


# --- an Anthropic client's body, sent on as it came -------------------------------

_SIGNED_BLOCKS = {"thinking": "signature", "redacted_thinking": "data"}


def _block_value(block: Any) -> str | None:
    if type(block) is not dict:
        return None
    field = _SIGNED_BLOCKS.get(block.get("type"))  # type: ignore[arg-type]
    value = block.get(field) if field is not None else None
    return value if type(value) is str and value else None


def _raw_without(raw: Mapping[str, Any], dropped: set[str]) -> dict[str, Any]:
    """A copy of ``raw`` without the dropped blocks (the client's body is never
    touched). When the last assistant turn called a tool and lost the thinking
    that opened it, thinking is turned off for this request: Anthropic refuses
    that turn with thinking on and without its block."""
    given = raw.get("messages")
    if type(given) is not list:
        return dict(raw)
    messages = []
    for message in given:
        if type(message) is dict and message.get("role") == "assistant" and type(
                message.get("content")) is list:
            content = message["content"]
            kept = [b for b in content if _block_value(b) not in dropped]
            if not kept:
                continue  # nothing left to say: the API merges the user turns around it
            if len(kept) != len(content):
                message = {**message, "content": kept}
        messages.append(message)
    body = {**raw, "messages": messages}
    if "thinking" in body and _unsigned_tool_turn(messages):
        del body["thinking"]
    return body


def _unsigned_tool_turn(messages: list[Any]) -> bool:
    last = next((m for m in reversed(messages)
                 if type(m) is dict and m.get("role") == "assistant"), None)
    content = last.get("content") if last is not None else None
    if type(content) is not list or not any(
            type(b) is dict and b.get("type") == "tool_use" for b in content):
        return False
    first = content[0] if content else None
    return not (type(first) is dict and first.get("type") in _SIGNED_BLOCKS)

