"""The gateway's end of one worker process: the multiplexed frame channel
(:mod:`pool.wire`) over the socketpair, and the OS process behind it. An
:class:`Incarnation` is the :class:`~pool.supervisor.Child` a
:class:`~pool.process.ProcessWorker`'s supervisor keeps alive."""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import signal
from typing import Callable

import structlog

from .errors import GatewayError, UpstreamTimeout, WorkerCrashed
from .model import ChatRequest, Event
from .supervisor import ChildGone, ChildUnhealthy
from .wire import (REASON_MAX, FrameDecoder, error_from_dict, event_from_dict, frame,
                   request_to_dict)

__all__ = ["Call", "Incarnation", "WINDOW"]

log = structlog.get_logger("pool.process")

#: events a child may send on one request ahead of the consumer (see pool.wire);
#: credit goes back in halves, so the child rarely waits while the consumer keeps up
WINDOW = 64


class Call:
    """One request in flight on an incarnation: a queue of events and its end."""

    __slots__ = ("id", "_loop", "_items", "_waiter", "_done", "_error", "_crashed", "_delivered",
                 "_credit", "_taken")

    def __init__(self, rid: int, loop: asyncio.AbstractEventLoop,
                 credit: Callable[[int, int], None]) -> None:
        self.id = rid
        self._loop = loop
        self._credit = credit  # (id, n): give ``n`` events of window back to the child
        self._taken = 0  # events consumed since the last credit
        self._items: collections.deque[Event] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._error: GatewayError | None = None
        self._crashed: str | None = None
        self._delivered = False

    @property
    def done(self) -> bool:
        return self._done

    def push(self, event: Event) -> None:
        self._items.append(event)
        self._wake()

    def finish(self, error: GatewayError | None = None, *, crashed: str | None = None) -> None:
        if not self._done:
            self._done = True
            self._error = error
            self._crashed = crashed
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def next(self) -> Event | None:
        """The next event; ``None`` at the end; raises the worker's error."""
        items = self._items
        if not items and not await self._arrival():
            return None
        self._took(1)
        return items.popleft()

    async def next_batch(self) -> list[Event] | None:
        """Every event received so far (waiting for the first); ``None`` at the
        end; raises the worker's error."""
        items = self._items
        if not items and not await self._arrival():
            return None
        batch = list(items)
        items.clear()
        self._took(len(batch))
        return batch

    async def _arrival(self) -> bool:
        """Wait for an event (``True``) or the end (``False``)."""
        items = self._items
        while not items:
            if self._done:
                if self._crashed is not None:
                    raise WorkerCrashed(self._crashed, before_first_event=not self._delivered)
                if self._error is not None:
                    raise self._error
                return False
            self._waiter = waiter = self._loop.create_future()
            await waiter
        return True

    def _took(self, n: int) -> None:
        self._delivered = True
        self._taken += n
        if self._taken >= WINDOW // 2 and not self._done:
            self._credit(self.id, self._taken)
            self._taken = 0

    @property
    def buffered(self) -> int:
        """Events received and not yet consumed (at most ``WINDOW``)."""
        return len(self._items)


class Incarnation(asyncio.Protocol):
    """One running child: the multiplexed channel plus the OS process (a ``Child``)."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, watchdog_fd: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.pid = proc.pid
        self._proc = proc
        self._watchdog_fd: int | None = watchdog_fd
        self._loop = loop
        self._decoder = FrameDecoder()
        self._transport: asyncio.Transport | None = None
        self._ready: asyncio.Future[None] = loop.create_future()
        self._calls: dict[int, Call] = {}
        self._pings: dict[int, asyncio.Future[None]] = {}
        self._results: dict[int, asyncio.Future[object]] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self.refused: str | None = None  # why the child refused to start, if it said so

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._fail_all(f"worker {self.name} (pid {self.pid}) went away")

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except ValueError:
            log.error("worker.bad_frame", worker=self.name, pid=self.pid)
            self.signal(signal.SIGKILL)
            return
        calls = self._calls
        for msg in frames:
            op = msg.get("op")
            if op == "event":
                call = calls.get(msg["id"])
                if call is not None:
                    call.push(event_from_dict(msg["event"]))
            elif op == "end":
                call = calls.pop(msg["id"], None)
                if call is not None:
                    call.finish()
            elif op == "error":
                call = calls.pop(msg["id"], None)
                if call is not None:
                    call.finish(error_from_dict(msg))
                else:
                    result = self._results.pop(msg["id"], None)
                    if result is not None and not result.done():
                        result.set_exception(error_from_dict(msg))
            elif op == "result":
                result = self._results.pop(msg["id"], None)
                if result is not None and not result.done():
                    result.set_result(msg.get("value"))
            elif op == "pong":
                fut = self._pings.pop(msg.get("id"), None)
                if fut is not None and not fut.done():
                    why = msg.get("unhealthy")
                    if why:  # it answered, but cannot serve (its engine hangs...)
                        fut.set_exception(ChildUnhealthy(str(why)))
                    else:
                        fut.set_result(None)
            elif op == "ready" and not self._ready.done():
                self._ready.set_result(None)
            elif op == "refused" and not self._ready.done():
                self.refused = str(msg.get("reason") or "")[:REASON_MAX]
                self._fail_all(f"worker {self.name} refused to start: {self.refused}")

    # --- Child ----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._transport is not None

    async def ready(self) -> None:
        await asyncio.shield(self._ready)

    async def ping(self) -> None:
        if self._transport is None:
            raise ChildGone(self.name)
        pid = next(self._ids)
        fut = self._pings[pid] = self._loop.create_future()
        self._transport.write(frame({"op": "ping", "id": pid}))
        try:
            await fut
        finally:
            self._pings.pop(pid, None)

    async def wait(self) -> int:
        return await self._proc.wait()

    def signal(self, sig: int) -> None:
        if self._proc.returncode is not None:
            return  # reaped: the pid may already belong to someone else
        try:
            os.killpg(self.pid, sig)  # the whole group: engines spawn helpers of their own
        except ProcessLookupError:
            pass
        except PermissionError:
            try:
                self._proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def gone(self) -> None:
        code = self._proc.returncode
        self._fail_all(f"worker {self.name} (pid {self.pid}) exited"
                       + (f" with {code}" if code is not None else ""))
        if self._transport is not None:
            self._transport.abort()
            self._transport = None
        if self._watchdog_fd is not None:
            os.close(self._watchdog_fd)
            self._watchdog_fd = None

    def _fail_all(self, why: str) -> None:
        if not self._ready.done():
            self._ready.set_exception(ChildGone(why))
            self._ready.exception()  # retrieved: nobody may be waiting
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call.finish(crashed=why)
        results, self._results = self._results, {}
        for fut in results.values():
            if not fut.done():
                fut.set_exception(WorkerCrashed(why, before_first_event=True))
        pings, self._pings = self._pings, {}
        for fut in pings.values():
            if not fut.done():
                fut.set_exception(ChildGone(why))

    # --- requests -----------------------------------------------------------------------------

    def open(self, request: ChatRequest) -> Call:
        if self._transport is None:
            raise WorkerCrashed(f"worker {self.name} went away", before_first_event=True)
        call = Call(next(self._ids), self._loop, self._give_credit)
        self._calls[call.id] = call
        self._transport.write(frame({"op": "request", "id": call.id, "window": WINDOW,
                                     "request": request_to_dict(request)}))
        return call

    def _give_credit(self, rid: int, n: int) -> None:
        if self._transport is not None and rid in self._calls:
            self._transport.write(frame({"op": "credit", "id": rid, "n": n}))

    @property
    def buffered(self) -> int:
        """Events received from the child and not yet consumed, over all requests."""
        return sum(call.buffered for call in self._calls.values())

    async def call(self, method: str, params: object, *, timeout: float) -> object:
        """A named call to the child (``count_tokens``...): its JSON result, or its
        error raised; :class:`UpstreamTimeout` when no answer comes within ``timeout``
        seconds (a wedged child must not hold the caller forever)."""
        if self._transport is None:
            raise WorkerCrashed(f"worker {self.name} went away", before_first_event=True)
        rid = next(self._ids)
        fut = self._results[rid] = self._loop.create_future()
        self._transport.write(frame({"op": "call", "id": rid, "method": method, "params": params}))
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            raise UpstreamTimeout(f"worker {self.name} did not answer {method} within "
                                  f"{timeout:g} s") from None
        finally:
            if self._results.pop(rid, None) is not None and self._transport is not None:
                self._transport.write(frame({"op": "cancel", "id": rid}))

    def close_call(self, call: Call) -> None:
        """The consumer is done with ``call``: cancel it in the child if it is still running."""
        if self._calls.pop(call.id, None) is not None and self._transport is not None:
            self._transport.write(frame({"op": "cancel", "id": call.id}))
