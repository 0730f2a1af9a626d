"""The neutral vocabulary every CLI driver speaks (see :mod:`pool.cli.driver`).

A driver turns its CLI's own output (Claude's stream-json lines, Codex's
JSON-RPC notifications, ...) into these frozen events; the host
(:mod:`pool.cli.host`) turns them into the gateway's canonical
:data:`pool.model.Event` stream. What goes *into* a driver is here too: the
set-up of a conversation, a turn, and the answer to a held tool call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Union

from ..model import Message, Tool
from ..quota import QuotaWindow

__all__ = [
    "SessionStarted", "TextChunk", "ThinkingChunk", "ToolExecuted", "ToolOutput", "PendingToolCall",
    "TurnUsage", "RateLimited", "QuotaReport", "Retrying", "TurnFinished", "ToolsPending",
    "TurnFailed", "LoginRequired", "CliEvent", "TERMINAL", "ConversationSetup", "Turn", "ToolAnswer",
    "CliHealth", "LoginState", "Mode", "StopReason",
]

Mode = Literal["chat", "agent"]
LoginState = Literal["ready", "logging_in", "logged_out"]
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "refusal"]


# --- what a driver yields ------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SessionStarted:
    """The CLI's own id of the conversation (Claude session, Codex thread)."""

    session_id: str
    model: str | None = None


@dataclass(frozen=True, slots=True)
class TextChunk:
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingChunk:
    """Reasoning text; a ``signature`` closes the block (Claude ``signature_delta``)."""

    text: str = ""
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class ToolExecuted:
    """Agent mode: the CLI ran one of its own tools (the client need not answer).
    ``arguments`` is JSON text."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """The result of a :class:`ToolExecuted` call."""

    call_id: str
    content: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class PendingToolCall:
    """The model called a tool the API client defined; the CLI's call is held
    open until :meth:`Conversation.answer_tools`. ``arguments`` is JSON text;
    ``name`` is the client's name (any ``mcp__gw__`` prefix stripped)."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """This turn's tokens (drivers subtract cumulative totals themselves)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class RateLimited:
    """The account hit a rate limit or quota; ``reset_at`` is a Unix time when known."""

    message: str
    reset_at: float | None = None


@dataclass(frozen=True, slots=True)
class QuotaReport:
    """The vendor's (or a count's) numbers for some of the account's usage
    windows (:mod:`pool.quota`); the host merges them into the account's quota.
    A driver builds the windows with :func:`pool.cli.quota_events.window` (bounded,
    typed); the report is no failure and does not end a turn."""

    windows: tuple[QuotaWindow, ...]


@dataclass(frozen=True, slots=True)
class Retrying:
    """The CLI retries an upstream call on its own (Claude ``system/api_retry``)."""

    attempt: int
    max_retries: int | None = None
    status: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TurnFinished:
    """Terminal: the turn ended cleanly."""

    stop_reason: StopReason = "end_turn"


@dataclass(frozen=True, slots=True)
class ToolsPending:
    """Terminal for this iterator: every :class:`PendingToolCall` of the step
    was yielded and the CLI waits for their answers."""


@dataclass(frozen=True, slots=True)
class TurnFailed:
    """Terminal: the turn failed. ``kind`` is one of the gateway's error kinds
    (``upstream``, ``timeout``, ``overloaded``, ``invalid_request``,
    ``interrupted``); ``status`` the upstream HTTP status when known."""

    kind: str
    message: str
    status: int | None = None


@dataclass(frozen=True, slots=True)
class LoginRequired:
    """Terminal: the account is not (or no longer) logged in."""

    message: str


CliEvent = Union[SessionStarted, TextChunk, ThinkingChunk, ToolExecuted, ToolOutput,
                 PendingToolCall, TurnUsage, RateLimited, QuotaReport, Retrying, TurnFinished,
                 ToolsPending, TurnFailed, LoginRequired]
#: every iterator a driver returns ends with exactly one of these
TERMINAL = (TurnFinished, ToolsPending, TurnFailed, LoginRequired)


# --- what goes into a driver -------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ConversationSetup:
    """How to open a conversation. ``history`` is what came before the first
    turn (empty for a new conversation): a driver that can load a transcript
    (Claude ``--resume``, Codex ``thread/resume``) rebuilds the session from
    it; otherwise the host flattens it into the first turn instead, and
    ``history`` is empty. ``tools`` are the API client's tools (held calls);
    ``system`` is the system prompt to use (the client's, or the gateway's)."""

    model: str
    system: str | None = None
    tools: tuple[Tool, ...] = ()
    history: tuple[Message, ...] = ()
    max_tokens: int | None = None
    effort: str | None = None           # OpenAI reasoning_effort / CLI --effort
    thinking_budget: int | None = None  # Anthropic thinking.budget_tokens
    workspace: str | None = None        # the key's working directory (None: the account's)


@dataclass(frozen=True, slots=True)
class Turn:
    """One new user turn: its messages (user role; text and images)."""

    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class ToolAnswer:
    """The API client's result for a held :class:`PendingToolCall`. ``note`` is
    text the client sent in the same turn after its tool results (Claude Code
    as a client does this): the host puts it on the last answer, and a driver
    delivers it with that result (a second text block), so the CLI sees it."""

    call_id: str
    content: str
    is_error: bool = False
    note: str = ""

    def blocks(self) -> list[dict[str, str]]:
        """The result as MCP text content blocks (the note as a second one)."""
        return [{"type": "text", "text": t} for t in (self.content, self.note) if t] \
            or [{"type": "text", "text": ""}]


@dataclass(frozen=True, slots=True)
class CliHealth:
    """What :meth:`CliDriver.health` found out about the account."""

    login: LoginState
    version: str | None = None
    account: str | None = None  # email or id, when the CLI says it
    detail: Mapping[str, Any] = field(default_factory=dict)
