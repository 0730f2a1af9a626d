"""The cli host with a scripted driver (a test double of the driver
interface, no processes): which conversation a request continues, flattening
for a CLI that cannot load a transcript, LRU eviction, held tool calls and
their release, and how driver failures reach the gateway."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Sequence

import pytest

from pool.cli.driver import DriverConfig
from pool.cli.events import (CliHealth, ConversationSetup, LoginRequired, PendingToolCall,
                             TextChunk, ToolAnswer, ToolExecuted, ToolOutput, ToolsPending, Turn,
                             TurnFailed, TurnFinished, TurnUsage)
from pool.cli.host import CliHost
from pool.errors import BadRequest, Overloaded, UpstreamUnavailable
from pool.model import (ChatRequest, ExecutedTool, ExecutedToolPart, Finish, Message, Start,
                        TextDelta, TextPart, ToolCallEnd, ToolCallPart, ToolCallStart,
                        ToolResultPart, Usage, executed_text)


class ScriptedConversation:
    def __init__(self, driver: "ScriptedDriver", setup: ConversationSetup) -> None:
        self.driver = driver
        self.setup = setup
        self.turns: list[Turn] = []
        self.answers: list[ToolAnswer] = []
        self.closed = False

    @property
    def session_id(self) -> str:
        return f"s{id(self)}"

    @property
    def alive(self) -> bool:
        return not self.closed

    async def _events(self, events: list) -> AsyncIterator:
        for event in events:
            await asyncio.sleep(0)
            yield event

    def send(self, turn: Turn) -> AsyncIterator:
        self.turns.append(turn)
        return self._events(self.driver.script.pop(0))

    def answer_tools(self, answers: Sequence[ToolAnswer]) -> AsyncIterator:
        self.answers.extend(answers)
        return self._events(self.driver.script.pop(0))

    async def interrupt(self) -> None:
        self.driver.interrupts += 1

    async def close(self) -> None:
        self.closed = True


class ScriptedDriver:
    cli = "scripted"
    concurrent_turns = False

    def __init__(self, script: list[list], *, can_load_history: bool = True) -> None:
        self.script = script
        self.login = CliHealth(login="ready")  # what health() answers
        self.can_load_history = can_load_history
        self.opened: list[ScriptedConversation] = []
        self.interrupts = 0

    async def start(self) -> CliHealth:
        return CliHealth(login="ready", version="1.0")

    async def open(self, setup: ConversationSetup) -> ScriptedConversation:
        conv = ScriptedConversation(self, setup)
        self.opened.append(conv)
        return conv

    async def health(self) -> CliHealth:
        return self.login

    async def stop(self) -> None:
        return None


def _host(driver: ScriptedDriver, **config: object) -> CliHost:
    return CliHost(driver, DriverConfig(name="w", cli="scripted", home="/h", cwd="/h/w",
                                        **config))  # type: ignore[arg-type]


def _request(*messages: Message, key: str = "team") -> ChatRequest:
    return ChatRequest(model="m", messages=messages, dialect="openai_chat", key_name=key)


def _user(text: str) -> Message:
    return Message("user", (TextPart(text),))


def _said(text: str) -> list:
    return [TextChunk(text), TurnUsage(3, 2), TurnFinished()]


async def _collect(host: CliHost, request: ChatRequest) -> list:
    return [event async for event in host.answer(request)]


def run(coro):
    return asyncio.run(coro)


def test_reuse_then_a_cli_without_transcripts_gets_the_history_flattened():
    async def go() -> None:
        driver = ScriptedDriver([_said("a1"), _said("a2"), _said("b2")], can_load_history=False)
        host = _host(driver)
        await host.start()
        events = await _collect(host, _request(_user("q1")))
        assert events == [Start(model="m"), TextDelta("a1"), Usage(3, 2), Finish("stop")]
        history = (_user("q1"), Message("assistant", (TextPart("a1"),)))
        await _collect(host, _request(*history, _user("q2")))
        assert len(driver.opened) == 1 and driver.opened[0].turns[-1].messages == (_user("q2"),)
        # another key with the same history: a new conversation, history flattened into the turn
        await _collect(host, _request(*history, _user("q2"), key="other"))
        second = driver.opened[1]
        assert second.setup.history == ()
        [flat] = second.turns[0].messages
        assert "q1" in flat.parts[0].text and "a1" in flat.parts[0].text
        assert host.counts == {"hits": 1, "misses": 1, "rebuilds": 1}
        await host.aclose()
        assert all(c.closed for c in driver.opened)

    run(go())


def test_least_recently_used_idle_conversation_is_closed_for_a_new_one():
    async def go() -> None:
        driver = ScriptedDriver([_said("x"), _said("y"), _said("z")])
        host = _host(driver, max_conversations=2)
        await host.start()
        for text in ("one", "two", "three"):
            await _collect(host, _request(_user(text)))
        assert [c.closed for c in driver.opened] == [True, False, False]
        assert (await host.status())["conversations"] == 2
        await host.aclose()

    run(go())


def test_held_tool_call_is_answered_by_the_next_request_or_released():
    async def go() -> None:
        call = [PendingToolCall("c1", "get_weather", '{"city":"Paris"}'), ToolsPending()]
        driver = ScriptedDriver([call, _said("sunny it is"), call])
        host = _host(driver, tool_timeout=0.05)
        await host.start()
        events = await _collect(host, _request(_user("weather?")))
        assert ToolCallStart(0, "c1", "get_weather") in events and ToolCallEnd(0) in events
        assert events[-1] == Finish("tool_calls")
        assert (await host.status())["held_tool_calls"] == 1
        history = (_user("weather?"), Message("assistant", (
            ToolCallPart("c1", "get_weather", '{"city": "Paris"}'),)))
        result = Message("user", (ToolResultPart("c1", (TextPart("21C"),)),))
        events = await _collect(host, _request(*history, result))
        assert TextDelta("sunny it is") in events
        assert driver.opened[0].answers == [ToolAnswer("c1", "21C")]
        # a client that never comes back: released after tool_timeout
        await _collect(host, _request(_user("again?")))
        await asyncio.sleep(0.2)
        assert driver.opened[1].closed and (await host.status())["conversations"] == 1
        await host.aclose()

    run(go())


@pytest.mark.parametrize("ending, error, code", [
    ([TurnFailed("upstream", "boom")], UpstreamUnavailable, None),
    ([LoginRequired("401")], UpstreamUnavailable, "login_required"),
    ([TurnFailed("rate_limit", "429", 429)], Overloaded, "rate_limited"),
])
def test_failures_close_the_conversation_and_raise_before_any_event(ending, error, code):
    async def go() -> None:
        driver = ScriptedDriver([ending])
        host = _host(driver)
        await host.start()
        events = []
        with pytest.raises(error) as info:
            async for event in host.answer(_request(_user("hi"))):
                events.append(event)
        assert events == []  # nothing reached the client: the gateway may retry elsewhere
        assert info.value.code == code and driver.opened[0].closed
        assert driver.interrupts == 1
        if code == "login_required":
            assert (await host.status())["login"] == "logged_out"
            with pytest.raises(UpstreamUnavailable):
                await _collect(host, _request(_user("again")))
        await host.aclose()

    run(go())


def test_a_request_that_does_not_end_with_a_user_turn_is_refused():
    async def go() -> None:
        host = _host(ScriptedDriver([]))
        await host.start()
        with pytest.raises(BadRequest) as info:
            await _collect(host, _request(_user("q"), Message("assistant", (TextPart("pre"),))))
        assert info.value.param == "messages"
        await host.aclose()

    run(go())


_RAN = ExecutedTool("t1", "Read", '{"file_path":"a","limit":2}', "contents", False, "scripted")


@pytest.mark.parametrize("dialect_history", ["blocks", "text"])
def test_executed_tools_are_events_and_their_history_continues_the_conversation(
        dialect_history):
    async def go() -> None:
        driver = ScriptedDriver([
            [TextChunk("look "), ToolExecuted("t1", "Read", '{"limit": 2, "file_path": "a"}'),
             ToolExecuted("t2", "Bash", '{"cmd": "x"}'), ToolOutput("t1", "contents"),
             TextChunk("done"), TurnFinished()],
            _said("next")])
        host = _host(driver)
        await host.start()
        events = await _collect(host, _request(_user("q1")))
        # arguments as canonical JSON, so that every dialect shows the same text
        unanswered = ExecutedTool("t2", "Bash", '{"cmd":"x"}', "", False, "scripted")
        assert events == [Start(model="m"), TextDelta("look "), _RAN, TextDelta("done"),
                          unanswered, Usage(0, 0), Finish("stop")]
        parts = [TextPart("look "),
                 ExecutedToolPart("t1", "Read", '{"file_path":"a","limit":2}', "contents", False,
                                  "claude"),
                 TextPart("done"), ExecutedToolPart("t2", "Bash", '{"cmd":"x"}', "", False)]
        if dialect_history == "text":  # a chat-completions client sends the rendering back
            parts = [TextPart("look " + executed_text(_RAN) + "done" + executed_text(unanswered))]
        await _collect(host, _request(_user("q1"), Message("assistant", tuple(parts)),
                                      _user("q2")))
        assert len(driver.opened) == 1 and driver.opened[0].turns[-1].messages == (_user("q2"),)
        assert host.counts == {"hits": 1, "misses": 1, "rebuilds": 0}
        await host.aclose()

    run(go())


def test_a_logged_out_account_is_ready_again_only_with_changed_credentials():
    async def go() -> None:
        driver = ScriptedDriver([[LoginRequired("401")]])
        driver.login = CliHealth(login="ready", detail={"credentials": "old"})
        host = _host(driver)
        await host.start()
        host.health = driver.login
        with pytest.raises(UpstreamUnavailable):
            await _collect(host, _request(_user("hi")))
        await host.recheck_login()  # the same credentials the CLI just refused
        assert (await host.status())["login"] == "logged_out"
        driver.login = CliHealth(login="logged_out", detail={"credentials": None})
        await host.recheck_login()
        assert (await host.status())["login"] == "logged_out"
        driver.login = CliHealth(login="ready", detail={"credentials": "new"}, account="me")
        await host.recheck_login()
        status = await host.status()
        assert (status["login"], status["account"]) == ("ready", "me")
        await host.aclose()

    run(go())


class SlowToDie(ScriptedConversation):
    """A conversation whose process takes a while to be killed and reaped."""

    async def close(self) -> None:
        await self.driver.reaped.wait()
        self.closed = True


class SlowDriver(ScriptedDriver):
    def __init__(self, script: list[list]) -> None:
        super().__init__(script)
        self.reaped = asyncio.Event()
        self.peak = 0  # most conversations not yet closed at one time

    async def open(self, setup: ConversationSetup) -> ScriptedConversation:
        await asyncio.sleep(0.01)  # spawning takes time: concurrent first turns overlap here
        conv = SlowToDie(self, setup)
        self.opened.append(conv)
        self.peak = max(self.peak, sum(not c.closed for c in self.opened))
        return conv


def test_a_dying_conversation_keeps_its_room_until_it_is_dead():
    async def go() -> None:
        driver = SlowDriver([[TurnFailed("upstream", "boom")], _said("next")])
        host = _host(driver, max_conversations=1)
        await host.start()
        first = asyncio.ensure_future(_collect(host, _request(_user("fails"))))
        await asyncio.sleep(0.05)  # it failed; its process is being killed
        second = asyncio.ensure_future(_collect(host, _request(_user("new"))))
        await asyncio.sleep(0.05)
        assert len(driver.opened) == 1 and not second.done()  # waits for the room
        driver.reaped.set()
        with pytest.raises(UpstreamUnavailable):
            await first
        assert (await second)[1] == TextDelta("next")
        assert driver.peak == 1
        await host.aclose()

    async def main() -> None:
        async with asyncio.timeout(5):
            await go()

    run(main())


def test_concurrent_first_turns_never_open_more_than_max_conversations():
    async def go() -> None:
        driver = SlowDriver([_said(str(i)) for i in range(8)])
        driver.reaped.set()
        host = _host(driver, max_conversations=4)
        await host.start()
        results = await asyncio.gather(*(_collect(host, _request(_user(f"q{i}")))
                                         for i in range(8)), return_exceptions=True)
        served = [r for r in results if isinstance(r, list)]
        refused = [r for r in results if isinstance(r, Overloaded)]
        assert len(served) + len(refused) == 8 and served
        assert driver.peak <= 4, driver.peak
        assert (await host.status())["conversations"] <= 4
        await host.aclose()

    run(go())
