"""pool.cli.claude_resume: which rebuilt Claude conversations wait for their
first turn, what that turn puts into the session, and a start that fails."""

from __future__ import annotations

import asyncio

from pool.cli.claude_resume import ResultsFirst
from pool.cli.history import ends_in_tool_calls, results_message
from pool.cli.events import Turn, TurnFailed
from pool.model import ImagePart, Message, TextPart, ToolCallPart, ToolResultPart

CALL = ToolCallPart("toolu_1", "get_weather", "{}")
RESULT = ToolResultPart("toolu_1", (TextPart("sun"),))


def test_only_a_history_ending_in_tool_calls_waits_for_the_results():
    assert ends_in_tool_calls((Message("user", (TextPart("q"),)), Message("assistant", (CALL,))))
    assert not ends_in_tool_calls((Message("assistant", (CALL,)), Message("user", (RESULT,)),
                                   Message("assistant", (TextPart("done"),))))
    assert not ends_in_tool_calls(())


def test_the_turn_goes_in_as_one_message_results_first():
    image = ImagePart(url="https://example.com/a.png")
    turn = Turn((Message("user", (TextPart("see"), image)), Message("user", (RESULT,))))
    assert results_message(turn) == Message("user", (RESULT, TextPart("see"), image))
    assert results_message(Turn((Message("user", (TextPart("never mind"),)),))) is None


def _events(conv: ResultsFirst, turn: Turn) -> list[object]:
    async def run() -> list[object]:
        return [event async for event in conv.send(turn)]
    return asyncio.run(run())


def test_a_start_that_fails_is_a_failed_turn_and_closes_cleanly():
    started: list[tuple[Message, ...]] = []

    async def start(results: tuple[Message, ...]):
        started.append(results)
        raise BrokenPipeError("claude exited")

    conv = ResultsFirst(start)
    [failed] = _events(conv, Turn((Message("user", (RESULT,)),)))
    assert isinstance(failed, TurnFailed) and failed.kind == "upstream"
    assert "BrokenPipeError" in failed.message
    assert started == [(Message("user", (RESULT,)),)]
    assert conv.session_id is None and conv.alive
    asyncio.run(conv.close())
    assert not conv.alive


def test_a_conversation_closed_before_its_first_turn_never_starts():
    async def start(results: tuple[Message, ...]):
        raise AssertionError("started")

    conv = ResultsFirst(start)
    asyncio.run(conv.close())
    [failed] = _events(conv, Turn((Message("user", (RESULT,)),)))
    assert isinstance(failed, TurnFailed)
    [held] = asyncio.run(_collect(conv))
    assert isinstance(held, TurnFailed)


async def _collect(conv: ResultsFirst) -> list[object]:
    return [event async for event in conv.answer_tools(())]
