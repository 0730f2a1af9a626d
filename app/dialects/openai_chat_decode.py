"""Decode an OpenAI ``POST /v1/chat/completions`` body into a :class:`ChatRequest`.

Pure and sans-IO. Every rejection is a :class:`BadRequest` whose ``param`` is
the dotted/indexed path of the offending field (``messages[1].content[0].text``),
so the client sees OpenAI's own error shape. Unknown fields are ignored; they
stay in ``ChatRequest.raw``, which is the body object itself.

Lenient where real clients or servers differ from the spec: more than four
``stop`` strings, ``reasoning_content`` (vLLM/DeepSeek) or ``reasoning`` on
assistant turns, a Responses-style flat tool (``{"type": "function", "name":
...}``), ``top_k`` (a vLLM extension), any ``reasoning_effort`` string.
"""

from __future__ import annotations

from typing import Any, Mapping

from pool.errors import BadRequest
from pool.model import (
    ChatRequest, ImagePart, Message, Part, ReasoningPart, ResponseFormat, Sampling, TextPart,
    Tool, ToolCallPart, ToolChoice, ToolResultPart,
)

from .validate import (
    bad_type, bad_value, first_header, image_url, limit_only, missing, opt_bool, opt_dict, opt_int,
    opt_number, opt_str, req_dict, req_str, string_list,
)

__all__ = ["decode"]

_ROLES = ("system", "developer", "user", "assistant", "tool")
_PLAIN_ROLES = frozenset(("system", "developer", "user", "assistant"))
# content part types beyond "text" each role may send
_USER_PARTS = frozenset(("image_url",))
_ASSISTANT_PARTS = frozenset(("refusal",))
_SYSTEM_PARTS: frozenset[str] = frozenset()
_UNSUPPORTED_PARTS = {"input_audio": "audio input", "file": "file input"}
_SESSION_HEADERS = ("x-session-id", "session_id", "session-id")


# --- content -----------------------------------------------------------------------

def _image(part: dict[str, Any], param: str) -> ImagePart:
    spec = part.get("image_url")
    if type(spec) is str:  # lenient: a bare URL string
        url, detail = spec, None
    elif type(spec) is dict:
        url = req_str(spec, "url", param + ".image_url.url")
        detail = opt_str(spec, "detail", param + ".image_url.detail")
    elif spec is None:
        raise missing(param + ".image_url")
    else:
        raise bad_type(param + ".image_url", "an object")
    return image_url(url, detail, param + ".image_url.url")


def _part(part: object, param: str, kinds: frozenset[str]) -> TextPart | ImagePart:
    if type(part) is not dict:
        raise bad_type(param, "an object")
    kind = part.get("type")
    if kind == "text":
        return TextPart(req_str(part, "text", param + ".text"))
    if kind is not None and type(kind) is not str:
        raise bad_type(param + ".type", "a string")
    if kind in kinds:
        if kind == "image_url":
            return _image(part, param)
        return TextPart(req_str(part, "refusal", param + ".refusal"))  # an earlier refusal
    if kind is None:
        raise missing(param + ".type")
    if kind in _UNSUPPORTED_PARTS:
        raise BadRequest(f"Content part '{kind}' ({_UNSUPPORTED_PARTS[kind]}) at '{param}' is "
                         "not supported.", param=param)
    raise bad_value(param + ".type", f"unsupported content part type {kind!r}")


def _content(content: object, param: str, kinds: frozenset[str]) -> list[TextPart | ImagePart]:
    if type(content) is str:
        return [TextPart(content)]
    if type(content) is list:
        return [_part(p, f"{param}[{j}]", kinds) for j, p in enumerate(content)]
    raise bad_type(param, "a string or an array of content parts")


def _tool_call(call: object, param: str) -> ToolCallPart:
    if type(call) is not dict:
        raise bad_type(param, "an object")
    call_id = req_str(call, "id", param + ".id")
    kind = call.get("type", "function")
    if kind == "custom":
        spec = req_dict(call, "custom", param + ".custom")
        return ToolCallPart(call_id, req_str(spec, "name", param + ".custom.name"),
                            req_str(spec, "input", param + ".custom.input"), "custom")
    if kind != "function":
        raise bad_value(param + ".type", "expected 'function' or 'custom'")
    spec = req_dict(call, "function", param + ".function")
    return ToolCallPart(call_id, req_str(spec, "name", param + ".function.name"),
                        req_str(spec, "arguments", param + ".function.arguments"))


def _assistant(msg: dict[str, Any], param: str) -> Message:
    parts: list[Part] = []
    reasoning = msg.get("reasoning_content")
    if reasoning is None:
        reasoning = msg.get("reasoning")
    if reasoning is not None:
        if type(reasoning) is not str:
            raise bad_type(param + ".reasoning_content", "a string")
        parts.append(ReasoningPart(reasoning))
    content = msg.get("content")
    if content is not None:
        parts.extend(_content(content, param + ".content", _ASSISTANT_PARTS))
    calls = msg.get("tool_calls")
    if calls is not None:
        if type(calls) is not list:
            raise bad_type(param + ".tool_calls", "an array")
        parts.extend(_tool_call(c, f"{param}.tool_calls[{k}]") for k, c in enumerate(calls))
    return Message("assistant", tuple(parts), opt_str(msg, "name", param + ".name"))


def _tool_result(msg: dict[str, Any], param: str) -> ToolResultPart:
    call_id = req_str(msg, "tool_call_id", param + ".tool_call_id")
    content = msg.get("content")
    if content is None:
        raise missing(param + ".content")
    return ToolResultPart(call_id, tuple(_content(content, param + ".content", _USER_PARTS)))


def _text_only(content: object) -> tuple[TextPart, ...] | None:
    """The common case, checked without building error paths: a string or only text parts.
    ``None`` sends the message down the validating path."""
    if type(content) is str:
        return (TextPart(content),)
    if type(content) is not list:
        return None
    parts = []
    for part in content:
        if type(part) is not dict or part.get("type") != "text":
            return None
        text = part.get("text")
        if type(text) is not str:
            return None
        parts.append(TextPart(text))
    return tuple(parts)


def _plain(msg: dict[str, Any], role: object) -> Message | None:
    if type(role) is not str or role not in _PLAIN_ROLES:  # any JSON may come: a list is unhashable
        return None
    name = msg.get("name")
    if name is not None and type(name) is not str:
        return None
    if role == "assistant" and (msg.get("tool_calls") is not None
                                or msg.get("reasoning_content") is not None
                                or msg.get("reasoning") is not None):
        return None
    parts = _text_only(msg.get("content"))
    return None if parts is None else Message(role, parts, name)  # type: ignore[arg-type]


def _message(msg: dict[str, Any], role: object, param: str) -> Message:
    if role == "assistant":
        return _assistant(msg, param)
    if role in ("user", "system", "developer"):
        content = msg.get("content")
        if content is None:
            raise missing(param + ".content")
        kinds = _USER_PARTS if role == "user" else _SYSTEM_PARTS
        parts = tuple(_content(content, param + ".content", kinds))
        name = opt_str(msg, "name", param + ".name")
        return Message(role, parts, name)  # type: ignore[arg-type]
    if role is None:
        raise missing(param + ".role")
    if role == "function":
        raise BadRequest(f"Invalid value for '{param}.role': the deprecated 'function' role "
                         "is not supported; use 'tool' messages.", param=param + ".role")
    raise bad_value(param + ".role", f"expected one of {', '.join(_ROLES)}")


def _messages(value: object) -> tuple[Message, ...]:
    if type(value) is not list:
        raise missing("messages") if value is None else bad_type("messages", "an array")
    if not value:
        raise bad_value("messages", "must contain at least one message")
    out: list[Message] = []
    results: list[ToolResultPart] | None = None  # the open run of tool messages
    for i, msg in enumerate(value):
        if type(msg) is not dict:
            raise bad_type(f"messages[{i}]", "an object")
        role = msg.get("role")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            parts = _text_only(msg.get("content")) if type(call_id) is str else None
            result = (ToolResultPart(call_id, parts) if parts is not None  # type: ignore[arg-type]
                      else _tool_result(msg, f"messages[{i}]"))
            if results is None:
                results = [result]
            else:
                results.append(result)
            continue
        if results is not None:
            out.append(Message("user", tuple(results)))
            results = None
        message = _plain(msg, role)
        out.append(message if message is not None else _message(msg, role, f"messages[{i}]"))
    if results is not None:
        out.append(Message("user", tuple(results)))
    return tuple(out)


# --- tools and options -------------------------------------------------------------

def _tool(tool: object, param: str) -> Tool:
    if type(tool) is not dict:
        raise bad_type(param, "an object")
    kind = tool.get("type", "function")
    if kind == "function":
        if tool.get("function") is None and type(tool.get("name")) is str:
            spec = tool  # a Responses-style flat tool
        else:
            param += ".function"
            spec = req_dict(tool, "function", param)
        return Tool(req_str(spec, "name", param + ".name"),
                    opt_str(spec, "description", param + ".description"),
                    opt_dict(spec, "parameters", param + ".parameters"),
                    strict=opt_bool(spec, "strict", param + ".strict"))
    if kind == "custom":
        spec = req_dict(tool, "custom", param + ".custom")
        return Tool(req_str(spec, "name", param + ".custom.name"),
                    opt_str(spec, "description", param + ".custom.description"), kind="custom")
    raise bad_value(param + ".type", "expected 'function' or 'custom'")


def _plain_tool(tool: object) -> Tool | None:
    """The common well-formed function tool, without building error paths."""
    if type(tool) is not dict or tool.get("type") != "function":
        return None
    spec = tool.get("function")
    if type(spec) is not dict:
        return None
    name, description = spec.get("name"), spec.get("description")
    parameters, strict = spec.get("parameters"), spec.get("strict")
    if (type(name) is str and (description is None or type(description) is str)
            and (parameters is None or type(parameters) is dict)
            and (strict is None or type(strict) is bool)):
        return Tool(name, description, parameters, "function", strict)
    return None


def _tools(value: object) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if type(value) is not list:
        raise bad_type("tools", "an array")
    out = []
    for k, spec in enumerate(value):
        tool = _plain_tool(spec)
        out.append(tool if tool is not None else _tool(spec, f"tools[{k}]"))
    return tuple(out)


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
        spec = req_dict(value, kind, f"tool_choice.{kind}")
        return ToolChoice("named", req_str(spec, "name", f"tool_choice.{kind}.name"), parallel)
    if kind == "allowed_tools":
        spec = value.get("allowed_tools")
        mode = spec.get("mode", "auto") if type(spec) is dict else None
        if mode not in ("auto", "required"):
            raise bad_value("tool_choice.allowed_tools.mode", "expected 'auto' or 'required'")
        return ToolChoice(mode, parallel=parallel)
    raise bad_value("tool_choice.type", "expected 'function', 'custom' or 'allowed_tools'")


def _response_format(value: object) -> ResponseFormat | None:
    if value is None:
        return None
    if type(value) is not dict:
        raise bad_type("response_format", "an object")
    kind = value.get("type")
    if kind in ("text", "json_object"):
        return ResponseFormat(kind)
    if kind == "json_schema":
        spec = req_dict(value, "json_schema", "response_format.json_schema")
        strict = opt_bool(spec, "strict", "response_format.json_schema.strict")
        return ResponseFormat("json_schema",
                              opt_dict(spec, "schema", "response_format.json_schema.schema"),
                              req_str(spec, "name", "response_format.json_schema.name"), strict)
    if kind is None:
        raise missing("response_format.type")
    raise bad_value("response_format.type", "expected 'text', 'json_object' or 'json_schema'")


# sampling fields beyond the token limit: most requests send none of them
_SAMPLING_REST = frozenset(("top_k", "temperature", "top_p", "stop", "seed", "n",
                            "stop_token_ids", "ignore_eos"))
_NO_SAMPLING = Sampling()


def _sampling(body: dict[str, Any]) -> Sampling:
    max_tokens = opt_int(body, "max_completion_tokens", 1)
    legacy_max = opt_int(body, "max_tokens", 1)
    if _SAMPLING_REST.isdisjoint(body):  # what the general path gives when they are absent
        if max_tokens is None and legacy_max is None:
            return _NO_SAMPLING
        return limit_only(max_tokens if max_tokens is not None else legacy_max)
    top_k = opt_int(body, "top_k", -1)
    return Sampling(
        max_tokens=max_tokens if max_tokens is not None else legacy_max,
        temperature=opt_number(body, "temperature", 0, 2),
        top_p=opt_number(body, "top_p", 0, 1),
        top_k=top_k if top_k is not None and top_k > 0 else None,  # vLLM: -1/0 = off
        stop=string_list(body.get("stop"), "stop"),
        seed=opt_int(body, "seed"),
        n=opt_int(body, "n", 1) or 1,
        # vLLM's extensions, honoured by local workers
        stop_token_ids=token_ids(body, "stop_token_ids"),
        ignore_eos=bool(opt_bool(body, "ignore_eos")),
    )


def token_ids(body: Mapping[str, Any], key: str) -> tuple[int, ...]:
    """An optional array of token ids (``stop_token_ids``)."""
    value = body.get(key)
    if value is None:
        return ()
    if type(value) is not list or not all(type(v) is int and v >= 0 for v in value):
        raise bad_type(key, "an array of token ids (non-negative integers)")
    return tuple(value)


# a body of only these (most requests) has no optional field to validate
_SIMPLE_FIELDS = frozenset(("model", "messages", "max_tokens", "max_completion_tokens", "stream"))


def decode(body: object, headers: Mapping[str, str] | None = None) -> ChatRequest:
    """Validate and translate a Chat Completions body (``headers``: lower-case names)."""
    if type(body) is not dict:
        raise BadRequest("The request body must be a JSON object.")
    model = req_str(body, "model", "model")
    if not model:
        raise bad_value("model", "must not be empty")
    messages = _messages(body.get("messages"))
    if body.keys() <= _SIMPLE_FIELDS:  # what the general path gives for the absent fields
        return ChatRequest(model=model, messages=messages, dialect="openai_chat",
                           stream=bool(opt_bool(body, "stream")), sampling=_sampling(body),
                           session_id=first_header(headers, _SESSION_HEADERS), raw=body)
    logprobs = bool(opt_bool(body, "logprobs"))
    top_logprobs = opt_int(body, "top_logprobs", 0, 20)
    if top_logprobs is not None and not logprobs:
        raise bad_value("top_logprobs", "'logprobs' must be true to request top_logprobs")
    stream_options = opt_dict(body, "stream_options", "stream_options")
    if stream_options is not None:  # validated here, read by the encoder
        opt_bool(stream_options, "include_usage", "stream_options.include_usage")
    return ChatRequest(
        model=model,
        messages=messages,
        dialect="openai_chat",
        stream=bool(opt_bool(body, "stream")),
        tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice"), opt_bool(body, "parallel_tool_calls")),
        sampling=_sampling(body),
        response_format=_response_format(body.get("response_format")),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        reasoning_effort=opt_str(body, "reasoning_effort", "reasoning_effort"),
        user=opt_str(body, "user", "user"),
        session_id=first_header(headers, _SESSION_HEADERS),
        prompt_cache_key=opt_str(body, "prompt_cache_key", "prompt_cache_key"),
        metadata=opt_dict(body, "metadata", "metadata"),
        raw=body,
    )
