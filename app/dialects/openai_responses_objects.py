"""OpenAI Responses ``response`` objects from canonical answers: the whole
object (:func:`encode_completion`), its shell, items, usage and error parts,
which the stream encoder (:mod:`app.dialects.openai_responses_encode`) sends
piece by piece and ends with. The mapping is described there."""

from __future__ import annotations

from typing import Any

from pool.errors import GatewayError
from pool.model import (
    ChatRequest, Completion, ExecutedToolPart, Finish, ReasoningPart, TextPart, ToolCallPart, Usage,
)

from .openai_responses_carry import carried
from .openai_responses_decode import namespace_map
from .openai_responses_mcp import mcp_call_item

__all__ = ["encode_completion", "usage_json", "error_json", "response_shell", "finished",
           "message_item", "reasoning_item", "ToolNames", "id_base", "response_object"]

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_ERROR_CODE = {"rate_limit": "rate_limit_exceeded", "overloaded": "rate_limit_exceeded",
               "invalid_request": "invalid_prompt"}


def usage_json(usage: Usage) -> dict[str, Any]:
    inp = usage.input_tokens or 0
    out = usage.output_tokens or 0
    # cache_write_tokens: the openai SDK's strict validation requires it
    details = {"cached_tokens": usage.cached_tokens or 0,
               "cache_write_tokens": usage.cache_creation_tokens or 0}
    return {"input_tokens": inp, "input_tokens_details": details, "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
            "total_tokens": inp + out}


def error_json(exc: GatewayError) -> dict[str, Any]:
    return {"code": _ERROR_CODE.get(exc.kind, "server_error"), "message": exc.message}


def response_shell(request: ChatRequest, response_id: str, created: int,
                   model: str) -> dict[str, Any]:
    """The response object minus what the answer decides, echoing the request."""
    raw = request.raw
    parallel = raw.get("parallel_tool_calls")
    store = raw.get("store")
    return {
        "id": response_id, "object": "response", "created_at": created,
        "status": "in_progress", "error": None, "incomplete_details": None,
        "instructions": raw.get("instructions"), "max_output_tokens": raw.get("max_output_tokens"),
        "model": model, "output": [], "output_text": "",
        "parallel_tool_calls": parallel if type(parallel) is bool else True,
        "previous_response_id": raw.get("previous_response_id"),
        "reasoning": raw.get("reasoning") or {"effort": None, "summary": None},
        "store": store if type(store) is bool else True,
        "temperature": raw.get("temperature"),
        "text": raw.get("text") or {"format": {"type": "text"}},
        "tool_choice": raw.get("tool_choice") or "auto", "tools": raw.get("tools") or [],
        "top_p": raw.get("top_p"), "truncation": raw.get("truncation") or "disabled",
        "usage": None, "metadata": raw.get("metadata") or {}, "user": raw.get("user"),
    }


def finished(shell: dict[str, Any], output: list[dict[str, Any]], text: str,
              finish: Finish | None, usage: Usage, error: GatewayError | None) -> dict[str, Any]:
    response = dict(shell)
    response["output"] = output
    response["output_text"] = text
    response["usage"] = usage_json(usage)
    if error is not None:
        response["status"] = "failed"
        response["error"] = error_json(error)
    elif finish is not None and finish.reason in _INCOMPLETE:
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": _INCOMPLETE[finish.reason]}
    else:
        response["status"] = "completed"
    return response


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = ([] if status == "in_progress"
               else [{"type": "output_text", "text": text, "annotations": []}])
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}


def reasoning_item(item_id: str, text: str, encrypted: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "id": item_id,
                            "summary": [{"type": "summary_text", "text": text}] if text else []}
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


class ToolNames:
    """How a canonical tool call shows on the wire: kind, name and namespace."""

    __slots__ = ("custom", "namespaces")

    def __init__(self, request: ChatRequest) -> None:
        self.custom = frozenset(t.name for t in request.tools if t.kind == "custom")
        self.namespaces = namespace_map(request.raw.get("tools"))

    def item(self, item_id: str, call_id: str, name: str, kind: str, arguments: str,
             status: str = "completed") -> dict[str, Any]:
        custom = kind == "custom" or name in self.custom
        namespace = None
        if self.namespaces:
            found = self.namespaces.get(name)
            if found is not None:
                namespace, name = found
        if custom:
            item = {"type": "custom_tool_call", "id": item_id, "call_id": call_id, "name": name,
                    "input": arguments}
        else:
            item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
                    "arguments": arguments, "status": status}
        if namespace is not None:
            item["namespace"] = namespace
        return item

    def is_custom(self, name: str, kind: str) -> bool:
        return kind == "custom" or name in self.custom


def id_base(response_id: str) -> str:
    return response_id[5:] if response_id.startswith("resp_") else response_id


def encode_completion(completion: Completion, request: ChatRequest, *, response_id: str,
                      created: int, model: str, error: GatewayError | None = None
                      ) -> dict[str, Any]:
    """The Response object; ``error`` makes it a ``failed`` one (what a stream that
    failed stores)."""
    return response_object(completion, ToolNames(request), id_base(response_id),
                     response_shell(request, response_id, created, model), error)


def response_object(completion: Completion, names: ToolNames, base: str, shell: dict[str, Any],
              error: GatewayError | None) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    texts: list[str] = []
    for part in completion.parts:
        t = type(part)
        if t is TextPart:
            if part.text:
                output.append(message_item(f"msg_{base}_{len(output)}", part.text))
                texts.append(part.text)
        elif t is ToolCallPart:
            prefix = "ctc" if names.is_custom(part.name, part.kind) else "fc"
            output.append(names.item(f"{prefix}_{base}_{len(output)}", part.id, part.name,
                                     part.kind, part.arguments))
        elif t is ExecutedToolPart:
            output.append(mcp_call_item(f"mcp_{base}_{len(output)}", part))
        elif t is ReasoningPart:
            encrypted = carried(part.signature, part.redacted_data, part.encrypted_content)
            if part.text or encrypted is not None:
                output.append(reasoning_item(f"rs_{base}_{len(output)}", part.text, encrypted))
    return finished(shell, output, "".join(texts), completion.finish, completion.usage, error)
