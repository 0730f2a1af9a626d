"""The API client's tools in Qwen Code: an in-band SDK MCP server.

Qwen Code 0.15.10 takes ``sdkMcpServers`` in the ``initialize`` control
request and then speaks MCP to that server through ``mcp_message`` control
requests on the same stdin/stdout (verified on the real binary): ``initialize``,
``notifications/initialized`` (which also waits for an answer), ``tools/list``
(twice), and ``tools/call`` when the model calls one. The model sees the
tools as ``mcp__gw__<name>``; the ``assistant`` line carrying the call (with
its id) comes before the ``tools/call``.

The gateway ends the client's answer at that ``assistant`` line and leaves the
``tools/call`` unanswered until the client's next request brings the result.
Qwen waits at most 30 s for an answer (``MCP_REQUEST_TIMEOUT`` in its source)
and then sends the same ``tools/call`` again (seen at 35 s); every copy gets
the result once it is known.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ..model import Tool
from .events import PendingToolCall, ToolAnswer

__all__ = ["SdkToolServer", "SERVER", "PREFIX"]

SERVER = "gw"
PREFIX = f"mcp__{SERVER}__"


class SdkToolServer:
    """Answers Qwen's MCP messages for the client's ``tools``; holds calls."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools = tuple(tools)
        self.listed = False          # Qwen has the tool list (the first turn may be sent)
        self._calls: list[PendingToolCall] = []     # the model's calls, in order
        self._answers: dict[str, ToolAnswer] = {}
        self._held: list[tuple[str, Any, str]] = []  # (control request id, MCP id, call id)

    @staticmethod
    def initialize_payload() -> dict[str, Any]:
        return {SERVER: {"name": SERVER}}

    def called(self, call: PendingToolCall) -> None:
        self._calls.append(call)

    def answer(self, answers: Sequence[ToolAnswer]) -> list[dict[str, Any]]:
        """Record the client's results; the control responses now due."""
        self._answers.update((a.call_id, a) for a in answers)
        due, self._held = self._held, []
        out = []
        for request_id, mcp_id, call_id in due:
            answer = self._answers.get(call_id)
            if answer is None:
                self._held.append((request_id, mcp_id, call_id))
            else:
                out.append(_response(request_id, mcp_id, _call_result(answer)))
        return out

    def message(self, request_id: str, message: Mapping[str, Any]) -> dict[str, Any] | None:
        """The control response to one ``mcp_message``, or None while a call is held."""
        method, mcp_id = message.get("method"), message.get("id")
        if method == "initialize":
            params = message.get("params") or {}
            return _response(request_id, mcp_id, {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}}, "serverInfo": {"name": SERVER, "version": "1"}})
        if method == "tools/list":
            self.listed = True
            return _response(request_id, mcp_id, {"tools": [
                {"name": t.name, "description": t.description or "",
                 "inputSchema": dict(t.parameters or {"type": "object", "properties": {}})}
                for t in self.tools]})
        if method == "tools/call":
            return self._call(request_id, mcp_id, message.get("params") or {})
        return _response(request_id, mcp_id, {})  # notifications wait for an answer too

    def _call(self, request_id: str, mcp_id: Any, params: Mapping[str, Any]) -> dict[str, Any] | None:
        name, arguments = params.get("name"), params.get("arguments") or {}
        match = next((c for c in self._calls if c.name == name
                      and json.loads(c.arguments or "{}") == arguments), None) \
            or next((c for c in self._calls if c.name == name), None)
        if match is None:
            return _response(request_id, mcp_id, {"isError": True, "content": [
                {"type": "text", "text": f"no call of {name} is pending"}]})
        answer = self._answers.get(match.call_id)
        if answer is None:
            self._held.append((request_id, mcp_id, match.call_id))
            return None
        return _response(request_id, mcp_id, _call_result(answer))


def _call_result(answer: ToolAnswer) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": answer.content}], "isError": answer.is_error}


def _response(request_id: str, mcp_id: Any, result: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "control_response", "response": {
        "subtype": "success", "request_id": request_id,
        "response": {"mcp_response": {"jsonrpc": "2.0", "id": mcp_id, "result": dict(result)}}}}
