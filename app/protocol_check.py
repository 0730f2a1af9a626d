"""Does :class:`app.protocol.LeanHttpToolsProtocol` still behave on this uvicorn?

Its swaps touch private attributes of uvicorn and asyncio (verified on the
uvicorn series ``pyproject.toml`` allows). :func:`self_test` serves two
pipelined requests, the first with its body in two pieces and its answer
held by paused writing (so each swapped list is used), on an in-memory
transport, and says what went wrong, if anything. ``poolgate serve`` runs it
through :func:`lean_protocol` before the server starts (``protocol.swap`` on
or off in its log); off, the server runs uvicorn's own protocol.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import structlog
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .protocol import LeanHttpToolsProtocol, lean_state

__all__ = ["lean_protocol", "self_test"]

log = structlog.get_logger("poolgate")


def lean_protocol(candidate: type[HttpToolsProtocol] = LeanHttpToolsProtocol
                  ) -> type[HttpToolsProtocol]:
    """``candidate`` if its swaps pass :func:`self_test` here, else uvicorn's own
    protocol; logs ``protocol.swap`` on or off."""
    failure = self_test(candidate)
    if failure is None:
        log.info("protocol.swap", state="on")
        return candidate
    log.warning("protocol.swap", state="off", reason=failure)
    return HttpToolsProtocol


def self_test(protocol_class: type[HttpToolsProtocol] = LeanHttpToolsProtocol,
              timeout: float = 5.0) -> str | None:
    """None when ``protocol_class`` swaps its three deques and still serves
    (within ``timeout``); else what went wrong. Runs on a loop of its own in a
    short-lived thread (the caller's loop may be running, or not yet)."""
    outcome: list[str | None] = []

    def run() -> None:
        try:
            outcome.append(asyncio.run(_exercise(protocol_class, timeout)))
        except BaseException as exc:  # noqa: BLE001 - any failure turns the swap off
            outcome.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, name="protocol-self-test", daemon=True)
    thread.start()
    thread.join(timeout + 5)
    return outcome[0] if outcome else "the self-test did not finish"


class _Transport(asyncio.Transport):
    """An in-memory transport: what the protocol writes is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    """Answers its request's body, in two writes."""
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body) + 1).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": b"!"})


def _request(body: bytes) -> bytes:
    return b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def _exercise(protocol_class: type[HttpToolsProtocol], timeout: float) -> str | None:
    import uvicorn
    from uvicorn.server import ServerState

    config = uvicorn.Config(_echo, lifespan="off", log_config=None, access_log=False,
                            http=protocol_class)
    config.load()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = _Transport()
    protocol.connection_made(transport)
    first, second = _request(b"first body"), _request(b"second")
    try:
        async with asyncio.timeout(timeout):
            protocol.data_received(first[:-5])  # the body in two pieces: receive() waits
            await _turns()
            protocol.pause_writing()  # the answer waits for the writable event
            protocol.data_received(first[-5:] + second)  # the second request pipelined
            await _turns()
            state = lean_state(protocol)
            if not all(state.values()):
                return f"not swapped: {state}"
            protocol.resume_writing()
            while (transport.written.count(b"HTTP/1.1 200") < 2
                   or not transport.written.endswith(b"!")):
                await asyncio.sleep(0)
    finally:  # the requests' tasks end (the client gone), whatever happened
        protocol.resume_writing()
        protocol.connection_lost(None)
        await _turns()
    written = bytes(transport.written)
    answers = [part.split(b"\r\n\r\n", 1)[1] for part in written.split(b"HTTP/1.1 200")[1:]]
    if answers != [b"first body!", b"second!"]:
        return f"unexpected answers: {answers!r}"
    return None


async def _turns() -> None:
    for _ in range(5):
        await asyncio.sleep(0)
