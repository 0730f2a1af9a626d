"""The Gemini API upstream (``models/{model}:generateContent``, sans-IO): the
request body, and the answer (SSE ``data:`` payloads or one body) as events.

A client that spoke Gemini has its own body sent on (the fields of
:data:`GEMINI_FIELDS` and the worker's ``pass_fields``), so everything the
canonical form does not model reaches the upstream; the answer is translated
back like any other (thought signatures included). Other dialects are
translated:

* ``system``/``developer`` messages become ``systemInstruction``; tool results
  ``functionResponse`` parts (``{"output": text}``, ``{"error": text}`` when
  failed) named after their call; images ``inlineData`` or ``fileData``;
* reasoning of other vendors is left out (Gemini takes only its own
  signatures); tools are ``functionDeclarations`` with ``parametersJsonSchema``;
* ``tool_choice`` is ``functionCallingConfig`` (required: ``ANY``; named:
  ``ANY`` with that one name); a JSON schema answer format is
  ``responseMimeType: application/json`` with ``responseJsonSchema``; a
  thinking budget or effort is a ``thinkingConfig`` with ``includeThoughts``.

A Gemini stream has no end marker: the chunk holding ``finishReason`` is the
last (its ``usageMetadata`` with it). Usage: ``input_tokens`` is
``promptTokenCount``; ``output_tokens`` counts thoughts too
(``candidatesTokenCount + thoughtsTokenCount``), as the canonical form does.
"""

from __future__ import annotations

from typing import Any

import orjson

from pool.errors import UpstreamUnavailable
from pool.model import (
    ChatRequest, Event, ExecutedToolPart, Finish, ImagePart, ReasoningDelta, ReasoningEnd,
    Start, TextDelta, TextPart, ToolCallDelta, ToolCallEnd, ToolCallPart, ToolCallStart,
    ToolResultPart, Usage, executed_text,
)

from .errors import error_from_object, loads_upstream
from .policy import PassPolicy

__all__ = ["build_body", "StreamParser", "body_events", "finish_of", "usage_of", "GEMINI_FIELDS"]

#: Gemini request fields a same-dialect pass-through carries by default
GEMINI_FIELDS = frozenset({
    "contents", "systemInstruction", "system_instruction", "tools", "toolConfig", "tool_config",
    "generationConfig", "generation_config", "safetySettings", "safety_settings",
})
_DEFAULT_POLICY = PassPolicy()
_NONE: tuple[Event, ...] = ()
_MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY", "named": "ANY"}
_FINISH = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter",
           "RECITATION": "content_filter", "BLOCKLIST": "content_filter",
           "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
           "IMAGE_SAFETY": "content_filter"}


def build_body(request: ChatRequest, policy: PassPolicy = _DEFAULT_POLICY) -> dict[str, Any]:
    """The upstream body: the client's own when it spoke Gemini, else translated."""
    if request.dialect == "gemini" and request.raw:
        return policy.body(request.raw, GEMINI_FIELDS)  # a copy: raw is never touched
    return _translate(request)


def _image(part: ImagePart) -> dict[str, Any]:
    if part.data is not None:
        return {"inlineData": {"mimeType": part.media_type or "image/png", "data": part.data}}
    return {"fileData": {"mimeType": part.media_type or "image/*", "fileUri": part.url}}


def _parts(message: Any, names: dict[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in message.parts:
        t = type(part)
        if t is TextPart:
            if part.text:
                out.append({"text": part.text})
        elif t is ImagePart:
            out.append(_image(part))
        elif t is ToolCallPart:
            names[part.id] = part.name
            try:
                args = orjson.loads(part.arguments) if part.arguments else {}
            except orjson.JSONDecodeError:
                args = {}
            out.append({"functionCall": {"id": part.id, "name": part.name,
                                         "args": args if type(args) is dict else {}}})
        elif t is ToolResultPart:
            text = "".join(p.text for p in part.content if type(p) is TextPart)
            out.append({"functionResponse": {
                "id": part.call_id, "name": names.get(part.call_id, "tool"),
                "response": {"error" if part.is_error else "output": text}}})
            out.extend(_image(p) for p in part.content if type(p) is ImagePart)
        elif t is ExecutedToolPart:
            out.append({"text": executed_text(part)})
    return out


def _translate(req: ChatRequest) -> dict[str, Any]:
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call id -> function name, for the responses
    for m in req.messages:
        if m.role in ("system", "developer"):
            system.extend({"text": p.text} for p in m.parts if type(p) is TextPart and p.text)
            continue
        role = "model" if m.role == "assistant" else "user"
        parts = _parts(m, names)
        if not parts:
            continue
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    body: dict[str, Any] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": system}
    if req.tools:
        body["tools"] = [{"functionDeclarations": [_declaration(t) for t in req.tools]}]
    if req.tool_choice is not None:
        config: dict[str, Any] = {"mode": _MODES[req.tool_choice.mode]}
        if req.tool_choice.mode == "named" and req.tool_choice.name:
            config["allowedFunctionNames"] = [req.tool_choice.name]
        body["toolConfig"] = {"functionCallingConfig": config}
    generation = _generation(req)
    if generation:
        body["generationConfig"] = generation
    return body


def _declaration(tool: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name}
    if tool.description:
        out["description"] = tool.description
    if tool.parameters:
        out["parametersJsonSchema"] = tool.parameters
    return out


def _generation(req: ChatRequest) -> dict[str, Any]:
    s = req.sampling
    out: dict[str, Any] = {}
    for key, value in (("maxOutputTokens", s.max_tokens), ("temperature", s.temperature),
                       ("topP", s.top_p), ("topK", s.top_k), ("seed", s.seed)):
        if value is not None:
            out[key] = value
    if s.stop:
        out["stopSequences"] = list(s.stop)
    rf = req.response_format
    if rf is not None and rf.type != "text":
        out["responseMimeType"] = "application/json"
        if rf.type == "json_schema" and rf.schema is not None:
            out["responseJsonSchema"] = rf.schema
    if req.thinking_budget:
        out["thinkingConfig"] = {"thinkingBudget": req.thinking_budget, "includeThoughts": True}
    elif req.reasoning_effort in ("minimal", "low", "medium", "high"):
        out["thinkingConfig"] = {"thinkingLevel": req.reasoning_effort.upper(),
                                 "includeThoughts": True}
    return out


# --- the answer -------------------------------------------------------------------------

class StreamParser:
    """Feed each SSE ``data`` payload (one ``GenerateContentResponse``);
    ``done`` turns true with the chunk that holds ``finishReason``."""

    __slots__ = ("done", "_started", "_calls")

    def __init__(self, custom_tools: frozenset[str] = frozenset()) -> None:
        self.done = False
        self._started = False
        self._calls = 0  # function calls so far: their canonical indexes

    def feed(self, data: str) -> list[Event]:
        if not data or self.done:
            return []
        return self.events(loads_upstream(data))

    def events(self, obj: Any) -> list[Event]:
        if not isinstance(obj, dict):
            raise UpstreamUnavailable("upstream sent an unexpected response")
        if "error" in obj and "candidates" not in obj:
            raise error_from_object(obj)
        out: list[Event] = []
        if not self._started:
            self._started = True
            out.append(Start(obj.get("responseId"), obj.get("modelVersion")))
        candidates = obj.get("candidates") or [{}]
        candidate = candidates[0] if isinstance(candidates[0], dict) else {}
        content = candidate.get("content") or {}
        for part in content.get("parts") or ():
            if isinstance(part, dict):
                self._part(part, out)
        usage = obj.get("usageMetadata")
        reason = candidate.get("finishReason")
        if reason:
            self.done = True
            out.append(Finish(finish_of(reason, self._calls > 0)))  # type: ignore[arg-type]
        if isinstance(usage, dict) and (reason or "promptTokenCount" in usage):
            out.append(usage_of(usage))
        return out

    def _part(self, part: dict[str, Any], out: list[Event]) -> None:
        signature = part.get("thoughtSignature")
        text = part.get("text")
        if part.get("thought") is True:
            if text:
                out.append(ReasoningDelta(text))
            if signature or text:
                out.append(ReasoningEnd(signature=signature))
            return
        if signature:  # a signature on another part: its own (empty) reasoning, before it
            out.append(ReasoningEnd(signature=signature))
        call = part.get("functionCall")
        if isinstance(call, dict):
            index = self._calls
            self._calls += 1
            args = call.get("args")
            out += [ToolCallStart(index, call.get("id") or f"call_{index}", call.get("name", "")),
                    ToolCallDelta(index, orjson.dumps(args if isinstance(args, dict) else {})
                                  .decode()),
                    ToolCallEnd(index)]
        elif text:
            out.append(TextDelta(text))


def finish_of(reason: str, called: bool) -> str:
    """The canonical finish of a ``finishReason`` (``tool_calls`` for a stop
    after function calls)."""
    finish = _FINISH.get(reason, "stop")
    return "tool_calls" if finish == "stop" and called else finish


def usage_of(usage: dict[str, Any]) -> Usage:
    thoughts = usage.get("thoughtsTokenCount")
    output = usage.get("candidatesTokenCount")
    if output is not None or thoughts is not None:
        output = (output or 0) + (thoughts or 0)
    return Usage(input_tokens=usage.get("promptTokenCount"), output_tokens=output,
                 cached_tokens=usage.get("cachedContentTokenCount"), reasoning_tokens=thoughts)


def body_events(body: Any, custom_tools: frozenset[str] = frozenset()) -> list[Event]:
    """A whole ``generateContent`` answer as the events a stream would carry."""
    parser = StreamParser()
    out = parser.events(body)
    if not parser.done:  # a body always ends the answer
        out.append(Finish("tool_calls" if parser._calls else "stop"))
    return out
