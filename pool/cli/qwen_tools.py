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

Which call a ``tools/call`` is for: the one its MCP id was already bound to (a
copy sent again), else the first call of the model's not yet bound with the
same name and arguments (a model may call the same tool with the same
arguments twice, in one step or in two: each gets its own result), else
the newest such call (a copy under a new id). Every turn starts afresh
(:meth:`SdkToolServer.new_turn`).
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
        self._bound: dict[str, str] = {}             # MCP id (as JSON) -> call id

    def new_turn(self) -> None:
        """Forget the calls and results of the turns before."""
        self._calls.clear()
        self._answers.clear()
        self._held.clear()
        self._bound.clear()

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
        match = self._match(mcp_id, params.get("name"), params.get("arguments") or {})
        if match is None:
            return _response(request_id, mcp_id, {"isError": True, "content": [
                {"type": "text", "text": f"no call of {params.get('name')} is pending"}]})
        answer = self._answers.get(match)
        if answer is None:
            self._held.append((request_id, mcp_id, match))
            return None
        return _response(request_id, mcp_id, _call_result(answer))

    def _match(self, mcp_id: Any, name: Any, arguments: Any) -> str | None:
        """The call id a ``tools/call`` is for (see the module's docstring)."""
        key = json.dumps(mcp_id)
        if key in self._bound:
            return self._bound[key]
        bound = set(self._bound.values())
        same = [c for c in self._calls if c.name == name and _arguments(c) == arguments] \
            or [c for c in self._calls if c.name == name]
        fresh = next((c for c in same if c.call_id not in bound), None)
        if fresh is not None:
            self._bound[key] = fresh.call_id
            return fresh.call_id
        return same[-1].call_id if same else None


def _arguments(call: PendingToolCall) -> Any:
    try:
        return json.loads(call.arguments or "{}")
    except ValueError:
        return None


def _call_result(answer: ToolAnswer) -> dict[str, Any]:
    return {"content": answer.blocks(), "isError": answer.is_error}


def _response(request_id: str, mcp_id: Any, result: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "control_response", "response": {
        "subtype": "success", "request_id": request_id,
        "response": {"mcp_response": {"jsonrpc": "2.0", "id": mcp_id, "result": dict(result)}}}}
