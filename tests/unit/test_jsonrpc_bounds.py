"""jsonrpc sessions are bounded: a session whose opening request was cancelled
is ended at the agent (not left open and unrouted), and a session the agent
floods with notifications nobody reads is cut off at MAX_UNREAD."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from pool.cli.driver import DriverConfig
from pool.cli.events import ConversationSetup, Turn
from pool.cli.jsonrpc import JsonRpcDriver
from pool.cli.jsonrpc_agent import MAX_UNREAD, OVERFLOW, Agent
from pool.cli.jsonrpc_options import JsonRpcOptions
from pool.cli.proc import JsonLineProcess
from pool.model import Message, TextPart

REPO = Path(__file__).resolve().parents[2]
LINGMA = {
    "initialize": "chat/init", "start_session": "chat/start", "session_id_path": "conversation.id",
    "send_prompt": "chat/ask", "session_field": "conversationId", "prompt_field": "content",
    "notification": "chat/delta", "notification_session_path": "conversationId",
    "update_kind_path": "delta.kind", "text_kind": "text", "text_path": "delta.text",
    "stop_reason_path": "finishReason", "usage_path": "usage", "cancel": "chat/stop",
    "end_session": "chat/end",
}


def _methods(log: Path) -> list[tuple[str, dict]]:
    if not log.exists():
        return []
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    return [(e["stdin"].get("method"), e["stdin"].get("params") or {}) for e in entries
            if "stdin" in e]


def test_a_session_whose_opening_was_cancelled_is_ended(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    config = DriverConfig(
        name="a", cli="jsonrpc", home=str(tmp_path), cwd=str(tmp_path),
        command=(sys.executable, str(REPO / "tests" / "fakes" / "fake_jsonrpc_agent.py"),
                 "--dialect", "lingma"),
        env={**os.environ, "OPENAI_API_KEY": "k", "FAKE_AGENT_LOG": str(log)}, options=LINGMA)

    async def main() -> None:
        driver = JsonRpcDriver(config)
        await driver._ensure_agent()  # no spare session: the conversation opens its own
        conv = await driver.open(ConversationSetup(model="m", system=None, tools=()))
        steps = conv.send(Turn((Message("user", (TextPart("hi"),)),)))
        task = asyncio.ensure_future(anext(steps))
        await asyncio.sleep(0)  # chat/start is on its way
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for _ in range(200):
            if any(m == "chat/end" for m, _ in _methods(log)):
                break
            await asyncio.sleep(0.02)
        assert driver._agent is not None and driver._agent.sessions == {}
        await steps.aclose()
        await driver.stop()

    asyncio.run(main())
    started = [m for m, _ in _methods(log) if m == "chat/start"]
    ended = [p for m, p in _methods(log) if m == "chat/end"]
    assert len(started) == 1 and len(ended) == 1


FLOOD = ("import json, sys, time\n"
         f"for i in range({MAX_UNREAD + 5}):\n"
         "    sys.stdout.write(json.dumps({'method': 'session/update', 'params': {\n"
         "        'sessionId': 's1', 'update': {'sessionUpdate': 'agent_message_chunk'}}}) + '\\n')\n"
         "sys.stdout.flush()\n"
         "time.sleep(30)\n")


def test_a_session_flooded_with_unread_notifications_is_cut_off(tmp_path: Path) -> None:
    async def main() -> None:
        proc = await JsonLineProcess.spawn([sys.executable, "-c", FLOOD], env=dict(os.environ),
                                           cwd=str(tmp_path), label="flood")
        agent = Agent(proc, JsonRpcOptions(), "chat")
        queue: asyncio.Queue = asyncio.Queue()
        agent.sessions["s1"] = queue
        for _ in range(500):
            if "s1" not in agent.sessions:
                break
            await asyncio.sleep(0.01)
        assert "s1" not in agent.sessions
        assert queue.qsize() == 1 and queue.get_nowait() is OVERFLOW
        await proc.close(grace=0)

    asyncio.run(main())
