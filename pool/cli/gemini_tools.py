"""The API client's tools, offered to one Gemini CLI conversation by an MCP
server over HTTP on 127.0.0.1 (ACP ``session/new`` takes ``mcpServers``
of ``type: "http"``; Gemini CLI 0.61.0 announces ``mcpCapabilities.http``).

Streamable HTTP in its plainest form: each POST carries one JSON-RPC message
and gets a JSON answer (notifications: 202). ``tools/call`` is *held*: the
call is put on the conversation's queue as :class:`HeldCall` and answered
when the API client sends the result (:meth:`ToolServer.answer`). Each
conversation's server has a random bearer token, so no other local process
can list or call its tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..model import Tool
from .events import ToolAnswer

__all__ = ["ToolServer", "HeldCall", "SERVER_NAME"]

SERVER_NAME = "gw"
_MAX_BODY = 64 * 1024 * 1024
_PROTOCOL = "2025-06-18"


@dataclass(slots=True)
class HeldCall:
    """A ``tools/call`` the client answers; put on the conversation's queue."""

    call_id: str
    name: str
    arguments: str
    answer: asyncio.Future[ToolAnswer] = field(repr=False)


class ToolServer:
    """One conversation's MCP server; ``deliver`` puts held calls on its queue."""

    def __init__(self, tools: Sequence[Tool],
                 deliver: Callable[[HeldCall], None] | None = None) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.deliver = deliver
        self.token = secrets.token_urlsafe(24)
        self.held: dict[str, HeldCall] = {}
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def acp_entry(self) -> dict[str, Any]:
        """This server as ACP ``session/new`` takes it."""
        return {"type": "http", "name": SERVER_NAME, "url": f"http://127.0.0.1:{self.port}/mcp",
                "headers": [{"name": "authorization", "value": f"Bearer {self.token}"}]}

    def answer(self, answers: Sequence[ToolAnswer]) -> int:
        """Release the held calls the client answered; how many were held."""
        released = 0
        for answer in answers:
            call = self.held.pop(answer.call_id, None)
            if call is not None and not call.answer.done():
                call.answer.set_result(answer)
                released += 1
        return released

    async def close(self) -> None:
        for call in self.held.values():
            call.answer.cancel()
        self.held.clear()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    # --- HTTP ---

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                method, headers, body = request
                status, payload = await self._handle(method, headers, body)
                data = json.dumps(payload).encode() if payload is not None else b""
                head = (f"HTTP/1.1 {status} {'OK' if status < 300 else 'Error'}\r\n"
                        f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n")
                writer.write(head.encode() + data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            writer.close()

    async def _handle(self, method: str, headers: Mapping[str, str],
                      body: bytes) -> tuple[int, Any]:
        if headers.get("authorization") != f"Bearer {self.token}":
            return 401, {"error": "unauthorized"}
        if method != "POST":
            return 405, None
        try:
            message = json.loads(body)
        except ValueError:
            return 400, {"jsonrpc": "2.0", "id": None,
                         "error": {"code": -32700, "message": "parse error"}}
        if not isinstance(message, dict) or "id" not in message:
            return 202, None  # a notification (initialized, cancelled): nothing to answer
        result = await self._rpc(str(message.get("method")), message.get("params") or {})
        if isinstance(result, str):
            return 200, {"jsonrpc": "2.0", "id": message["id"],
                         "error": {"code": -32601, "message": result}}
        return 200, {"jsonrpc": "2.0", "id": message["id"], "result": result}

    async def _rpc(self, method: str, params: Mapping[str, Any]) -> dict[str, Any] | str:
        if method == "initialize":
            return {"protocolVersion": params.get("protocolVersion") or _PROTOCOL,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "poolgate", "version": "1"}}
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": [{"name": t.name, "description": t.description or "",
                               "inputSchema": t.parameters or {"type": "object"}}
                              for t in self.tools.values()]}
        if method == "tools/call":
            return await self._call(params)
        return f"method not found: {method}"

    async def _call(self, params: Mapping[str, Any]) -> dict[str, Any]:
        name = str(params.get("name"))
        if name not in self.tools:
            return {"content": [{"type": "text", "text": f"no tool {name}"}], "isError": True}
        call = HeldCall(f"call_{secrets.token_hex(12)}", name,
                        json.dumps(params.get("arguments") or {}),
                        asyncio.get_running_loop().create_future())
        if self.deliver is None:
            return {"content": [{"type": "text", "text": "no turn is running"}], "isError": True}
        self.held[call.call_id] = call
        self.deliver(call)
        try:
            answer = await call.answer
        except asyncio.CancelledError:
            return {"content": [{"type": "text", "text": "the client did not answer"}],
                    "isError": True}
        return {"content": [{"type": "text", "text": answer.content}], "isError": answer.is_error}


async def _read_request(reader: asyncio.StreamReader
                        ) -> tuple[str, dict[str, str], bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    method = line.decode("latin-1").split(" ", 1)[0].upper()
    headers: dict[str, str] = {}
    while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    if length < 0 or length > _MAX_BODY:
        raise ValueError("body too large")
    body = await reader.readexactly(length) if length else b""
    return method, headers, body
