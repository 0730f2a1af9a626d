"""CodexRpc over real OS pipes, the test playing the app-server's side."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pool.cli.codex_rpc import CodexRpc, Notification, RpcClosed, RpcError, ServerRequest


class Peer:
    """The server end: writes lines to the client's stdout, reads its stdin."""

    def __init__(self) -> None:
        self.to_client_r, self.to_client_w = os.pipe()
        self.from_client_r, self.from_client_w = os.pipe()

    async def connect(self) -> CodexRpc:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        self.read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(self.to_client_r, "rb"))
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(self.from_client_w, "wb"))
        self.write_transport = transport
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        self.inbox = os.fdopen(self.from_client_r, "rb")
        return CodexRpc(reader, writer)

    def say(self, message: Any) -> None:
        data = (message if isinstance(message, bytes) else json.dumps(message).encode()) + b"\n"
        os.write(self.to_client_w, data)

    async def heard(self) -> dict[str, Any]:
        line = await asyncio.to_thread(self.inbox.readline)
        return json.loads(line)

    def hang_up(self) -> None:
        if self.to_client_w >= 0:
            os.close(self.to_client_w)
            self.to_client_w = -1

    def close(self) -> None:
        self.hang_up()
        self.read_transport.close()
        self.write_transport.close()
        self.inbox.close()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[CodexRpc, Peer]]:
    peer = Peer()
    rpc = await peer.connect()
    yield rpc, peer
    await rpc.aclose()
    peer.close()
    await asyncio.sleep(0)  # let the transports finish closing


async def test_replies_resolve_requests_and_errors_raise(pair: tuple[CodexRpc, Peer]) -> None:
    rpc, peer = pair
    call = asyncio.create_task(rpc.request("account/read", {"refreshToken": False}))
    sent = await peer.heard()
    assert sent == {"id": sent["id"], "method": "account/read", "params": {"refreshToken": False}}
    assert "jsonrpc" not in sent  # Codex's framing has no version field
    peer.say({"id": sent["id"], "result": {"account": None}})
    assert await call == {"account": None}

    failing = asyncio.create_task(rpc.request("thread/resume", {"threadId": "x"}))
    sent = await peer.heard()
    peer.say({"id": sent["id"], "error": {"code": -32600, "message": "no rollout found"}})
    with pytest.raises(RpcError, match="no rollout found") as err:
        await failing
    assert err.value.code == -32600


async def test_thread_traffic_is_routed_and_strangers_are_refused(
        pair: tuple[CodexRpc, Peer]) -> None:
    rpc, peer = pair
    queue = rpc.subscribe("t1")
    peer.say(b"not json at all")  # a stray line is skipped
    peer.say({"method": "configWarning", "params": {"summary": "global"}})  # no thread: dropped
    peer.say({"method": "turn/started", "params": {"threadId": "t1", "turn": {"id": "u"}}})
    peer.say({"method": "thread/started", "params": {"thread": {"id": "t1"}}})
    peer.say({"method": "item/tool/call", "id": 0, "params": {"threadId": "t1", "callId": "c"}})
    peer.say({"method": "item/tool/call", "id": 1, "params": {"threadId": "t2", "callId": "d"}})

    got = [await asyncio.wait_for(queue.get(), 5) for _ in range(3)]
    assert got[0] == Notification("turn/started", {"threadId": "t1", "turn": {"id": "u"}})
    assert got[1].method == "thread/started"
    assert got[2] == ServerRequest(0, "item/tool/call", {"threadId": "t1", "callId": "c"})
    # nobody listens to t2: refused at once, so the server does not wait forever
    assert await peer.heard() == {"id": 1, "error": {"code": -32601,
                                                      "message": "item/tool/call: no such thread here"}}
    await rpc.respond(0, {"success": True, "contentItems": []})
    assert await peer.heard() == {"id": 0, "result": {"success": True, "contentItems": []}}


async def test_end_of_output_fails_calls_and_wakes_every_thread(
        pair: tuple[CodexRpc, Peer]) -> None:
    rpc, peer = pair
    queue = rpc.subscribe("t1")
    pending = asyncio.create_task(rpc.request("turn/start", {"threadId": "t1"}))
    await peer.heard()
    peer.hang_up()
    with pytest.raises(RpcClosed):
        await pending
    assert await asyncio.wait_for(queue.get(), 5) is None
    assert rpc.closed.is_set()
    assert await rpc.subscribe("t2").get() is None  # late subscribers hear it too
    with pytest.raises(RpcClosed):
        await rpc.request("account/read")
    await rpc.respond(5, {})  # answering into a closed pipe is a no-op
