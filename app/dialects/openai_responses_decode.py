"""Decode an OpenAI ``POST /v1/responses`` body into a :class:`ChatRequest`.

Pure and sans-IO, except :func:`input_items`, which draws random ids for the
items a client sent without one. Every rejection is a :class:`BadRequest`
naming the parameter path (``input[3].call_id``). Unknown fields are ignored;
they stay in ``ChatRequest.raw``, the body object itself.

Mapping choices:

* ``instructions`` becomes a leading ``system`` message; ``developer`` and
  ``system`` input messages stay where they are.
* Consecutive ``reasoning``, assistant ``message``, ``function_call`` and
  ``custom_tool_call`` items form one assistant turn (reasoning is attached
  to the turn it precedes); consecutive tool outputs form one ``user``
  message of ``ToolResultPart``.
* A ``namespace`` tool is flattened: its member ``t`` of namespace ``ns``
  becomes the canonical tool ``ns__t`` (:data:`NAMESPACE_SEPARATOR`); a
  history ``function_call`` with ``namespace`` maps to the same name and the
  encoder maps it back (:func:`namespace_map`).
* A ``custom`` tool's grammar goes into its description (the canonical tool
  has no grammar field), so a chat worker's model sees it.
* Hosted tools (``web_search``, ``file_search``, ``mcp``, ...) and unknown
  tool types are left out of the canonical tools; forcing one with
  ``tool_choice`` is refused. Records of hosted tool calls in the input
  (``web_search_call``, ...) are skipped, except ``mcp_call``: this
  gateway's agent-mode workers answer with it (a tool the CLI ran), so it
  comes back as an ``ExecutedToolPart`` of the assistant turn.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Mapping, Sequence

from pool.errors import BadRequest
from pool.model import (
    ChatRequest, ImagePart, Message, Part, ReasoningPart, ResponseFormat, Sampling, TextPart,
    Tool, ToolCallPart, ToolChoice, ToolResultPart,
)

from .openai_responses_carry import uncarried
from .openai_responses_mcp import mcp_call_part
from .validate import (
    bad_type, bad_value, first_header, image_url, missing, opt_bool, opt_dict, opt_int, opt_list,
    opt_number, opt_str, req_str,
)

__all__ = ["decode", "input_items", "namespace_map", "NAMESPACE_SEPARATOR"]

NAMESPACE_SEPARATOR = "__"
_ROLES = ("user", "assistant", "system", "developer")
_SESSION_HEADERS = ("session_id", "session-id", "x-session-id")
# records of hosted tools at work: history the gateway has no worker-side meaning for
_HOSTED_RECORDS = frozenset((
    "web_search_call", "file_search_call", "tool_search_call", "tool_search_output",
    "image_generation_call", "code_interpreter_call", "mcp_list_tools",
    "mcp_approval_request", "mcp_approval_response"))
_ID_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_",
              "custom_tool_call": "ctc_", "custom_tool_call_output": "ctco_", "reasoning": "rs_",
              "mcp_call": "mcp_"}


# --- content ------------------------------------------------------------------------

def _image(part: dict[str, Any], param: str) -> ImagePart:
    detail = opt_str(part, "detail", param + ".detail")
    url = part.get("image_url")
    if url is None:
        if part.get("file_id") is not None:
            raise BadRequest(f"Images by 'file_id' ('{param}.file_id') are not supported; "
                             "send 'image_url' (an http(s) or data: URL).",
                             param=param + ".file_id")
        raise missing(param + ".image_url")
    if type(url) is not str:
        raise bad_type(param + ".image_url", "a string")
    return image_url(url, detail, param + ".image_url")


def _part(part: object, param: str, images: bool) -> TextPart | ImagePart:
    if type(part) is not dict:
        raise bad_type(param, "an object")
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return TextPart(req_str(part, "text", param + ".text"))
    if kind == "refusal":
        return TextPart(req_str(part, "refusal", param + ".refusal"))
    if kind == "input_image" and images:
        return _image(part, param)
    if kind is None:
        raise missing(param + ".type")
    if kind in ("input_image", "input_file", "input_audio"):
        raise BadRequest(f"Content part '{kind}' at '{param}' is not supported here.",
                         param=param)
    raise bad_value(param + ".type", f"unsupported content part type {kind!r}")


def _content(content: object, param: str, images: bool) -> list[TextPart | ImagePart]:
    if type(content) is str:
        return [TextPart(content)]
    if type(content) is list:
        return [_part(p, f"{param}[{j}]", images) for j, p in enumerate(content)]
    if content is None:
        raise missing(param)
    raise bad_type(param, "a string or an array of content parts")


def _reasoning(item: dict[str, Any], param: str) -> ReasoningPart:
    summary = item.get("summary")
    texts: list[str] = []
    if summary is not None:
        if type(summary) is not list:
            raise bad_type(param + ".summary", "an array")
        for j, s in enumerate(summary):
            if type(s) is not dict:
                raise bad_type(f"{param}.summary[{j}]", "an object")
            texts.append(req_str(s, "text", f"{param}.summary[{j}].text"))
    content = item.get("content")
    if not texts and type(content) is list:  # raw reasoning text, when there is no summary
        texts = [c["text"] for c in content if type(c) is dict and type(c.get("text")) is str]
    signature, redacted, encrypted = uncarried(
        opt_str(item, "encrypted_content", param + ".encrypted_content"))
    return ReasoningPart("\n\n".join(texts), signature=signature, redacted_data=redacted,
                         encrypted_content=encrypted, id=opt_str(item, "id", param + ".id"))


def _call_name(item: dict[str, Any], param: str) -> str:
    name = req_str(item, "name", param + ".name")
    namespace = opt_str(item, "namespace", param + ".namespace")
    return namespace + NAMESPACE_SEPARATOR + name if namespace else name


def _output(item: dict[str, Any], param: str) -> ToolResultPart:
    call_id = req_str(item, "call_id", param + ".call_id")
    return ToolResultPart(call_id, tuple(_content(item.get("output"), param + ".output", True)))


class _Turns:
    """Folds input items into canonical messages, one turn at a time."""

    __slots__ = ("out", "_assistant", "_results")

    def __init__(self, out: list[Message]) -> None:
        self.out = out
        self._assistant: list[Part] | None = None
        self._results: list[ToolResultPart] | None = None

    def _flush(self) -> None:
        if self._assistant is not None:
            self.out.append(Message("assistant", tuple(self._assistant)))
            self._assistant = None
        if self._results is not None:
            self.out.append(Message("user", tuple(self._results)))
            self._results = None

    def _turn(self) -> list[Part]:
        if self._results is not None:
            self._flush()
        if self._assistant is None:
            self._assistant = []
        return self._assistant

    def _result(self, part: ToolResultPart) -> None:
        if self._assistant is not None:
            self._flush()
        if self._results is None:
            self._results = []
        self._results.append(part)

    def add(self, item: object, param: str) -> None:
        if type(item) is not dict:
            raise bad_type(param, "an object")
        kind = item.get("type")
        if kind == "message" or (kind is None and "role" in item):
            self._message(item, param)
        elif kind == "function_call":
            call_id = req_str(item, "call_id", param + ".call_id")
            name = _call_name(item, param)
            self._turn().append(ToolCallPart(
                call_id, name, req_str(item, "arguments", param + ".arguments")))
        elif kind == "custom_tool_call":
            call_id = req_str(item, "call_id", param + ".call_id")
            name = _call_name(item, param)
            self._turn().append(ToolCallPart(
                call_id, name, req_str(item, "input", param + ".input"), "custom"))
        elif kind == "function_call_output" or kind == "custom_tool_call_output":
            self._result(_output(item, param))
        elif kind == "reasoning":
            self._turn().append(_reasoning(item, param))
        elif kind == "mcp_call":
            self._turn().append(mcp_call_part(item, param))
        elif kind is None:
            raise missing(param + ".type")
        elif type(kind) is not str:
            raise bad_type(param + ".type", "a string")
        elif kind in _HOSTED_RECORDS:
            pass
        else:
            raise bad_value(param + ".type", f"unsupported input item type {kind!r}")

    def _message(self, item: dict[str, Any], param: str) -> None:
        role = item.get("role")
        if role == "assistant":
            self._turn().extend(_content(item.get("content"), param + ".content", False))
            return
        if role not in _ROLES:
            if role is None:
                raise missing(param + ".role")
            raise bad_value(param + ".role", f"expected one of {', '.join(_ROLES)}")
        parts = _content(item.get("content"), param + ".content", role == "user")
        self._flush()
        self.out.append(Message(role, tuple(parts)))

    def close(self) -> list[Message]:
        self._flush()
        return self.out


# --- tools and options --------------------------------------------------------------

def _custom_description(tool: dict[str, Any], param: str) -> str | None:
    description = opt_str(tool, "description", param + ".description")
    fmt = opt_dict(tool, "format", param + ".format")
    if fmt is None or fmt.get("type") != "grammar":
        return description
    definition = opt_str(fmt, "definition", param + ".format.definition")
    if not definition:
        return description
    syntax = opt_str(fmt, "syntax", param + ".format.syntax") or "lark"
    grammar = f"The input must match this {syntax} grammar:\n{definition}"
    return f"{description}\n\n{grammar}" if description else grammar


def _tool(tool: dict[str, Any], kind: object, param: str, prefix: str = "") -> Tool | None:
    if kind == "function":
        return Tool(prefix + req_str(tool, "name", param + ".name"),
                    opt_str(tool, "description", param + ".description"),
                    opt_dict(tool, "parameters", param + ".parameters"),
                    strict=opt_bool(tool, "strict", param + ".strict"))
    if kind == "custom":
        return Tool(prefix + req_str(tool, "name", param + ".name"),
                    _custom_description(tool, param), kind="custom")
    return None  # a hosted tool


def _tools(value: object) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if type(value) is not list:
        raise bad_type("tools", "an array")
    out: list[Tool] = []
    for k, spec in enumerate(value):
        param = f"tools[{k}]"
        if type(spec) is not dict:
            raise bad_type(param, "an object")
        kind = spec.get("type")
        if kind is None:
            raise missing(param + ".type")
        if kind != "namespace":
            tool = _tool(spec, kind, param)
            if tool is not None:
                out.append(tool)
            continue
        prefix = req_str(spec, "name", param + ".name") + NAMESPACE_SEPARATOR
        about = opt_str(spec, "description", param + ".description")
        members = spec.get("tools") or ()  # the fixtures' recorder dropped namespace bodies
        if type(members) is not list and type(members) is not tuple:
            raise bad_type(param + ".tools", "an array")
        for j, member in enumerate(members):
            if type(member) is not dict:
                raise bad_type(f"{param}.tools[{j}]", "an object")
            tool = _tool(member, member.get("type", "function"), f"{param}.tools[{j}]", prefix)
            if tool is not None:
                if about:  # the model sees the namespace's description with each member
                    tool = replace(tool, description=f"{about}\n\n{tool.description}"
                                   if tool.description else about)
                out.append(tool)
    return tuple(out)


def namespace_map(tools: object) -> dict[str, tuple[str, str]]:
    """Flattened canonical name -> (namespace, member name), for the encoder."""
    out: dict[str, tuple[str, str]] = {}
    if type(tools) is not list:
        return out
    for spec in tools:
        if type(spec) is dict and spec.get("type") == "namespace":
            ns, members = spec.get("name"), spec.get("tools")
            if type(ns) is str and type(members) is list:
                for m in members:
                    if type(m) is dict and type(m.get("name")) is str:
                        out[ns + NAMESPACE_SEPARATOR + m["name"]] = (ns, m["name"])
    return out


def _tool_choice(value: object, parallel: bool | None) -> ToolChoice | None:
    if value is None:
        return None if parallel is None else ToolChoice("auto", parallel=parallel)
    if type(value) is str:
        if value in ("auto", "none", "required"):
            return ToolChoice(value, parallel=parallel)
        raise bad_value("tool_choice", "expected 'auto', 'none', 'required' or a named tool")
    if type(value) is not dict:
        raise bad_type("tool_choice", "a string or an object")
    kind = value.get("type")
    if kind in ("function", "custom"):
        name = req_str(value, "name", "tool_choice.name")
        namespace = opt_str(value, "namespace", "tool_choice.namespace")
        if namespace:
            name = namespace + NAMESPACE_SEPARATOR + name
        return ToolChoice("named", name, parallel)
    if kind == "allowed_tools":
        mode = value.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise bad_value("tool_choice.mode", "expected 'auto' or 'required'")
        return ToolChoice(mode, parallel=parallel)
    if kind is None:
        raise missing("tool_choice.type")
    raise BadRequest(f"Invalid value for 'tool_choice': forcing the tool type {kind!r} is not "
                     "supported (hosted tools are not available here).", param="tool_choice")


def _response_format(text: dict[str, Any] | None) -> ResponseFormat | None:
    if text is None:
        return None
    opt_str(text, "verbosity", "text.verbosity")
    fmt = opt_dict(text, "format", "text.format")
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return ResponseFormat(kind)
    if kind == "json_schema":
        return ResponseFormat("json_schema", opt_dict(fmt, "schema", "text.format.schema"),
                              req_str(fmt, "name", "text.format.name"),
                              opt_bool(fmt, "strict", "text.format.strict"))
    if kind is None:
        raise missing("text.format.type")
    raise bad_value("text.format.type", "expected 'text', 'json_object' or 'json_schema'")


def _session_id(body: dict[str, Any], headers: Mapping[str, str] | None) -> str | None:
    session_id = first_header(headers, _SESSION_HEADERS)
    if session_id is not None:
        return session_id
    meta = body.get("client_metadata")
    if type(meta) is dict and type(meta.get("session_id")) is str:
        return meta["session_id"] or None
    return None


def decode(body: object, headers: Mapping[str, str] | None = None, *,
           history: Sequence[Mapping[str, Any]] = ()) -> ChatRequest:
    """Validate and translate a Responses body; ``history`` holds the stored items of the
    ``previous_response_id`` chain, placed before this request's input."""
    if type(body) is not dict:
        raise BadRequest("The request body must be a JSON object.")
    model = req_str(body, "model", "model")
    if not model:
        raise bad_value("model", "must not be empty")
    messages: list[Message] = []
    instructions = opt_str(body, "instructions", "instructions")
    if instructions:
        messages.append(Message("system", (TextPart(instructions),)))
    turns = _Turns(messages)
    for k, item in enumerate(history):
        turns.add(item, f"previous_response_id[{k}]")
    value = body.get("input")
    if type(value) is str:
        turns.add({"role": "user", "content": value}, "input")
    elif type(value) is list:
        for k, item in enumerate(value):
            turns.add(item, f"input[{k}]")
    elif value is not None:
        raise bad_type("input", "a string or an array of input items")
    elif not history:
        raise missing("input")
    reasoning = opt_dict(body, "reasoning", "reasoning")
    effort = None
    if reasoning is not None:
        effort = opt_str(reasoning, "effort", "reasoning.effort")
        opt_str(reasoning, "summary", "reasoning.summary")
    opt_list(body, "include")
    for key in ("previous_response_id", "truncation", "service_tier"):
        opt_str(body, key, key)
    opt_bool(body, "store")
    return ChatRequest(
        model=model,
        messages=tuple(turns.close()),
        dialect="openai_responses",
        stream=bool(opt_bool(body, "stream")),
        tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice"), opt_bool(body, "parallel_tool_calls")),
        sampling=Sampling(max_tokens=opt_int(body, "max_output_tokens", 1),
                          temperature=opt_number(body, "temperature", 0, 2),
                          top_p=opt_number(body, "top_p", 0, 1)),
        response_format=_response_format(opt_dict(body, "text", "text")),
        reasoning_effort=effort,
        user=opt_str(body, "user", "user"),
        session_id=_session_id(body, headers),
        prompt_cache_key=opt_str(body, "prompt_cache_key", "prompt_cache_key"),
        metadata=opt_dict(body, "metadata", "metadata"),
        raw=body,
    )


def input_items(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """This request's input as items with ids, as the store keeps them: the client's ids
    kept (and its item objects, uncopied), fresh random ids where it gave none."""
    value = body.get("input")
    if type(value) is str:
        return [{"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": value}],
                 "id": "msg_" + os.urandom(12).hex()}]
    if type(value) is not list:
        return []
    out: list[dict[str, Any]] = []
    for item in value:
        if type(item) is not dict:
            continue
        kind = item.get("type")
        if type(item.get("id")) is str and kind is not None:
            out.append(item)
            continue
        fixed = dict(item)
        if kind is None:
            fixed["type"] = kind = "message"
        if type(fixed.get("id")) is not str:
            fixed["id"] = _ID_PREFIX.get(kind, "item_") + os.urandom(12).hex()
        out.append(fixed)
    return out
