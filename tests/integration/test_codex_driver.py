"""The Codex driver against a codex app-server and a fake Responses upstream.

Every test runs on the fake app-server (``tests/fakes/codex_app_server.py``)
and, under the ``cli`` marker, on the real Codex 0.169.0 binary from npm with
an API-key ``auth.json`` and a custom provider pointed at the same fake
upstream. No gateway here: this is the driver contract itself (see
``test_codex_workers.py`` for the gateway with the SDKs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import tempfile
import signal
import time
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest

from pool.cli.codex import CodexDriver
from pool.cli.driver import DriverConfig, DriverError
from pool.cli.events import (
    CliEvent, ConversationSetup, LoginRequired, PendingToolCall, RateLimited, SessionStarted,
    TextChunk, ThinkingChunk, ToolAnswer, ToolExecuted, ToolOutput, ToolsPending, Turn,
    TurnFailed, TurnFinished, TurnUsage,
)
from pool.model import Message, TextPart, Tool, ToolCallPart, ToolResultPart
from tests.fakes.responses_upstream import ResponsesUpstream
from tests.integration.clis import CODEX, PINNED_VERSIONS, ensure_cli

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-codex-account-a"
MODEL = "gpt-5-codex"
WEATHER = Tool(name="get_weather", description="The weather in a city",
               parameters={"type": "object", "properties": {"city": {"type": "string"}}})
DEADLINE = 60  # hang detection only


def fake_command() -> tuple[str, ...]:
    return (sys.executable, "-m", "tests.fakes.codex_app_server")


def real_command() -> tuple[str, ...]:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install the Codex CLI")
    path = ensure_cli(*CODEX)
    assert path is not None
    return (path,)  # the node shim: the driver must find the native binary itself


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.cli)])
def codex_command(request: pytest.FixtureRequest) -> tuple[str, ...]:
    return fake_command() if request.param == "fake" else real_command()


@pytest.fixture
def upstream() -> Iterator[ResponsesUpstream]:
    with ResponsesUpstream(api_key=KEY, models=(MODEL,)) as fake:
        yield fake


def provider_options(upstream: ResponsesUpstream) -> dict:
    """A custom Responses provider at the fake upstream, key from auth.json."""
    return {"config": {
        "model_providers.fake.name": "fake", "model_providers.fake.base_url": upstream.url,
        "model_providers.fake.wire_api": "responses",
        "model_providers.fake.requires_openai_auth": True, "model_provider": "fake"}}


def account_home(root: Path, key: str | None) -> Path:
    home = root / "codex-home"
    home.mkdir(parents=True, exist_ok=True)
    if key is not None:
        (home / "auth.json").write_text(json.dumps({"auth_mode": "apikey", "OPENAI_API_KEY": key}))
    return home


def driver_config(home: Path, command: tuple[str, ...], upstream: ResponsesUpstream,
                  **kw: object) -> DriverConfig:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home.parent),
           "PYTHONPATH": str(REPO), "NO_PROXY": "127.0.0.1",
           # the real binary must not reach anything but loopback
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    return DriverConfig(name="codex-a", cli="codex", home=str(home), cwd=str(home.parent / "cwd"),
                        command=command, env=env, options=provider_options(upstream), **kw)


@pytest.fixture
async def driver(tmp_path: Path, codex_command: tuple[str, ...],
                 upstream: ResponsesUpstream) -> AsyncIterator[CodexDriver]:
    codex = CodexDriver(driver_config(account_home(tmp_path, KEY), codex_command, upstream))
    health = await codex.start()
    assert health.login == "ready" and health.version == PINNED_VERSIONS["@openai/codex"]
    yield codex
    await codex.stop()


def user(text: str) -> Turn:
    return Turn((Message("user", (TextPart(text),)),))


async def collect(events: AsyncIterator[CliEvent]) -> list[CliEvent]:
    async def run() -> list[CliEvent]:
        return [e async for e in events]
    return await asyncio.wait_for(run(), DEADLINE)


def text_of(events: Sequence[CliEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextChunk))


def input_of(upstream: ResponsesUpstream, n: int = -1) -> list[tuple[str, str | None, str]]:
    """(type, role, text) of each input item of the n-th upstream request."""
    out = []
    for item in upstream.responses[n].body["input"]:
        content = item.get("content") or []
        text = "".join(c.get("text", "") for c in content) if isinstance(content, list) else ""
        out.append((item["type"], item.get("role"), text or str(item.get("output", ""))))
    return out


async def waiting_turn(conv, upstream: ResponsesUpstream,
                       events: list[CliEvent]) -> asyncio.Task[None]:
    """Start a turn the upstream holds for 30 s; return once the upstream has it."""
    async def run() -> None:
        async for event in conv.send(user("wait [[sleep:30]]")):
            events.append(event)

    seen = len(upstream.responses)
    task = asyncio.create_task(run())
    while len(upstream.responses) == seen:
        await asyncio.sleep(0.01)
    return task


async def test_chat_turn_sends_only_the_system_prompt_and_the_turn(
        driver: CodexDriver, upstream: ResponsesUpstream) -> None:
    conv = await driver.open(ConversationSetup(model=MODEL, system="Answer briefly."))
    events = await collect(conv.send(user("hello there")))

    assert isinstance(events[0], SessionStarted) and events[0].session_id == conv.session_id
    assert text_of(events) == "echo: hello there"
    usage, finish = events[-2:]
    assert isinstance(usage, TurnUsage) and usage.input_tokens and usage.output_tokens == 3
    assert finish == TurnFinished("end_turn")
    # chat mode: no agent prompt, skills, permissions or environment context
    assert input_of(upstream) == [("message", "developer", "Answer briefly."),
                                  ("message", "user", "hello there")]
    (request,) = upstream.responses
    assert [t["name"] for t in request.body["tools"]] in ([], ["request_user_input"])
    assert request.headers["authorization"] == f"Bearer {KEY}"


async def test_second_turn_continues_the_thread(driver: CodexDriver,
                                                upstream: ResponsesUpstream) -> None:
    conv = await driver.open(ConversationSetup(model=MODEL, system="S"))
    await collect(conv.send(user("one")))
    events = await collect(conv.send(user("two")))

    assert text_of(events) == "echo: two" and not isinstance(events[0], SessionStarted)
    assert [t for _, _, t in input_of(upstream)] == ["S", "one", "echo: one", "two"]


async def test_history_is_rebuilt_into_a_new_thread(driver: CodexDriver,
                                                    upstream: ResponsesUpstream) -> None:
    history = (
        Message("user", (TextPart("weather in Rome?"),)),
        Message("assistant", (ToolCallPart("call_r", "get_weather", '{"city":"Rome"}'),)),
        Message("user", (ToolResultPart("call_r", (TextPart("Rainy"),)),)),
        Message("assistant", (TextPart("It rains in Rome."),)),
    )
    conv = await driver.open(ConversationSetup(model=MODEL, system="S", tools=(WEATHER,),
                                               history=history))
    events = await collect(conv.send(user("and now?")))

    assert text_of(events) == "echo: and now?"
    assert input_of(upstream) == [
        ("message", "developer", "S"), ("message", "user", "weather in Rome?"),
        ("function_call", None, ""), ("function_call_output", None, "Rainy"),
        ("message", "assistant", "It rains in Rome."), ("message", "user", "and now?")]
    call = upstream.responses[0].body["input"][2]
    assert (call["name"], call["call_id"], call["arguments"]) == (
        "get_weather", "call_r", '{"city":"Rome"}')


async def test_parallel_client_tool_calls_are_held_until_answered(
        driver: CodexDriver, upstream: ResponsesUpstream) -> None:
    conv = await driver.open(ConversationSetup(model=MODEL, system="S", tools=(WEATHER,)))
    prompt = 'w [[tools:get_weather {"city": "Paris"} get_weather {"city": "Oslo"}]]'
    first = await collect(conv.send(user(prompt)))

    calls = [e for e in first if isinstance(e, PendingToolCall)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    assert isinstance(first[-1], ToolsPending)
    assert len(upstream.responses) == 1  # Codex waits: nothing went upstream yet

    rest = await collect(conv.answer_tools([ToolAnswer(calls[0].call_id, "Sunny"),
                                            ToolAnswer(calls[1].call_id, "Snow")]))
    assert text_of(rest) == "tool said: Snow" and isinstance(rest[-1], TurnFinished)
    outputs = [(t, o) for t, _, o in input_of(upstream) if t == "function_call_output"]
    assert outputs == [("function_call_output", "Sunny"), ("function_call_output", "Snow")]


async def test_threads_run_turns_at_the_same_time(driver: CodexDriver,
                                                  upstream: ResponsesUpstream) -> None:
    slow = await driver.open(ConversationSetup(model=MODEL, system="S"))
    fast = await driver.open(ConversationSetup(model=MODEL, system="S"))
    slow_events: list[CliEvent] = []
    task = await waiting_turn(slow, upstream, slow_events)
    # one process, a second thread: answered while the first one is still waiting
    events = await collect(fast.send(user("quick")))
    assert text_of(events) == "echo: quick" and not task.done()
    await slow.interrupt()
    await asyncio.wait_for(task, DEADLINE)
    assert slow_events[-1] == TurnFailed("interrupted", "the turn was interrupted")


async def test_interrupt_ends_the_turn_and_frees_the_upstream(
        driver: CodexDriver, upstream: ResponsesUpstream) -> None:
    conv = await driver.open(ConversationSetup(model=MODEL, system="S"))
    events: list[CliEvent] = []
    task = await waiting_turn(conv, upstream, events)
    await conv.interrupt()
    await asyncio.wait_for(task, DEADLINE)
    assert isinstance(events[-1], TurnFailed) and events[-1].kind == "interrupted"
    assert await upstream.wait_disconnects(1, timeout=DEADLINE)
    await conv.close()
    again = await driver.open(ConversationSetup(model=MODEL, system="S"))
    assert text_of(await collect(again.send(user("after")))) == "echo: after"


async def test_interrupt_while_tools_are_held(driver: CodexDriver,
                                             upstream: ResponsesUpstream) -> None:
    conv = await driver.open(ConversationSetup(model=MODEL, system="S", tools=(WEATHER,)))
    first = await collect(conv.send(user('w [[tool:get_weather {"city": "Oslo"}]]')))
    assert isinstance(first[-1], ToolsPending)
    await conv.interrupt()
    await conv.close()
    assert not conv.alive
    assert (await driver.health()).detail["conversations"] == 0


async def test_upstream_401_is_login_required_at_the_first_failure(
        tmp_path: Path, codex_command: tuple[str, ...], upstream: ResponsesUpstream) -> None:
    codex = CodexDriver(driver_config(account_home(tmp_path, "sk-revoked"), codex_command,
                                      upstream))
    try:
        assert (await codex.start()).login == "ready"  # a key is there: only a turn can tell
        conv = await codex.open(ConversationSetup(model=MODEL, system="S"))
        events = await collect(conv.send(user("hi")))
        assert isinstance(events[-1], LoginRequired) and "401" in events[-1].message
        # Codex would have retried five more times; the turn was stopped at the first
        assert len(upstream.responses) <= 2
    finally:
        await codex.stop()


async def test_no_credentials_is_logged_out(tmp_path: Path, codex_command: tuple[str, ...],
                                            upstream: ResponsesUpstream) -> None:
    codex = CodexDriver(driver_config(account_home(tmp_path, None), codex_command, upstream))
    try:
        health = await codex.start()
        assert health.login == "logged_out" and health.account is None
    finally:
        await codex.stop()


async def test_rate_limit_is_reported_at_the_first_429(driver: CodexDriver,
                                                       upstream: ResponsesUpstream) -> None:
    conv = await driver.open(ConversationSetup(model=MODEL, system="S"))
    events = await collect(conv.send(user("x [[error:429]]")))

    assert isinstance(events[-2], RateLimited)
    assert events[-1] == TurnFailed("overloaded", events[-2].message, 429)
    assert len(upstream.responses) <= 2  # not Codex's five retries 3 s apart


async def test_killed_app_server_fails_the_turn_and_the_health_check(
        driver: CodexDriver, upstream: ResponsesUpstream) -> None:
    conv = await driver.open(ConversationSetup(model=MODEL, system="S"))
    events: list[CliEvent] = []
    task = await waiting_turn(conv, upstream, events)
    assert driver.pid is not None
    os.kill(driver.pid, signal.SIGKILL)
    await asyncio.wait_for(task, DEADLINE)
    assert events[-1] == TurnFailed("upstream", "the codex app-server exited during the turn")
    assert not conv.alive
    with pytest.raises(DriverError, match="exited"):
        await driver.health()


@pytest.fixture
async def fake_codex(tmp_path: Path,
                     upstream: ResponsesUpstream) -> AsyncIterator[tuple[CodexDriver, Path]]:
    """The fake app-server alone, with its home (where the fault switch lives)."""
    home = account_home(tmp_path, KEY)
    codex = CodexDriver(driver_config(home, fake_command(), upstream))
    await codex.start()
    yield codex, home
    await codex.stop()


async def test_crash_switch_of_the_fake_mid_turn(fake_codex: tuple[CodexDriver, Path]) -> None:
    codex, home = fake_codex
    conv = await codex.open(ConversationSetup(model=MODEL, system="S"))
    (home / "fault").write_text("crash")
    events = await collect(conv.send(user("three words here")))
    assert text_of(events) == "echo: "  # one delta, then the process died
    assert isinstance(events[-1], TurnFailed) and events[-1].kind == "upstream"


async def test_bad_options_and_missing_binary_are_driver_errors(tmp_path: Path) -> None:
    home = account_home(tmp_path, KEY)
    with pytest.raises(DriverError, match="cli_options.sandbox"):
        CodexDriver(DriverConfig(name="x", cli="codex", home=str(home), cwd=str(tmp_path),
                                 options={"sandbox": "x"}))
    with pytest.raises(DriverError, match="cli_options.colour"):
        CodexDriver(DriverConfig(name="x", cli="codex", home=str(home), cwd=str(tmp_path),
                                 options={"colour": 1}))
    missing = CodexDriver(DriverConfig(name="x", cli="codex", home=str(home), cwd=str(tmp_path),
                                       command=("no-such-codex",), env={"PATH": str(tmp_path)}))
    with pytest.raises(DriverError, match="not found"):
        await missing.start()


async def test_usage_limit_reports_when_it_resets(
        fake_codex: tuple[CodexDriver, Path]) -> None:
    codex, home = fake_codex
    conv = await codex.open(ConversationSetup(model=MODEL, system="S"))
    (home / "fault").write_text("usage")
    events = await collect(conv.send(user("hi")))
    limited, failed = events[-2:]
    assert isinstance(limited, RateLimited) and "usage limit" in limited.message
    # "try again at H:MM AM": an hour from now, to the minute
    assert limited.reset_at is not None and 3500 < limited.reset_at - time.time() <= 3600
    assert isinstance(failed, TurnFailed) and failed.status == 429


async def test_a_hung_app_server_is_killed_by_the_watchdog(
        tmp_path: Path, upstream: ResponsesUpstream) -> None:
    home = account_home(tmp_path, KEY)
    config = driver_config(home, fake_command(), upstream)
    codex = CodexDriver(dataclasses.replace(
        config, options={**config.options, "watchdog_seconds": 0.2}))
    exited = asyncio.Event()
    codex.on_process_exit = exited.set
    try:
        await codex.start()
        (home / "fault").write_text("hang")  # the next message it reads wedges it
        await asyncio.wait_for(exited.wait(), DEADLINE)
        assert codex.process is not None and codex.process.proc.returncode == -signal.SIGKILL
    finally:
        await codex.stop()


async def test_a_key_revoked_while_running_is_login_required(
        fake_codex: tuple[CodexDriver, Path], upstream: ResponsesUpstream) -> None:
    codex, home = fake_codex
    conv = await codex.open(ConversationSetup(model=MODEL, system="S"))
    assert text_of(await collect(conv.send(user("fine")))) == "echo: fine"
    (home / "fault").write_text("401")  # the fake's switch: its upstream calls now fail so
    events = await collect(conv.send(user("not any more")))
    assert isinstance(events[-1], LoginRequired) and "401" in events[-1].message
    assert len(upstream.responses) == 1


async def test_a_client_tool_named_like_a_codex_tool_is_offered_under_an_alias(
        driver: CodexDriver, upstream: ResponsesUpstream) -> None:
    shell = Tool(name="exec_command", description="Run a command",
                 parameters={"type": "object", "properties": {"cmd": {"type": "string"}}})
    conv = await driver.open(ConversationSetup(model=MODEL, system="S", tools=(shell, WEATHER)))
    first = await collect(conv.send(user('x [[tool:client_exec_command {"cmd": "ls"}]]')))

    offered = {t["name"] for t in upstream.responses[0].body["tools"]}
    assert {"client_exec_command", "get_weather"} <= offered and "exec_command" not in offered
    (call,) = [e for e in first if isinstance(e, PendingToolCall)]
    assert (call.name, call.arguments) == ("exec_command", '{"cmd":"ls"}')
    rest = await collect(conv.answer_tools([ToolAnswer(call.call_id, "a.txt")]))
    assert text_of(rest) == "tool said: a.txt"


async def test_a_silent_turn_times_out(tmp_path: Path, codex_command: tuple[str, ...],
                                       upstream: ResponsesUpstream) -> None:
    config = driver_config(account_home(tmp_path, KEY), codex_command, upstream)
    codex = CodexDriver(dataclasses.replace(config, idle_timeout=0.5))
    try:
        await codex.start()
        conv = await codex.open(ConversationSetup(model=MODEL, system="S"))
        events = await collect(conv.send(user("wait [[sleep:30]]")))
        assert events[-1] == TurnFailed("timeout", "codex said nothing for 0.5 s")
        assert await upstream.wait_disconnects(1, timeout=DEADLINE)  # interrupted upstream too
    finally:
        await codex.stop()


async def test_parallel_calls_without_raw_events_are_gathered_by_time(
        tmp_path: Path, codex_command: tuple[str, ...], upstream: ResponsesUpstream) -> None:
    """The fallback for a Codex that does not say when a response is complete."""
    config = driver_config(account_home(tmp_path, KEY), codex_command, upstream)
    codex = CodexDriver(dataclasses.replace(config, options={
        **config.options, "raw_events": False, "tool_gather_seconds": 1.0}))
    try:
        await codex.start()
        conv = await codex.open(ConversationSetup(model=MODEL, system="S", tools=(WEATHER,)))
        first = await collect(conv.send(user(
            'w [[tools:get_weather {"city": "Paris"} get_weather {"city": "Oslo"}]]')))
        assert [e.name for e in first if isinstance(e, PendingToolCall)] == ["get_weather"] * 2
        assert isinstance(first[-1], ToolsPending)
    finally:
        await codex.stop()


async def test_reasoning_streams_as_thinking_and_effort_is_passed(
        driver: CodexDriver, upstream: ResponsesUpstream) -> None:
    conv = await driver.open(ConversationSetup(model=MODEL, system="S", effort="low"))
    events = await collect(conv.send(user("ponder [[think]]")))

    thinking = [e for e in events if isinstance(e, ThinkingChunk)]
    assert "".join(e.text for e in thinking) == "Thinking about: ponder"
    assert events.index(thinking[0]) < next(
        i for i, e in enumerate(events) if isinstance(e, TextChunk))
    assert upstream.responses[0].body["reasoning"]["effort"] == "low"


@pytest.mark.cli
async def test_agent_mode_reports_codex_own_tools_as_executed(
        request: pytest.FixtureRequest, upstream: ResponsesUpstream) -> None:
    """Agent mode on the real binary: Codex runs its shell itself; the client
    sees the call and its output, nothing to answer. The home is not under
    /tmp: with a system bubblewrap, Codex makes its sandbox helper only
    outside temporary directories (else every shell tool fails)."""
    root = Path(tempfile.mkdtemp(prefix="poolgate-codex-agent-", dir="/var/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    config = driver_config(account_home(root, KEY), real_command(), upstream)
    codex = CodexDriver(dataclasses.replace(config, mode="agent"))
    Path(config.cwd).mkdir(parents=True)
    (Path(config.cwd) / "hello.txt").write_text("The secret is PEAR.\n")
    try:
        await codex.start()
        conv = await codex.open(ConversationSetup(model=MODEL, system="S"))
        events = await collect(conv.send(user(
            'read it [[tool:exec_command {"cmd": "cat hello.txt"}]]')))
        (ran,) = [e for e in events if isinstance(e, ToolExecuted)]
        (out,) = [e for e in events if isinstance(e, ToolOutput)]
        assert "cat hello.txt" in json.loads(ran.arguments)["command"]
        assert out.call_id == ran.call_id and "PEAR" in out.content and not out.is_error
        assert "PEAR" in text_of(events) and isinstance(events[-1], TurnFinished)
        assert not [e for e in events if isinstance(e, PendingToolCall)]
    finally:
        await codex.stop()
