"""uvicorn's httptools protocol with less memory per connection.

With thousands of slow streams open, what every client connection costs
counts. uvicorn's ``HttpToolsProtocol`` keeps three ``collections.deque`` per
connection that are empty nearly always: its queue of pipelined requests, and
the waiters of two ``asyncio.Event`` (the request cycle's message event, which
``receive()`` waits on; the flow control's writable event). An empty deque costs
≈ 0.75 KiB (a 64-slot block and a block freelist); a list, which does all that
these three are asked to do (append, remove, iterate; ``appendleft`` and ``pop``
for the pipeline), costs 56 bytes. So :class:`LeanHttpToolsProtocol` swaps them
for lists as they are made: the same behaviour, ≈ 2 KiB less per connection.

``poolgate serve`` runs it (:func:`app.cli.build_server`), and so do the tests'
servers. Each swap checks what it replaces, so a uvicorn that stores these
differently keeps its own (and :func:`lean_state` tells the tests).

These are private attributes of uvicorn and asyncio, verified on the uvicorn
series ``pyproject.toml`` allows; :mod:`app.protocol_check` checks at
start-up that they still behave.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["LeanHttpToolsProtocol", "lean_state"]


class _Pipeline(list):  # type: ignore[type-arg]
    """uvicorn's queue of pipelined requests: ``appendleft`` and ``pop``, FIFO."""

    __slots__ = ()

    def appendleft(self, item: Any) -> None:
        self.insert(0, item)


def _lean(event: Any) -> None:
    """An ``asyncio.Event`` whose waiters are kept in a list, not a deque."""
    if type(event) is asyncio.Event and type(event._waiters) is deque and not event._waiters:
        event._waiters = []


class LeanHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self.pipeline) is deque and not self.pipeline:
            self.pipeline = _Pipeline()  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        _lean(getattr(self.flow, "_is_writable_event", None))

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        # the cycle this request made (its task has not run yet)
        _lean(getattr(self.cycle, "message_event", None))


def lean_state(protocol: Any) -> dict[str, bool]:
    """Which of the three deques of ``protocol`` (a connection's) are lists now."""
    cycle = getattr(protocol, "cycle", None)
    return {"pipeline": type(protocol.pipeline) is _Pipeline,
            "writable": type(protocol.flow._is_writable_event._waiters) is list,
            "message": cycle is not None and type(cycle.message_event._waiters) is list}

