"""The child side of the worker protocol (see :mod:`pool.wire`).

A worker program supplies an async generator of events per request::

    from pool import worker_main

    async def answer(request):
        yield Start()
        yield TextDelta("hi")
        yield Finish("stop")

    if __name__ == "__main__":
        worker_main.run(answer, setup=load_model)

:func:`run` ties the child's life to the gateway's three ways, so nothing
survives a gateway that is SIGKILLed: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``
(Linux), a watchdog thread blocked on a pipe whose only writer is the gateway
(EOF: the gateway is gone, even when this event loop is stuck in user code),
and EOF on the protocol socket. SIGTERM ends the worker promptly: requests in
flight are cancelled (the gateway only sends it after draining).

``ping`` is answered by this event loop, so a handler that blocks the loop
(CPU-bound model code run inline instead of in a thread) fails health checks
and gets the worker replaced. A program with a ``health`` callable (a model
engine: is its server answering, is it making progress) is asked too, and a
reason it returns goes back with the pong: the gateway replaces the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
from typing import Any, AsyncIterator, Awaitable, Callable

import structlog

from .errors import GatewayError
from .model import ChatRequest, Event, TextDelta
from .wire import (REASON_MAX, FrameDecoder, error_to_dict, event_to_dict, frame,
                   request_from_dict)

__all__ = ["run", "serve", "guard_parent", "Handler", "HealthCheck", "ENV_SOCKET_FD",
           "ENV_WATCHDOG_FD"]

ENV_SOCKET_FD = "POOLGATE_WORKER_FD"
ENV_WATCHDOG_FD = "POOLGATE_WATCHDOG_FD"
_PR_SET_PDEATHSIG = 1
_ORPHAN_EXIT = 70

Handler = Callable[[ChatRequest], AsyncIterator[Event]]
#: a named call the gateway may make besides requests (``count_tokens``...):
#: plain JSON in, plain JSON out; GatewayErrors travel back as errors
CallHandler = Callable[[Any], Awaitable[Any]]
#: why the worker cannot serve now, or None when it can; must answer promptly
HealthCheck = Callable[[], Awaitable[str | None]]
log = structlog.get_logger("pool.worker_main")



def run(handler: Handler, *, setup: Callable[[], Awaitable[None]] | None = None,
        handle_sigterm: bool = True, calls: dict[str, CallHandler] | None = None) -> None:
    """The entry point of a worker program: guard against orphanhood, then serve."""
    guard_parent()
    asyncio.run(serve(handler, setup=setup, handle_sigterm=handle_sigterm, calls=calls))


def guard_parent() -> None:
    """Die with the gateway: parent-death signal and the watchdog pipe. Call first thing."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    fd = os.environ.get(ENV_WATCHDOG_FD)
    if fd is not None:
        # also covers a gateway that died before the prctl above: the read sees EOF at once
        threading.Thread(target=_watch, args=(int(fd),), name="poolgate-watchdog",
                         daemon=True).start()


def _watch(fd: int) -> None:
    os.set_inheritable(fd, False)
    try:
        while os.read(fd, 64):
            pass
    except OSError:
        pass
    os._exit(_ORPHAN_EXIT)


async def serve(handler: Handler, *, setup: Callable[[], Awaitable[None]] | None = None,
                sock: socket.socket | None = None, handle_sigterm: bool = True,
                calls: dict[str, CallHandler] | None = None,
                health: HealthCheck | None = None,
                refused: tuple[type[BaseException], ...] = ()) -> None:
    """Serve the protocol on ``sock`` (default: the fd the gateway passed) until
    the gateway closes it or SIGTERM arrives (unless ``handle_sigterm`` is false:
    then SIGTERM is the program's business). A ``setup`` that raises one of
    ``refused`` (the worker cannot run as configured) tells the gateway why
    (``{"op": "refused", "reason"}``, shown in its ``last_exit``) before it raises on."""
    if sock is None:
        sock = socket.socket(fileno=int(os.environ[ENV_SOCKET_FD]))
    sock.set_inheritable(False)  # grandchildren must not keep the gateway's EOF away
    if setup is not None:
        try:
            await setup()
        except refused as exc:
            with contextlib.suppress(OSError):
                sock.sendall(frame({"op": "refused", "reason": str(exc)[:REASON_MAX]}))
            raise
    loop = asyncio.get_running_loop()
    server = _Server(handler, loop, calls or {}, health)
    await loop.create_connection(lambda: server, sock=sock)
    if handle_sigterm:
        try:
            loop.add_signal_handler(signal.SIGTERM, server.close)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    server.send({"op": "ready"})  # after the handler: a restart may SIGTERM us at once
    try:
        await server.closed
    finally:
        await server.shutdown()


class _Server(asyncio.Protocol):
    def __init__(self, handler: Handler, loop: asyncio.AbstractEventLoop,
                 calls: dict[str, CallHandler], health: HealthCheck | None = None) -> None:
        self._handler = handler
        self._calls = calls
        self._health = health
        self._checks: set[asyncio.Task[None]] = set()
        self._loop = loop
        self._decoder = FrameDecoder()
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._windows: dict[int, _Window] = {}
        self._transport: asyncio.Transport | None = None
        self._writable: asyncio.Future[None] | None = None
        self.closed: asyncio.Future[None] = loop.create_future()

    # --- asyncio.Protocol -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self.close()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        waiter, self._writable = self._writable, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except ValueError:
            log.error("worker.bad_frame")
            self.close()
            return
        for msg in frames:
            op = msg.get("op")
            if op == "request":
                rid = msg["id"]
                window = msg.get("window")
                if type(window) is int and window > 0:
                    self._windows[rid] = _Window(window)
                self._tasks[rid] = self._loop.create_task(self._answer(rid, msg["request"]))
            elif op == "credit":
                flow = self._windows.get(msg.get("id"))  # type: ignore[arg-type]
                n = msg.get("n")
                if flow is not None and type(n) is int and n > 0:
                    flow.give(n)
            elif op == "cancel":
                task = self._tasks.get(msg["id"])
                if task is not None:
                    task.cancel()
            elif op == "ping":
                if self._health is None:
                    self.send({"op": "pong", "id": msg.get("id")})
                else:
                    task = self._loop.create_task(self._pong(msg.get("id")))
                    self._checks.add(task)
                    task.add_done_callback(self._checks.discard)
            elif op == "call":
                rid = msg["id"]
                self._tasks[rid] = self._loop.create_task(
                    self._call(rid, msg.get("method"), msg.get("params")))

    # --- lifecycle ----------------------------------------------------------------

    def send(self, obj: Any) -> None:
        if self._transport is not None:
            self._transport.write(frame(obj))

    def close(self) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    async def shutdown(self) -> None:
        tasks = [*self._tasks.values(), *self._checks]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._transport is not None:
            self._transport.close()

    # --- one request ------------------------------------------------------------------

    async def _answer(self, rid: int, body: dict[str, Any]) -> None:
        events = None
        flow = self._windows.get(rid)
        try:
            events = self._handler(request_from_dict(body))
            write = self._write_event
            async for event in events:
                if self._transport is None:
                    return
                if flow is not None and not flow.take():
                    await flow.wait()  # the client reads slowly: generate no further ahead
                    flow.take()
                write(rid, event)
                if self._writable is not None:
                    await self._writable  # the gateway is slow: wait for the socket to drain
            self.send({"op": "end", "id": rid})
        except asyncio.CancelledError:
            pass  # the gateway dropped the request, or we are stopping: say nothing more
        except GatewayError as exc:
            self.send({"op": "error", "id": rid, **error_to_dict(exc)})
        except Exception as exc:
            log.exception("worker.handler_failed", error=type(exc).__name__)
            self.send({"op": "error", "id": rid, "kind": "upstream", "status": 502,
                       "message": f"worker failed ({type(exc).__name__})"})
        finally:
            self._tasks.pop(rid, None)
            self._windows.pop(rid, None)
            if events is not None and hasattr(events, "aclose"):
                await events.aclose()

    async def _pong(self, pid: Any) -> None:
        assert self._health is not None
        try:
            why = await self._health()
        except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check
            log.exception("worker.health_failed", error=type(exc).__name__)
            why = f"the health check failed ({type(exc).__name__})"
        self.send({"op": "pong", "id": pid, **({"unhealthy": why} if why else {})})

    async def _call(self, rid: int, method: Any, params: Any) -> None:
        try:
            fn = self._calls.get(method) if isinstance(method, str) else None
            if fn is None:
                self.send({"op": "error", "id": rid, "kind": "not_found", "status": 404,
                           "message": f"this worker has no call {method!r}"})
                return
            self.send({"op": "result", "id": rid, "value": await fn(params)})
        except asyncio.CancelledError:
            pass
        except GatewayError as exc:
            self.send({"op": "error", "id": rid, **error_to_dict(exc)})
        except Exception as exc:
            log.exception("worker.call_failed", method=method, error=type(exc).__name__)
            self.send({"op": "error", "id": rid, "kind": "upstream", "status": 502,
                       "message": f"worker failed ({type(exc).__name__})"})
        finally:
            self._tasks.pop(rid, None)

    def _write_event(self, rid: int, event: Event) -> None:
        if self._transport is not None:
            if type(event) is TextDelta:
                body: Any = {"op": "event", "id": rid, "event": {"_t": "text", "text": event.text}}
            else:
                body = {"op": "event", "id": rid, "event": event_to_dict(event)}
            self._transport.write(frame(body))


class _Window:
    """One request's send window: events it may still send before the gateway
    gives credit (see :mod:`pool.wire`)."""

    __slots__ = ("credit", "_waiter")

    def __init__(self, credit: int) -> None:
        self.credit = credit
        self._waiter: asyncio.Future[None] | None = None

    def take(self) -> bool:
        if self.credit > 0:
            self.credit -= 1
            return True
        return False

    async def wait(self) -> None:
        while self.credit <= 0:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def give(self, n: int) -> None:
        self.credit += n
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
