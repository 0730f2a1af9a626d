"""app.disconnect.DisconnectWatch: receive() driven without a task."""

from __future__ import annotations

import asyncio
from typing import Any

from app.disconnect import DisconnectWatch


class Client:
    """A receive() like uvicorn's: waits on an asyncio.Event until the client
    sends more or leaves; records what its finally blocks saw."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.messages: list[dict[str, Any]] = []
        self.calls = 0
        self.unwound = 0

    async def receive(self) -> dict[str, Any]:
        self.calls += 1
        try:
            while not self.messages:
                await self.event.wait()
                self.event.clear()
            return self.messages.pop(0)
        finally:
            self.unwound += 1

    def push(self, kind: str) -> None:
        self.messages.append({"type": kind})
        self.event.set()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_disconnect_is_noticed_as_soon_as_it_is_received() -> None:
    client, gone = Client(), []
    watch = DisconnectWatch(client.receive, lambda: gone.append(1), asyncio.get_running_loop())
    await _settle()
    assert gone == [] and client.calls == 1
    client.push("http.request")  # not a disconnect: read, dropped, receive() again
    await _settle()
    assert gone == [] and client.calls == 2
    client.push("http.disconnect")
    await _settle()
    assert gone == [1] and client.calls == 2 and client.unwound == 2
    watch.close()  # after the end: nothing left to close
    assert client.unwound == 2


async def test_an_early_disconnect_is_noticed_at_once() -> None:
    client, gone = Client(), []
    client.push("http.disconnect")
    DisconnectWatch(client.receive, lambda: gone.append(1), asyncio.get_running_loop())
    await asyncio.sleep(0)  # driven from the next loop turn on, outside this task
    assert gone == [1]


async def test_close_unwinds_the_pending_receive_and_stops_watching() -> None:
    client, gone = Client(), []
    watch = DisconnectWatch(client.receive, lambda: gone.append(1), asyncio.get_running_loop())
    await _settle()
    watch.close()
    assert client.unwound == 1  # its finally ran, as for a cancelled task
    assert not client.event._waiters  # Event.wait took its future back
    client.push("http.disconnect")
    await _settle()
    assert gone == [] and client.calls == 1


async def test_bare_yields_and_a_failing_receive() -> None:
    gone: list[int] = []
    turns = 0

    async def yielding() -> dict[str, Any]:
        nonlocal turns
        for _ in range(3):
            await asyncio.sleep(0)  # a bare yield: resumed at the next loop turn
            turns += 1
        return {"type": "http.disconnect"}

    DisconnectWatch(yielding, lambda: gone.append(1), asyncio.get_running_loop())
    await _settle()
    assert turns == 3 and gone == [1]

    async def failing() -> dict[str, Any]:
        await asyncio.sleep(0)
        raise RuntimeError("the server broke")

    DisconnectWatch(failing, lambda: gone.append(2), asyncio.get_running_loop())
    await _settle()
    assert gone == [1]  # no disconnect reported; the watch just ends


async def test_a_receive_that_needs_a_task_gets_one() -> None:
    import structlog

    client, gone = Client(), []

    async def in_a_timeout() -> dict[str, Any]:
        async with asyncio.timeout(None):  # RuntimeError outside a task
            return await client.receive()

    loop = asyncio.get_running_loop()
    with structlog.testing.capture_logs() as logs:
        DisconnectWatch(in_a_timeout, lambda: gone.append(1), loop)
        await _settle()
        client.push("http.disconnect")
        await _settle()
        assert gone == [1]
        closed = DisconnectWatch(in_a_timeout, lambda: gone.append(2), loop)  # a task at once
        await _settle()
        assert client.calls == 2
        closed.close()
        await _settle()
        assert client.unwound == 2  # the task's receive() was cancelled
        client.push("http.disconnect")
        await _settle()
        assert gone == [1]
    assert [(e["event"], e["log_level"]) for e in logs] == [("stream.watch_fallback", "warning")]
