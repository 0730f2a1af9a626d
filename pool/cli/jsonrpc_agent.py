"""The agent process of a ``jsonrpc`` worker: JSON-RPC 2.0 calls by id,
notifications routed to the session they name, the agent's own requests
answered (permissions; anything else: method not found)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Mapping

from .content import dig
from .jsonrpc_options import JsonRpcOptions
from .proc import JsonLineProcess

__all__ = ["Agent", "RpcError", "EOF", "OVERFLOW", "MAX_UNREAD"]

_CALL_TIMEOUT = 60.0
#: put on every session's queue when the agent's stdout ends
EOF = object()
#: put on a session's queue (emptied first) when the agent sent more than
#: MAX_UNREAD notifications nobody read: the session is then dropped
OVERFLOW = object()
MAX_UNREAD = 10_000


class RpcError(Exception):
    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(message)
        self.code = code


class Agent:
    """The agent process: calls by id, notifications routed to sessions."""

    def __init__(self, proc: JsonLineProcess, options: JsonRpcOptions, mode: str) -> None:
        self.proc = proc
        self.o = options
        self.mode = mode
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self.sessions: dict[str, asyncio.Queue[Any]] = {}
        self._reader = asyncio.ensure_future(self._read())

    @property
    def running(self) -> bool:
        return self.proc.running and not self._reader.done()

    def _message(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", **body} if self.o.jsonrpc_field else body

    def _send(self, body: dict[str, Any]) -> bool:
        try:
            self.proc.send(self._message(body))
        except (BrokenPipeError, ConnectionResetError):
            return False  # it died: the reader sees EOF and fails what is waiting
        return True

    def notify(self, method: str, params: Mapping[str, Any]) -> None:
        self._send({"method": method, "params": dict(params)})

    def call_nowait(self, method: str, params: Mapping[str, Any]) -> asyncio.Future[Any]:
        """Send a request; the future resolves to its result or raises RpcError."""
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[rid] = future
        if not self.running or not self._send({"id": rid, "method": method,
                                                "params": dict(params)}):
            self._calls.pop(rid, None)
            future.set_exception(RpcError(None, "the agent is not running"))
        return future

    async def call(self, method: str, params: Mapping[str, Any],
                   timeout: float = _CALL_TIMEOUT) -> Any:
        return await asyncio.wait_for(self.call_nowait(method, params), timeout)

    async def _read(self) -> None:
        try:
            async for msg in self.proc.lines():
                if "method" in msg:
                    self._incoming(msg)
                elif isinstance(msg.get("id"), int):
                    self._response(msg)
        finally:
            for future in self._calls.values():
                if not future.done():
                    future.set_exception(RpcError(None, "the agent exited"))
            self._calls.clear()
            for queue in self.sessions.values():
                queue.put_nowait(EOF)

    def _response(self, msg: Mapping[str, Any]) -> None:
        future = self._calls.pop(msg["id"], None)
        if future is None or future.done():
            return
        error = msg.get("error")
        if isinstance(error, Mapping):
            code = error.get("code")
            future.set_exception(RpcError(code if isinstance(code, int) else None,
                                          str(error.get("message") or "error")))
        else:
            future.set_result(msg.get("result"))

    def _incoming(self, msg: Mapping[str, Any]) -> None:
        params = msg.get("params") or {}
        if msg.get("method") == self.o.notification and "id" not in msg:
            sid = str(dig(params, self.o.notification_session_path))
            queue = self.sessions.get(sid)
            if queue is None:
                return  # a session nobody holds (closed, or never adopted): dropped
            if queue.qsize() >= MAX_UNREAD:  # nobody reads it: bounded, and the session is over
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(OVERFLOW)
                del self.sessions[sid]
                return
            queue.put_nowait(params)
            return
        if "id" not in msg:
            return  # a notification nobody asked about
        if msg.get("method") == self.o.permission_request:
            self._send({"id": msg["id"], "result": self._permission(params)})
            return
        self._send({"id": msg["id"], "error": {
            "code": -32601, "message": f"the gateway does not handle {msg.get('method')}"}})

    async def new_session(self, cwd: str) -> str:
        """A new agent session's id; RpcError, TimeoutError or ValueError (no id) else."""
        result = await self.call(self.o.start_session, {"cwd": cwd, **self.o.session_params})
        sid = dig(result, self.o.session_id_path)
        if sid is None:
            raise ValueError(f"no {self.o.session_id_path} in the {self.o.start_session} result")
        return str(sid)

    def _permission(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """ACP permission requests: allow once in agent mode, else cancel."""
        if self.mode == "agent":
            for option in params.get("options") or []:
                if isinstance(option, Mapping) and str(option.get("kind", "")).startswith("allow"):
                    return {"outcome": {"outcome": "selected", "optionId": option.get("optionId")}}
        return {"outcome": {"outcome": "cancelled"}}
