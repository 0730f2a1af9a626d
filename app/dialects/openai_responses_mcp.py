"""The OpenAI Responses ``mcp_call`` item: how a tool the worker already ran
(an agent-mode CLI's :class:`~pool.model.ExecutedTool`) shows to a Responses
client, and how it comes back as history.

The item is ``{type: "mcp_call", id, server_label, name, arguments, output,
error, status}``; a failed tool has ``status: "failed"`` and ``error:
{type: "mcp_tool_execution_error", content: [{type: "text", text}]}`` (the
openai SDK's ``McpToolCallError``), its output kept in ``output`` too. Streamed:
``response.output_item.added`` (in progress, no arguments yet),
``response.mcp_call.in_progress``, ``response.mcp_call_arguments.delta`` and
``.done``, ``response.mcp_call.completed`` or ``.failed``, then
``response.output_item.done`` with the whole item. Pure and sans-IO.
"""

from __future__ import annotations

from typing import Any

from pool.model import ExecutedTool, ExecutedToolPart

from .validate import opt_str, req_str

__all__ = ["mcp_call_item", "mcp_call_stream", "mcp_call_part"]

_NO_SERVER = "worker"  # the label when the worker did not name who ran the tool


def mcp_call_item(item_id: str, part: ExecutedTool | ExecutedToolPart,
                  done: bool = True) -> dict[str, Any]:
    """The output item; ``done=False`` is its in-progress form (``output_item.added``)."""
    item: dict[str, Any] = {"type": "mcp_call", "id": item_id,
                            "server_label": part.server or _NO_SERVER, "name": part.name,
                            "arguments": part.arguments if done else "",
                            "output": part.output if done else None, "error": None,
                            "status": "in_progress"}
    if done:
        item["status"] = "failed" if part.is_error else "completed"
        if part.is_error:
            item["error"] = {"type": "mcp_tool_execution_error",
                             "content": [{"type": "text", "text": part.output}]}
    return item


def mcp_call_stream(item_id: str, index: int, event: ExecutedTool) -> list[dict[str, Any]]:
    """The stream events of one executed tool, in order (without sequence numbers)."""
    where = {"item_id": item_id, "output_index": index}
    outcome = "response.mcp_call.failed" if event.is_error else "response.mcp_call.completed"
    return [
        {"type": "response.output_item.added", "output_index": index,
         "item": mcp_call_item(item_id, event, done=False)},
        {"type": "response.mcp_call.in_progress", **where},
        {"type": "response.mcp_call_arguments.delta", **where, "delta": event.arguments},
        {"type": "response.mcp_call_arguments.done", **where, "arguments": event.arguments},
        {"type": outcome, **where},
        {"type": "response.output_item.done", "output_index": index,
         "item": mcp_call_item(item_id, event)},
    ]


def mcp_call_part(item: dict[str, Any], param: str) -> ExecutedToolPart:
    """An ``mcp_call`` input item (history) as the executed tool it records."""
    output = opt_str(item, "output", param + ".output") or ""
    error = item.get("error")
    if not output and error is not None:  # the failure's text is the output there is
        output = error if type(error) is str else _error_text(error)
    return ExecutedToolPart(req_str(item, "id", param + ".id"),
                            req_str(item, "name", param + ".name"),
                            opt_str(item, "arguments", param + ".arguments") or "",
                            output, error is not None,
                            opt_str(item, "server_label", param + ".server_label"))


def _error_text(error: object) -> str:
    content = error.get("content") if type(error) is dict else None
    if type(content) is not list:
        return ""
    return "".join(c["text"] for c in content if type(c) is dict and type(c.get("text")) is str)
