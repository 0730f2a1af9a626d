"""The canonical model: the contract between the wire dialects (``app/``) and the workers.

Everything here is plain frozen data with no I/O. A dialect decoder turns wire
JSON into a :class:`ChatRequest`; a worker turns a ``ChatRequest`` into an async
stream of :data:`Event`; a dialect encoder turns events into SSE frames, or the
:class:`~pool.accumulate.Accumulator` folds them into a :class:`Completion`
that the encoder renders as one JSON body.

Conventions every producer and consumer relies on:

* Tool results are :class:`ToolResultPart` inside ``user`` messages (the
  Anthropic shape); an OpenAI ``tool`` message decodes to a ``user`` message
  holding one ``ToolResultPart``, and consecutive ones merge.
* ``system`` and ``developer`` messages stay where the client put them.
* Tool call arguments are JSON *text*, as it arrived (never re-serialised), so
  a same-dialect round trip is byte for byte.
* A tool the worker already ran (a CLI in agent mode) is one
  :class:`ExecutedTool` event and one :class:`ExecutedToolPart` in the
  assistant message: call and output together, nothing for the client to
  answer. Dialects with an executed-tool form (Anthropic ``mcp_tool_use`` /
  ``mcp_tool_result``, Responses ``mcp_call``) show it as such; the others as
  :func:`executed_text`.
* ``ChatRequest.raw`` is the client's body exactly as received and
  ``ChatRequest.dialect`` names its dialect; a worker that speaks that dialect
  may send ``raw`` on (with ``model`` and ``stream`` rewritten) so fields the
  canonical form does not model reach the upstream untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Union

__all__ = [
    "TextPart", "ImagePart", "ReasoningPart", "ToolCallPart", "ToolResultPart", "ExecutedToolPart",
    "Part", "ExecutedTool", "executed_text",
    "Message", "Tool", "ToolChoice", "ResponseFormat", "Sampling", "ChatRequest",
    "Start", "TextDelta", "ReasoningDelta", "ReasoningEnd", "ToolCallStart", "ToolCallDelta",
    "ToolCallEnd", "TokenLogprob", "Logprobs", "Usage", "Finish", "Event", "FinishReason",
    "Completion", "Dialect", "Role",
]

Dialect = Literal["openai_chat", "anthropic", "openai_responses", "openai_completions", "native",
                  "gemini"]
Role = Literal["system", "developer", "user", "assistant"]
FinishReason = Literal["stop", "length", "tool_calls", "stop_sequence", "content_filter"]


# --- content parts -----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image, either by URL (``url``) or inline (``data`` base64 + ``media_type``).

    An OpenAI ``data:`` URL is decoded into ``data``/``media_type`` so either
    dialect can re-encode it.
    """

    url: str | None = None
    data: str | None = None
    media_type: str | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class ReasoningPart:
    """Model reasoning. ``signature`` (Anthropic thinking), ``redacted_data``
    (Anthropic redacted_thinking) and ``encrypted_content`` (OpenAI Responses)
    are opaque and must come back byte for byte."""

    text: str = ""
    signature: str | None = None
    redacted_data: str | None = None
    encrypted_content: str | None = None
    id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallPart:
    id: str
    name: str
    arguments: str  # JSON text, as produced by the model
    kind: Literal["function", "custom"] = "function"


@dataclass(frozen=True, slots=True)
class ToolResultPart:
    call_id: str
    content: tuple[TextPart | ImagePart, ...]
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ExecutedToolPart:
    """A tool the worker ran itself (an agent-mode CLI's Read, Bash, ...) with its
    output: shown to the client, never answered by it. ``server`` labels who
    ran it (the CLI's name); ``arguments`` is JSON text."""

    id: str
    name: str
    arguments: str
    output: str = ""
    is_error: bool = False
    server: str | None = None


Part = Union[TextPart, ImagePart, ReasoningPart, ToolCallPart, ToolResultPart, ExecutedToolPart]


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    parts: tuple[Part, ...]
    name: str | None = None


# --- request -----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str | None = None
    parameters: Mapping[str, Any] | None = None  # JSON schema of the arguments
    kind: Literal["function", "custom"] = "function"
    strict: bool | None = None


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``auto`` (model decides), ``none`` (no tools), ``required`` (some tool),
    ``named`` (the tool ``name``). ``parallel`` is ``False`` when the client
    forbade parallel calls, ``None`` when it did not say."""

    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str | None = None
    parallel: bool | None = None


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    type: Literal["text", "json_object", "json_schema"] = "text"
    schema: Mapping[str, Any] | None = None
    name: str | None = None
    strict: bool | None = None


@dataclass(frozen=True, slots=True)
class Sampling:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    # token-level controls of local workers (``/generate``)
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    messages: tuple[Message, ...]
    dialect: Dialect
    stream: bool = False
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice | None = None
    sampling: Sampling = field(default_factory=Sampling)
    response_format: ResponseFormat | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    # reasoning hints: OpenAI ``reasoning_effort`` / Anthropic ``thinking``
    reasoning_effort: str | None = None
    thinking_budget: int | None = None
    # session hints (routing and upstream session reuse)
    user: str | None = None
    session_id: str | None = None
    prompt_cache_key: str | None = None
    metadata: Mapping[str, Any] | None = None
    # the name (never the secret) of the API key the request came with: per-team
    # state (upstream sessions of cli workers) is keyed by it; the gateway sets it
    # on requests that may go to a cli worker
    key_name: str | None = None
    # the gateway's id of the HTTP request (``x-request-id``), set with ``key_name``:
    # a cli worker names it in the errors it reports to the client
    request_id: str | None = None
    # the client's body as received (never mutated), for same-dialect pass-through
    raw: Mapping[str, Any] = field(default_factory=dict)
    # client headers a same-dialect upstream should see (``anthropic-beta``,
    # ``anthropic-version``), lower-case names
    passthrough_headers: Mapping[str, str] = field(default_factory=dict)
    # a raw prompt for workers that continue text (``/v1/completions``, ``/generate``):
    # ``prompt`` is text sent without a chat template, ``prompt_ids`` token ids of
    # the model's tokenizer. ``messages`` still holds the prompt as a user turn
    # for chat-only workers; a worker that takes token ids prefers these.
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None


# --- events --------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Start:
    """First event of every stream, once the worker has accepted the request."""

    id: str | None = None
    model: str | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningEnd:
    """Closes the current reasoning part. A redacted block arrives as a lone
    ``ReasoningEnd(redacted_data=...)``."""

    signature: str | None = None
    redacted_data: str | None = None
    encrypted_content: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    index: int
    id: str
    name: str
    kind: Literal["function", "custom"] = "function"


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    index: int


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    id: int | None = None
    bytes: tuple[int, ...] | None = None
    top: tuple[tuple[str, float], ...] = ()
    top_ids: tuple[int, ...] = ()  # the ids of ``top``, when the worker knows them


@dataclass(frozen=True, slots=True)
class Logprobs:
    tokens: tuple[TokenLogprob, ...]


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts; ``None`` means "not reported in this event". Several Usage
    events may arrive; consumers keep the latest non-None value of each field."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None
    reasoning_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    stop_sequence: str | None = None


@dataclass(frozen=True, slots=True)
class ExecutedTool:
    """The event of an :class:`ExecutedToolPart`: the worker ran a tool (call and
    output, sent once the output is known)."""

    id: str
    name: str
    arguments: str
    output: str = ""
    is_error: bool = False
    server: str | None = None


Event = Union[Start, TextDelta, ReasoningDelta, ReasoningEnd, ToolCallStart, ToolCallDelta,
              ToolCallEnd, ExecutedTool, Logprobs, Usage, Finish]

#: how much of an executed tool's output :func:`executed_text` shows
EXECUTED_TEXT_LIMIT = 2000


def executed_text(part: ExecutedToolPart | ExecutedTool) -> str:
    """An executed tool as plain text, for dialects without an executed-tool form
    (OpenAI chat completions) and for workers that only take text. A client of
    such a dialect sends this very text back, so the CLI session-reuse hash
    (:mod:`pool.cli.history`) counts an executed tool as this text in every
    dialect."""
    label = "error" if part.is_error else "result"
    return (f"\n[{part.name} {part.arguments}]\n"
            f"[{label}: {part.output[:EXECUTED_TEXT_LIMIT]}]\n")


# --- the folded answer ---------------------------------------------------------

@dataclass(slots=True)
class Completion:
    """A whole answer, folded from events by :class:`pool.accumulate.Accumulator`.

    ``parts`` holds ``TextPart``, ``ReasoningPart``, ``ToolCallPart`` and
    ``ExecutedToolPart`` in the
    order the model produced them.
    """

    id: str | None = None
    model: str | None = None
    parts: list[Part] = field(default_factory=list)
    finish: Finish | None = None
    usage: Usage = field(default_factory=Usage)
    logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> list[ToolCallPart]:
        return [p for p in self.parts if isinstance(p, ToolCallPart)]
