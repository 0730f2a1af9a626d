"""Decode a Gemini ``generateContent`` / ``countTokens`` body into a :class:`ChatRequest`.

Pure and sans-IO. The model comes from the path (``models/{model}:method``),
not the body. Every rejection is a :class:`BadRequest` whose ``param`` is the
path of the offending field as the client spelled it
(``contents[0].parts[1].inlineData.mimeType``). Unknown fields are ignored;
they stay in ``ChatRequest.raw``, the body object itself.

Field names: Google's JSON parser takes a field's ``lowerCamel`` name and its
proto ``snake_case`` name alike, and the google-genai SDK sends both (its
nested objects go as ``parameters_json_schema``, ``thinking_budget``). Every
structural object is read through :func:`camel`, which renames ``snake_case``
keys (never those of free-form values: arguments, responses, schemas'
property names).

Mapping choices:

* ``role: "model"`` is ``assistant``; ``user``, a missing role and the old
  ``function`` role are ``user``. ``systemInstruction`` (a Content, or a bare
  string) is one leading ``system`` message.
* A part with ``thought: true`` is a :class:`ReasoningPart` whose signature
  is the part's ``thoughtSignature``, untouched; a signature on any other part
  (Gemini puts them on function calls) is a ``ReasoningPart`` holding only the
  signature, just before that part, so it too comes back byte for byte. A
  signature in base64url (how the google-genai SDK sends back the bytes it
  decoded) is put back in the standard alphabet (:func:`_signature`); Google's
  dummies (Gemini CLI's ``skip_thought_signature_validator``) are dropped.
* ``functionCall.args`` becomes compact JSON text. Gemini ids are optional: a
  call without one gets ``call_{content}_{part}`` (stable across turns), and a
  ``functionResponse`` without one answers the earliest unanswered call of
  that name. A response whose only field is ``output`` or ``result`` holding
  a string is that string; otherwise its JSON. An ``error`` field marks it as
  an error.
* ``parameters`` and ``responseSchema`` (Google's OpenAPI Schema subset, with
  upper-case types) become JSON Schema (:func:`json_schema`);
  ``parametersJsonSchema`` and ``responseJsonSchema`` are JSON Schema already.
* ``toolConfig.functionCallingConfig``: ``AUTO`` is auto, ``NONE`` none,
  ``ANY`` required (named when exactly one of ``allowedFunctionNames``);
  ``allowedFunctionNames`` narrows the tools sent on.
* ``thinkingConfig.thinkingBudget`` > 0 is ``thinking_budget`` (0 turns
  thinking off, -1 is "dynamic": effort ``medium``); ``thinkingLevel`` is
  ``reasoning_effort``.
* What no worker can honour is refused, naming the field: ``candidateCount``
  above 1, non-image ``inlineData``/``fileData``, built-in tools
  (``googleSearch``, ``codeExecution``, ...), ``cachedContent``.
"""

from __future__ import annotations

from typing import Any

import orjson

from pool.errors import BadRequest
from pool.model import (
    ChatRequest, ImagePart, Message, Part, ReasoningPart, ResponseFormat, Sampling, TextPart,
    Tool, ToolCallPart, ToolChoice, ToolResultPart,
)

from .gemini_schema import camel, json_schema
from .validate import Validators

__all__ = ["decode", "decode_count_tokens", "camel"]

_ROLES = {"user": "user", "model": "assistant", "function": "user", "tool": "user"}
_MODES = {"AUTO": "auto", "ANY": "required", "NONE": "none", "VALIDATED": "auto"}
_LEVELS = {"MINIMAL": "minimal", "LOW": "low", "MEDIUM": "medium", "HIGH": "high"}


class _Wording(Validators):
    """Google's wording: the field named as the client spelled it, dotted."""

    __slots__ = ()

    def missing(self, param: str) -> BadRequest:
        return BadRequest(f"Missing required field '{param}'.", param=param)

    def bad_type(self, param: str, expected: str) -> BadRequest:
        return BadRequest(f"Invalid value at '{param}': expected {expected}.", param=param)

    def bad_value(self, param: str, why: str) -> BadRequest:
        return BadRequest(f"Invalid value at '{param}': {why}.", param=param)

    def where(self, param: str | None, key: str) -> str:
        return f"{param}.{key}" if param else key


_V = _Wording()
_at = _V.where


# --- parts ------------------------------------------------------------------------

def _media(value: dict[str, Any], loc: str, *, inline: bool) -> ImagePart:
    value = camel(value)
    mime = _V.req_str(value, "mimeType", loc)
    if not mime.startswith("image/"):
        raise _V.bad_value(_at(loc, "mimeType"),
                           f"only images are supported, not {mime!r}")
    if inline:
        return ImagePart(data=_V.req_str(value, "data", loc), media_type=mime)
    uri = _V.req_str(value, "fileUri", loc)
    if not uri.startswith(("https://", "http://")):
        raise _V.bad_value(_at(loc, "fileUri"), "only http(s) URLs are supported")
    return ImagePart(url=uri, media_type=mime)


class _Calls:
    """The function calls of the conversation so far that no response answered
    yet: a ``functionResponse`` without an id answers the earliest of its name."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list[tuple[str, str]] = []  # (id, name)

    def call(self, value: dict[str, Any], loc: str, default_id: str) -> ToolCallPart:
        value = camel(value)
        name = _V.req_str(value, "name", loc)
        call_id = _V.opt_str(value, "id", loc) or default_id
        args = _V.opt_dict(value, "args", loc)
        self.pending.append((call_id, name))
        return ToolCallPart(call_id, name, orjson.dumps(args or {}).decode())

    def response(self, value: dict[str, Any], loc: str) -> ToolResultPart:
        value = camel(value)
        name = _V.req_str(value, "name", loc)
        call_id = _V.opt_str(value, "id", loc)
        for k, (pending_id, pending_name) in enumerate(self.pending):
            if pending_id == call_id or (call_id is None and pending_name == name):
                call_id = pending_id
                del self.pending[k]
                break
        else:
            if call_id is None:
                raise _V.bad_value(_at(loc, "name"),
                                   f"no earlier functionCall named {name!r} is unanswered")
        response = _V.opt_dict(value, "response", loc) or {}
        return ToolResultPart(call_id, (TextPart(_result_text(response)),),
                              is_error="error" in response)


def _result_text(response: dict[str, Any]) -> str:
    if len(response) == 1:
        only = next(iter(response.values()))
        if type(only) is str and next(iter(response)) in ("output", "result", "error"):
            return only
    return orjson.dumps(response).decode()


#: Google's "skip the check" dummies: no signature to carry
_DUMMIES = frozenset({"skip_thought_signature_validator", "context_engineering_is_the_way_to_go"})


def _signature(value: str | None) -> str | None:
    """A thought signature as the upstreams wrote it. The google-genai SDK
    holds it as bytes and sends it back in base64url: the standard alphabet
    (what every signature we hand out uses) is restored, same bytes."""
    if value is None or value in _DUMMIES:
        return None
    if ("-" in value or "_" in value) and not ("+" in value or "/" in value):
        return value.replace("-", "+").replace("_", "/")
    return value


def _parts(parts: Any, loc: str, calls: _Calls, index: int) -> tuple[Part, ...]:
    if type(parts) is not list:
        raise _V.missing(loc) if parts is None else _V.bad_type(loc, "an array of parts")
    out: list[Part] = []
    for j, part in enumerate(parts):
        ploc = f"{loc}[{j}]"
        if type(part) is not dict:
            raise _V.bad_type(ploc, "an object")
        part = camel(part)
        signature = _signature(_V.opt_str(part, "thoughtSignature", ploc))
        text = part.get("text")
        if part.get("thought") is True:
            if text is not None and type(text) is not str:
                raise _V.bad_type(_at(ploc, "text"), "a string")
            out.append(ReasoningPart(text or "", signature=signature))
            continue
        if signature is not None:
            out.append(ReasoningPart(signature=signature))
        if text is not None:
            if type(text) is not str:
                raise _V.bad_type(_at(ploc, "text"), "a string")
            out.append(TextPart(text))
        elif "inlineData" in part:
            out.append(_media(_V.req_dict(part, "inlineData", ploc), _at(ploc, "inlineData"),
                              inline=True))
        elif "fileData" in part:
            out.append(_media(_V.req_dict(part, "fileData", ploc), _at(ploc, "fileData"),
                              inline=False))
        elif "functionCall" in part:
            out.append(calls.call(_V.req_dict(part, "functionCall", ploc),
                                  _at(ploc, "functionCall"), f"call_{index}_{j}"))
        elif "functionResponse" in part:
            out.append(calls.response(_V.req_dict(part, "functionResponse", ploc),
                                      _at(ploc, "functionResponse")))
        elif signature is None:
            kinds = ", ".join(sorted(part)) or "nothing"
            raise _V.bad_value(ploc, f"a part needs text, inlineData, fileData, functionCall "
                                     f"or functionResponse (it has {kinds})")
    return tuple(out)


def _contents(value: Any) -> list[Message]:
    if type(value) is not list:
        raise _V.missing("contents") if value is None else _V.bad_type("contents", "an array")
    if not value:
        raise _V.bad_value("contents", "at least one content is required")
    calls = _Calls()
    out: list[Message] = []
    for i, content in enumerate(value):
        loc = f"contents[{i}]"
        if type(content) is not dict:
            raise _V.bad_type(loc, "an object")
        content = camel(content)
        role_name = _V.opt_str(content, "role", loc) or "user"
        role = _ROLES.get(role_name)
        if role is None:
            raise _V.bad_value(_at(loc, "role"), "expected 'user' or 'model'")
        parts = _parts(content.get("parts"), _at(loc, "parts"), calls, i)
        out.append(Message(role, parts))  # type: ignore[arg-type]
    return out


def _system(value: Any) -> Message | None:
    if value is None:
        return None
    if type(value) is str:
        return Message("system", (TextPart(value),)) if value else None
    if type(value) is not dict:
        raise _V.bad_type("systemInstruction", "a Content object")
    parts = _parts(camel(value).get("parts"), "systemInstruction.parts", _Calls(), -1)
    texts = tuple(p for p in parts if type(p) is TextPart)
    if len(texts) != len(parts):
        raise _V.bad_value("systemInstruction.parts", "only text parts are supported")
    return Message("system", texts) if texts else None


# --- tools ------------------------------------------------------------------------

def _tools(value: Any) -> list[Tool]:
    if value is None:
        return []
    if type(value) is not list:
        raise _V.bad_type("tools", "an array")
    out: list[Tool] = []
    for k, tool in enumerate(value):
        loc = f"tools[{k}]"
        if type(tool) is not dict:
            raise _V.bad_type(loc, "an object")
        tool = camel(tool)
        for key in tool:
            if key != "functionDeclarations":
                raise _V.bad_value(_at(loc, key), "built-in tools are not supported by this "
                                                  "gateway; declare functions instead")
        declarations = _V.opt_list(tool, "functionDeclarations", loc) or []
        for d, declaration in enumerate(declarations):
            out.append(_declaration(declaration, f"{loc}.functionDeclarations[{d}]"))
    return out


def _declaration(value: Any, loc: str) -> Tool:
    if type(value) is not dict:
        raise _V.bad_type(loc, "an object")
    value = camel(value)
    name = _V.req_str(value, "name", loc)
    description = _V.opt_str(value, "description", loc)
    schema = _V.opt_dict(value, "parametersJsonSchema", loc)
    if schema is None:
        parameters = _V.opt_dict(value, "parameters", loc)
        schema = json_schema(parameters, _at(loc, "parameters")) if parameters else None
    return Tool(name, description, schema)


def _tool_choice(value: Any, tools: list[Tool]) -> tuple[ToolChoice | None, list[Tool]]:
    if value is None:
        return None, tools
    if type(value) is not dict:
        raise _V.bad_type("toolConfig", "an object")
    config = _V.opt_dict(camel(value), "functionCallingConfig", "toolConfig")
    if config is None:
        return None, tools
    config = camel(config)
    loc = "toolConfig.functionCallingConfig"
    mode_name = _V.opt_str(config, "mode", loc) or "AUTO"
    mode = _MODES.get(mode_name.upper()) if mode_name != "MODE_UNSPECIFIED" else "auto"
    if mode is None:
        raise _V.bad_value(_at(loc, "mode"), "expected AUTO, ANY, NONE or VALIDATED")
    allowed = _V.string_list(config.get("allowedFunctionNames"),
                             _at(loc, "allowedFunctionNames"), lone=False)
    if allowed:
        known = {t.name for t in tools}
        for k, name in enumerate(allowed):
            if name not in known:
                raise _V.bad_value(f"{loc}.allowedFunctionNames[{k}]",
                                   f"no function named {name!r} is declared")
        tools = [t for t in tools if t.name in allowed]
        if mode == "required" and len(allowed) == 1:
            return ToolChoice("named", allowed[0]), tools
    return ToolChoice(mode), tools  # type: ignore[arg-type]


# --- generationConfig -------------------------------------------------------------

def _generation(body: dict[str, Any]) -> tuple[Sampling, ResponseFormat | None, str | None,
                                              int | None]:
    config = _V.opt_dict(body, "generationConfig")
    if config is None:
        return Sampling(), None, None, None
    config = camel(config)
    loc = "generationConfig"
    count = _V.opt_int(config, "candidateCount", 1, param=loc)
    if count is not None and count > 1:
        raise _V.bad_value(_at(loc, "candidateCount"),
                           "only one candidate is supported; set candidateCount to 1")
    sampling = Sampling(
        max_tokens=_V.opt_int(config, "maxOutputTokens", 1, param=loc),
        temperature=_V.opt_number(config, "temperature", 0.0, 2.0, loc),
        top_p=_V.opt_number(config, "topP", 0.0, 1.0, loc),
        top_k=_V.opt_int(config, "topK", 1, param=loc),
        stop=_V.string_list(config.get("stopSequences"), _at(loc, "stopSequences"), lone=False),
        seed=_V.opt_int(config, "seed", param=loc),
    )
    effort, budget = _thinking(_V.opt_dict(config, "thinkingConfig", loc))
    return sampling, _response_format(config), effort, budget


def _response_format(config: dict[str, Any]) -> ResponseFormat | None:
    loc = "generationConfig"
    mime = _V.opt_str(config, "responseMimeType", loc)
    schema = _V.opt_dict(config, "responseJsonSchema", loc)
    if schema is None:
        google = _V.opt_dict(config, "responseSchema", loc)
        schema = json_schema(google, _at(loc, "responseSchema")) if google else None
    if schema is not None:
        if mime not in (None, "application/json"):
            raise _V.bad_value(_at(loc, "responseMimeType"),
                               "a response schema needs responseMimeType 'application/json'")
        return ResponseFormat("json_schema", schema=schema, name="response")
    if mime in (None, "text/plain"):
        return None
    if mime == "application/json":
        return ResponseFormat("json_object")
    raise _V.bad_value(_at(loc, "responseMimeType"),
                       "expected 'text/plain' or 'application/json'")


def _thinking(config: dict[str, Any] | None) -> tuple[str | None, int | None]:
    if config is None:
        return None, None
    config = camel(config)
    loc = "generationConfig.thinkingConfig"
    level = _V.opt_str(config, "thinkingLevel", loc)
    effort = None
    if level is not None:
        effort = _LEVELS.get(level.upper())
        if effort is None and level.upper() != "THINKING_LEVEL_UNSPECIFIED":
            raise _V.bad_value(_at(loc, "thinkingLevel"), "expected MINIMAL, LOW, MEDIUM or HIGH")
    budget = _V.opt_int(config, "thinkingBudget", -1, param=loc)
    if budget == -1:
        return effort or "medium", None
    return effort, budget or None


# --- entry points -------------------------------------------------------------------

def decode(body: object, model: str, *, stream: bool = False) -> ChatRequest:
    """A ``generateContent`` body (parsed JSON) for ``model`` (from the path)."""
    if type(body) is not dict:
        raise BadRequest("The request body must be a JSON object.")
    raw, body = body, camel(body)
    if body.get("cachedContent") is not None:  # held by Google: no worker here has it
        raise _V.bad_value("cachedContent", "cached contents are not supported by this "
                                            "gateway; send the contents themselves")
    messages = _contents(body.get("contents"))
    system = _system(body.get("systemInstruction"))
    if system is not None:
        messages.insert(0, system)
    tools = _tools(body.get("tools"))
    choice, tools = _tool_choice(body.get("toolConfig"), tools)
    sampling, response_format, effort, budget = _generation(body)
    return ChatRequest(
        model=model, messages=tuple(messages), dialect="gemini", stream=stream,
        tools=tuple(tools), tool_choice=choice, sampling=sampling,
        response_format=response_format, reasoning_effort=effort, thinking_budget=budget,
        raw=raw,
    )


def decode_count_tokens(body: object, model: str) -> ChatRequest:
    """A ``countTokens`` body: ``contents``, or a whole ``generateContentRequest``."""
    if type(body) is not dict:
        raise BadRequest("The request body must be a JSON object.")
    inner = _V.opt_dict(camel(body), "generateContentRequest")
    if inner is not None:
        try:
            return decode(inner, model)
        except BadRequest as exc:  # name the field where the client put it
            param = f"generateContentRequest.{exc.param}" if exc.param else None
            raise BadRequest(exc.message.replace(f"'{exc.param}'", f"'{param}'"),
                             param=param) from None
    return decode(body, model)
