"""Decode an Anthropic ``POST /v1/messages`` body into a :class:`ChatRequest`.

Pure and sans-IO. Every rejection is a :class:`BadRequest` whose ``param`` is
the dotted/indexed path of the offending field
(``messages[0].content[1].tool_use_id``). Unknown fields are ignored; they
stay in ``ChatRequest.raw``, which is the body object itself.

Mapping choices:

* top-level ``system`` (a string or a list of text blocks) becomes one leading
  ``Message(role="system")`` with one ``TextPart`` per block, so block
  boundaries (and the ``cache_control`` marks on them, kept in ``raw``) line up;
* ``{"role": "system"}`` entries inside ``messages`` (Claude Code sends them,
  often last) stay where they are;
* ``tool_use.input`` becomes compact JSON text via orjson, key order kept;
* ``thinking``/``redacted_thinking`` blocks become ``ReasoningPart`` with the
  signature or data untouched;
* ``mcp_tool_use`` and its ``mcp_tool_result`` (the executed-tool pair this
  gateway's agent-mode workers answer with, sent back as history) become one
  ``ExecutedToolPart``; a result with no ``mcp_tool_use`` before it in the
  same message is left out;
* block types the canonical form does not model (``document``,
  ``search_result``, ``server_tool_use``, ``web_search_tool_result``, ...) and
  server tools (a ``tools`` entry whose ``type`` is e.g. ``web_search_20250305``)
  are accepted and left out of the canonical form: a same-dialect worker still
  sees them in ``raw``;
* ``metadata.user_id`` is ``ChatRequest.user``; Claude Code sends it as a JSON
  string holding ``session_id``, which becomes ``ChatRequest.session_id``
  (falling back to the ``x-claude-code-session-id`` header); a top-level
  ``session_id`` (string or integer, the seed gateway's field) wins over both
  and is taken out of the body before it goes upstream;
* ``thinking: {"type": "enabled", "budget_tokens": N}`` is ``thinking_budget``
  (a budget above ``max_tokens`` is accepted: Qwen Code sends one);
  ``output_config.effort`` is ``reasoning_effort`` and
  ``output_config.format`` (or the older top-level ``output_format``) a JSON
  schema ``response_format``.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from pool.errors import BadRequest
from pool.model import (
    ChatRequest, ExecutedToolPart, ImagePart, Message, Part, ReasoningPart, ResponseFormat,
    Sampling, TextPart, Tool, ToolCallPart, ToolChoice, ToolResultPart,
)

from .validate import Validators, limit_only

__all__ = ["decode", "decode_count_tokens"]

_ROLES = frozenset(("user", "assistant", "system"))
_TOOL_CHOICE_MODES = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}
_THINKING_TYPES = frozenset(("enabled", "disabled", "adaptive"))
_PASSTHROUGH_HEADERS = ("anthropic-version", "anthropic-beta")
_SESSION_HEADER = "x-claude-code-session-id"


# --- validators: the shared ones, worded as Anthropic words them ------------------

class _Wording(Validators):
    """Anthropic's (pydantic-style) error text; a validator's ``param`` is the enclosing
    location (``""`` at the top level) and the field's key is appended to it."""

    __slots__ = ()

    STRING = "a valid string"
    BOOLEAN = "a valid boolean"
    OBJECT = "a valid object"
    ARRAY = "a valid list"
    INTEGER = "a valid integer"
    NUMBER = "a valid number"

    def missing(self, param: str) -> BadRequest:
        return BadRequest(f"{param}: Field required", param=param)

    def bad_type(self, param: str, expected: str) -> BadRequest:
        return BadRequest(f"{param}: Input should be {expected}", param=param)

    def bad_value(self, param: str, why: str) -> BadRequest:
        return BadRequest(f"{param}: {why}", param=param)

    def out_of_range(self, low: str, high: str | None) -> str:
        if high is None:
            return f"Input should be greater than or equal to {low}"
        return f"Input should be between {low} and {high}"

    def where(self, param: str | None, key: str) -> str:
        return f"{param}.{key}" if param else key


_V = _Wording()
_missing, _bad_type, _bad_value = _V.missing, _V.bad_type, _V.bad_value
_req_str, _opt_str, _opt_bool = _V.req_str, _V.opt_str, _V.opt_bool
_req_dict, _opt_dict, _opt_int, _opt_number = _V.req_dict, _V.opt_dict, _V.opt_int, _V.opt_number
_at = _V.where  # a field's path: loc.key, or key at the top level


# --- content blocks -----------------------------------------------------------------

def _text(block: dict[str, Any], loc: str) -> TextPart:
    return TextPart(_req_str(block, "text", loc))


def _image(block: dict[str, Any], loc: str) -> ImagePart | None:
    source = _req_dict(block, "source", loc)
    sloc = _at(loc, "source")
    kind = _req_str(source, "type", sloc)
    if kind == "base64":
        return ImagePart(data=_req_str(source, "data", sloc),
                         media_type=_req_str(source, "media_type", sloc))
    if kind == "url":
        return ImagePart(url=_req_str(source, "url", sloc))
    return None  # e.g. a Files API reference: raw only


def _tool_use(block: dict[str, Any], loc: str) -> ToolCallPart:
    call_id = _req_str(block, "id", loc)
    name = _req_str(block, "name", loc)
    args = _req_dict(block, "input", loc)
    return ToolCallPart(call_id, name, orjson.dumps(args).decode())


def _tool_result(block: dict[str, Any], loc: str) -> ToolResultPart:
    call_id = _req_str(block, "tool_use_id", loc)
    content = block.get("content")
    parts: tuple[TextPart | ImagePart, ...]
    if content is None:
        parts = ()
    elif type(content) is str:
        parts = (TextPart(content),)
    elif type(content) is list:
        parts = _result_blocks(content, _at(loc, "content"))
    else:
        raise _bad_type(_at(loc, "content"), "a valid string or list of content blocks")
    is_error = _opt_bool(block, "is_error", loc)
    return ToolResultPart(call_id, parts, bool(is_error))


def _result_blocks(blocks: list[Any], loc: str) -> tuple[TextPart | ImagePart, ...]:
    out: list[TextPart | ImagePart] = []
    for k, block in enumerate(blocks):
        bloc = f"{loc}[{k}]"
        kind = _block_type(block, bloc)
        if kind == "text":
            out.append(_text(block, bloc))
        elif kind == "image":
            image = _image(block, bloc)
            if image is not None:
                out.append(image)
        # search_result, document, ...: raw only
    return tuple(out)


def _mcp_tool_use(block: dict[str, Any], loc: str) -> ExecutedToolPart:
    call_id = _req_str(block, "id", loc)
    name = _req_str(block, "name", loc)
    args = _req_dict(block, "input", loc)
    return ExecutedToolPart(call_id, name, orjson.dumps(args).decode(),
                            server=_opt_str(block, "server_name", loc))


def _with_mcp_result(out: list[Part], block: dict[str, Any], loc: str) -> None:
    """Complete the ``mcp_tool_use`` part that ``block`` (an ``mcp_tool_result``) answers."""
    result = _tool_result(block, loc)
    for i in range(len(out) - 1, -1, -1):
        part = out[i]
        if type(part) is ExecutedToolPart and part.id == result.call_id:
            out[i] = ExecutedToolPart(part.id, part.name, part.arguments,
                                      "".join(p.text for p in result.content
                                              if type(p) is TextPart),
                                      result.is_error, part.server)
            return


def _thinking(block: dict[str, Any], loc: str) -> ReasoningPart:
    return ReasoningPart(_req_str(block, "thinking", loc),
                         signature=_opt_str(block, "signature", loc))


def _redacted(block: dict[str, Any], loc: str) -> ReasoningPart:
    return ReasoningPart(redacted_data=_req_str(block, "data", loc))


_BLOCKS = {
    "text": _text,
    "image": _image,
    "tool_use": _tool_use,
    "tool_result": _tool_result,
    "thinking": _thinking,
    "redacted_thinking": _redacted,
    "mcp_tool_use": _mcp_tool_use,
}


def _block_type(block: Any, loc: str) -> str:
    if type(block) is not dict:
        raise _bad_type(loc, "a valid object")
    return _req_str(block, "type", loc)


def _blocks(blocks: list[Any], loc: str) -> tuple[Part, ...]:
    out: list[Part] = []
    for j, block in enumerate(blocks):
        # fast path for the common case, a well-formed text block
        if type(block) is dict and block.get("type") == "text":
            text = block.get("text")
            if type(text) is str:
                out.append(TextPart(text))
                continue
        bloc = f"{loc}[{j}]"
        kind = _block_type(block, bloc)
        if kind == "mcp_tool_result":
            _with_mcp_result(out, block, bloc)
            continue
        decoder = _BLOCKS.get(kind)
        if decoder is not None:
            part = decoder(block, bloc)
            if part is not None:
                out.append(part)
    return tuple(out)


def _content(message: dict[str, Any], loc: str) -> tuple[Part, ...]:
    content = message.get("content")
    if type(content) is str:
        return (TextPart(content),)
    if type(content) is list:
        return _blocks(content, _at(loc, "content"))
    if content is None:
        raise _missing(_at(loc, "content"))
    raise _bad_type(_at(loc, "content"), "a valid string or list of content blocks")


# --- top-level fields ---------------------------------------------------------------

def _messages(value: Any) -> list[Message]:
    if type(value) is not list:
        raise _missing("messages") if value is None else _bad_type("messages", "a valid list")
    if not value:
        raise _bad_value("messages", "at least one message is required")
    out: list[Message] = []
    for i, message in enumerate(value):
        if type(message) is dict:  # the common turn, a role and a string, without error paths
            role, content = message.get("role"), message.get("content")
            if type(content) is str and type(role) is str and role in _ROLES:
                out.append(Message(role, (TextPart(content),)))  # type: ignore[arg-type]
                continue
        loc = f"messages[{i}]"
        if type(message) is not dict:
            raise _bad_type(loc, "a valid object")
        role = _req_str(message, "role", loc)
        if role not in _ROLES:
            raise _bad_value(f"{loc}.role", "Input should be 'user', 'assistant' or 'system'")
        out.append(Message(role, _content(message, loc)))  # type: ignore[arg-type]
    return out


def _system(value: Any) -> Message | None:
    if value is None:
        return None
    if type(value) is str:
        return Message("system", (TextPart(value),)) if value else None
    if type(value) is not list:
        raise _bad_type("system", "a valid string or list of text blocks")
    parts: list[Part] = []
    for k, block in enumerate(value):
        loc = f"system[{k}]"
        kind = _block_type(block, loc)
        if kind != "text":
            raise _bad_value(f"{loc}.type", "Input should be 'text'")
        parts.append(_text(block, loc))
    return Message("system", tuple(parts)) if parts else None


def _tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if type(value) is not list:
        raise _bad_type("tools", "a valid list")
    out: list[Tool] = []
    for k, tool in enumerate(value):
        if type(tool) is not dict:
            raise _bad_type(f"tools[{k}]", "a valid object")
        kind = tool.get("type")
        if kind is not None and kind != "custom":
            if type(kind) is not str:
                raise _bad_type(f"tools[{k}].type", "a valid string")
            continue  # a server tool (web_search_20250305, bash_..., ...): raw only
        # Claude Code sends 20-30 tools per request: check types inline, and only
        # build the parameter path on the error path
        name, description = tool.get("name"), tool.get("description")
        schema, strict = tool.get("input_schema"), tool.get("strict")
        if (type(name) is not str or (description is not None and type(description) is not str)
                or (schema is not None and type(schema) is not dict)
                or (strict is not None and type(strict) is not bool)):
            _raise_tool_error(tool, f"tools[{k}]")
        out.append(Tool(name, description, schema, "function", strict))
    return tuple(out)


def _raise_tool_error(tool: dict[str, Any], loc: str) -> None:
    _req_str(tool, "name", loc)
    _opt_str(tool, "description", loc)
    _opt_dict(tool, "input_schema", loc)
    _opt_bool(tool, "strict", loc)


def _tool_choice(value: Any) -> ToolChoice | None:
    if value is None:
        return None
    if type(value) is not dict:
        raise _bad_type("tool_choice", "a valid object")
    kind = _req_str(value, "type", "tool_choice")
    mode = _TOOL_CHOICE_MODES.get(kind)
    if mode is None:
        raise _bad_value("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")
    name = _req_str(value, "name", "tool_choice") if mode == "named" else None
    disabled = _opt_bool(value, "disable_parallel_tool_use", "tool_choice")
    return ToolChoice(mode, name, None if disabled is None else not disabled)  # type: ignore[arg-type]


def _thinking_budget(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not dict:
        raise _bad_type("thinking", "a valid object")
    kind = _req_str(value, "type", "thinking")
    if kind not in _THINKING_TYPES:
        raise _bad_value("thinking.type", "Input should be 'enabled', 'disabled' or 'adaptive'")
    if kind != "enabled":
        return None
    budget = _opt_int(value, "budget_tokens", 1, param="thinking")
    if budget is None:
        raise _missing("thinking.budget_tokens")
    return budget


def _response_format(value: Any, loc: str) -> ResponseFormat | None:
    if value is None:
        return None
    if type(value) is not dict:
        raise _bad_type(loc, "a valid object")
    if _req_str(value, "type", loc) != "json_schema":
        raise _bad_value(_at(loc, "type"), "Input should be 'json_schema'")
    return ResponseFormat("json_schema", schema=_opt_dict(value, "schema", loc))


def _session_from_user_id(user_id: str) -> str | None:
    """Claude Code's ``user_id`` is JSON text: ``{"device_id", "account_uuid", "session_id"}``."""
    if not user_id.startswith("{"):
        return None
    try:
        parsed = orjson.loads(user_id)
    except orjson.JSONDecodeError:
        return None
    session = parsed.get("session_id") if type(parsed) is dict else None
    return session if type(session) is str and session else None


# --- entry points ---------------------------------------------------------------------

def decode(body: object, headers: Mapping[str, str] | None = None) -> ChatRequest:
    """An Anthropic ``/v1/messages`` body (parsed JSON) as a canonical request."""
    return _decode(body, headers, require_max_tokens=True)


def decode_count_tokens(body: object, headers: Mapping[str, str] | None = None) -> ChatRequest:
    """A ``/v1/messages/count_tokens`` body: the same fields, without ``max_tokens``."""
    return _decode(body, headers, require_max_tokens=False)


# a body of only these (most requests) has no optional field to validate
_SIMPLE_FIELDS = frozenset(("model", "max_tokens", "messages", "stream"))


def _decode(body: object, headers: Mapping[str, str] | None, *,
            require_max_tokens: bool) -> ChatRequest:
    if type(body) is not dict:
        raise BadRequest("The request body must be a JSON object.")
    model = _req_str(body, "model", "")
    max_tokens = _opt_int(body, "max_tokens", 1)
    if max_tokens is None and require_max_tokens:
        raise _missing("max_tokens")
    messages = _messages(body.get("messages"))
    if body.keys() <= _SIMPLE_FIELDS:  # what the general path gives for the absent fields
        return ChatRequest(model=model, messages=tuple(messages), dialect="anthropic",
                           stream=bool(_opt_bool(body, "stream", "")),
                           sampling=limit_only(max_tokens), raw=body,
                           **_from_headers(headers, None))
    system = _system(body.get("system"))
    if system is not None:
        messages.insert(0, system)

    metadata = _opt_dict(body, "metadata", "")
    user = session_id = None
    if metadata is not None:
        user = _opt_str(metadata, "user_id", "metadata")
        if user:
            session_id = _session_from_user_id(user)

    # The seed gateway's own field: a session key (affinity, CLI session reuse) that is
    # poolgate's business only, so it never reaches an upstream.
    if "session_id" in body:
        explicit = body["session_id"]
        if type(explicit) is int:
            explicit = str(explicit)
        elif type(explicit) is not str or not explicit:
            raise BadRequest("session_id must be a non-empty string or an integer.",
                             param="session_id")
        session_id = explicit
        body = {k: v for k, v in body.items() if k != "session_id"}

    from_headers = _from_headers(headers, session_id)
    output_config = _opt_dict(body, "output_config", "")
    effort = None
    response_format = _response_format(body.get("output_format"), "output_format")
    if output_config is not None:
        effort = _opt_str(output_config, "effort", "output_config")
        response_format = (_response_format(output_config.get("format"), "output_config.format")
                           or response_format)

    return ChatRequest(
        model=model,
        messages=tuple(messages),
        dialect="anthropic",
        stream=bool(_opt_bool(body, "stream", "")),
        tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        sampling=Sampling(
            max_tokens=max_tokens,
            temperature=_opt_number(body, "temperature", 0.0, 1.0),
            top_p=_opt_number(body, "top_p", 0.0, 1.0),
            top_k=_opt_int(body, "top_k", 0),
            stop=_V.string_list(body.get("stop_sequences"), "stop_sequences", lone=False),
        ),
        response_format=response_format,
        reasoning_effort=effort,
        thinking_budget=_thinking_budget(body.get("thinking")),
        user=user,
        metadata=metadata,
        raw=body,
        **from_headers,
    )


def _from_headers(headers: Mapping[str, str] | None, session_id: str | None) -> dict[str, Any]:
    """``passthrough_headers`` (the client's ``anthropic-version`` and betas) and
    ``session_id`` (the body's, else the session header's)."""
    passthrough: dict[str, str] = {}
    if headers:
        for name in _PASSTHROUGH_HEADERS:
            value = headers.get(name)
            if value is not None:
                passthrough[name] = value
        if session_id is None:
            session_id = headers.get(_SESSION_HEADER) or None
    return {"passthrough_headers": passthrough, "session_id": session_id}
