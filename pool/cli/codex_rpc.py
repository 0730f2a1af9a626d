"""The JSON-RPC client side of one ``codex app-server`` process.

Codex speaks newline-delimited JSON-RPC on stdio without the ``"jsonrpc"``
field: our requests carry an ``id`` and get a ``result`` or ``error`` back;
the server sends notifications (``turn/started``, ``item/agentMessage/delta``,
…) and requests of its own (``item/tool/call``, approvals) whose ids count
from 0 independently of ours.

:class:`CodexRpc` owns the reader task. Replies resolve the caller's future;
everything that names a thread (``params.threadId``, or ``params.thread.id``)
goes to that thread's queue, in order, so several threads can run turns in
one process at once; the rest (``account/rateLimits/updated``,
``account/updated``, ``configWarning``…) goes to ``on_account`` when set, else
is dropped. Server requests for a thread nobody listens to are refused at once,
so the server never waits on us. When the process's stdout ends, every
pending call fails with :class:`RpcClosed` and every queue gets ``None``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import orjson
import structlog

__all__ = ["CodexRpc", "RpcError", "RpcClosed", "ServerRequest", "Notification", "Inbound"]

log = structlog.get_logger(__name__)


class RpcError(Exception):
    """The server answered a request with a JSON-RPC error."""

    def __init__(self, method: str, code: int | None, message: str) -> None:
        super().__init__(f"{method}: {message} (code {code})")
        self.method = method
        self.code = code
        self.message = message


class RpcClosed(Exception):
    """The app-server's stdout ended (it exited or was killed)."""


@dataclass(frozen=True, slots=True)
class Notification:
    method: str
    params: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ServerRequest:
    """A request from the server (``item/tool/call``); answer with :meth:`CodexRpc.respond`."""

    id: Any
    method: str
    params: Mapping[str, Any]


Inbound = Notification | ServerRequest


def _thread_of(params: Any) -> str | None:
    if not isinstance(params, dict):
        return None
    tid = params.get("threadId")
    if isinstance(tid, str):
        return tid
    thread = params.get("thread")
    if isinstance(thread, dict) and isinstance(thread.get("id"), str):
        return thread["id"]
    return None


class CodexRpc:
    """Requests, notifications and server requests over one process's stdio."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._calls: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self._routes: dict[str, asyncio.Queue[Inbound | None]] = {}
        self._write_lock = asyncio.Lock()
        #: notifications of no thread (``account/rateLimits/updated``): ``(method, params)``
        self.on_account: Callable[[str, Any], None] | None = None
        self.closed = asyncio.Event()
        self._task = asyncio.create_task(self._read(), name="codex-rpc-reader")

    # --- outbound -------------------------------------------------------------------------

    async def request(self, method: str, params: Mapping[str, Any] | None = None,
                      timeout: float | None = 30.0) -> Any:
        """Send a request and wait for its result (RpcError, RpcClosed, TimeoutError)."""
        if self.closed.is_set():
            raise RpcClosed(f"{method}: the app-server has exited")
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[rid] = (method, future)
        try:
            await self._send({"id": rid, "method": method, "params": dict(params or {})})
            return await asyncio.wait_for(future, timeout)
        finally:
            self._calls.pop(rid, None)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"method": method}
        if params is not None:
            message["params"] = dict(params)
        await self._send(message)

    async def respond(self, request_id: Any, result: Mapping[str, Any]) -> None:
        """Answer a server request (a no-op once the process is gone: whoever
        waits on its thread's queue hears about that)."""
        await self._answer({"id": request_id, "result": dict(result)})

    async def refuse(self, request_id: Any, message: str) -> None:
        await self._answer({"id": request_id, "error": {"code": -32601, "message": message}})

    async def _answer(self, message: Mapping[str, Any]) -> None:
        if self.closed.is_set():
            return
        try:
            await self._send(message)
        except RpcClosed:
            pass

    async def _send(self, message: Mapping[str, Any]) -> None:
        async with self._write_lock:
            try:
                self._writer.write(orjson.dumps(message) + b"\n")
                await self._writer.drain()
            except (ConnectionError, RuntimeError) as exc:
                raise RpcClosed(f"cannot write to the app-server: {exc}") from exc

    # --- routing --------------------------------------------------------------------------

    def subscribe(self, thread_id: str) -> asyncio.Queue[Inbound | None]:
        """The queue of everything the server says about ``thread_id``."""
        queue: asyncio.Queue[Inbound | None] = asyncio.Queue()
        if self.closed.is_set():
            queue.put_nowait(None)
        self._routes[thread_id] = queue
        return queue

    def unsubscribe(self, thread_id: str) -> None:
        self._routes.pop(thread_id, None)

    # --- inbound ---------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while line := await self._reader.readline():
                try:
                    message = orjson.loads(line)
                except orjson.JSONDecodeError:
                    log.warning("codex.rpc.bad_line", size=len(line))
                    continue
                if isinstance(message, dict):
                    await self._dispatch(message)
        except (ConnectionError, ValueError, asyncio.LimitOverrunError) as exc:
            log.warning("codex.rpc.read_failed", error=str(exc))
        finally:
            self._close()

    async def _dispatch(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:
            self._resolve(message)
            return
        params = message.get("params") or {}
        queue = self._routes.get(_thread_of(params) or "")
        if "id" in message:
            if queue is None:
                await self.refuse(message["id"], f"{method}: no such thread here")
            else:
                queue.put_nowait(ServerRequest(message["id"], method, params))
        elif queue is not None:
            queue.put_nowait(Notification(method, params))
        elif self.on_account is not None and _thread_of(params) is None:
            try:
                self.on_account(str(method), params)
            except Exception as exc:  # noqa: BLE001 - a bad notification must not stop reading
                log.warning("codex.rpc.account_note_failed", method=str(method)[:80],
                            error=type(exc).__name__)

    def _resolve(self, message: dict[str, Any]) -> None:
        entry = self._calls.get(message.get("id"))  # type: ignore[arg-type]
        if entry is None or entry[1].done():
            return
        method, future = entry
        error = message.get("error")
        if error is not None:
            error = error if isinstance(error, dict) else {"message": str(error)}
            future.set_exception(RpcError(method, error.get("code"), str(error.get("message"))))
        else:
            future.set_result(message.get("result"))

    def _close(self) -> None:
        self.closed.set()
        for method, future in self._calls.values():
            if not future.done():
                future.set_exception(RpcClosed(f"{method}: the app-server has exited"))
        for queue in self._routes.values():
            queue.put_nowait(None)

    async def aclose(self) -> None:
        """Stop reading (the process itself is the caller's to end)."""
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
