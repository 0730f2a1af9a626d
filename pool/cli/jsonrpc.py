"""The generic ``jsonrpc`` driver: an agent speaking JSON-RPC 2.0 over stdio.

One agent process per account, one agent session per conversation, several
sessions streaming at once (``concurrent_turns``). The method names and the
JSON paths of text, stop reason and usage come from the worker's
``[workers.cli_options]`` (:class:`~pool.cli.jsonrpc_options.JsonRpcOptions`),
with the Agent Client Protocol's as defaults:

``initialize`` → ``session/new {cwd, mcpServers}`` → ``{sessionId}``;
``session/prompt {sessionId, prompt: [blocks]}`` while the agent streams
``session/update`` notifications (``agent_message_chunk`` text) and finally
answers ``{stopReason}``; ``session/cancel`` (a notification) stops a prompt.

The agent has no system prompt of its own here: in chat mode the
conversation's system prompt goes first in its first prompt. A JSON-RPC error
whose code is ``auth_error_code`` (ACP: -32000 "Authentication required")
means the account is logged out. When the agent process dies every running
prompt fails, and the next ``open`` starts a new process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import weakref
from typing import Any, AsyncIterator, Mapping, Sequence

import structlog

from .content import dig, turn_blocks
from .driver import DriverConfig, DriverError
from .scrub import account_secrets
from .events import (
    CliEvent, CliHealth, ConversationSetup, LoginRequired, SessionStarted, TextChunk,
    ThinkingChunk, ToolAnswer, ToolExecuted, ToolOutput, Turn, TurnFailed, TurnFinished, TurnUsage,
)
from .jsonrpc_agent import EOF, OVERFLOW, Agent, RpcError
from .jsonrpc_options import JsonRpcOptions
from .proc import JsonLineProcess
from .turns import guarded

__all__ = ["JsonRpcDriver", "JsonRpcConversation", "RpcError"]

log = structlog.get_logger("pool.cli.jsonrpc")

_STOP_REASONS = {"end_turn": "end_turn", "stop": "end_turn", "completed": "end_turn",
                 "max_turn_requests": "end_turn", "max_tokens": "max_tokens",
                 "length": "max_tokens", "refusal": "refusal", "stop_sequence": "stop_sequence"}
_CANCELLED = {"cancelled", "canceled", "interrupted", "aborted"}


def _usage(raw: Any) -> TurnUsage | None:
    if not isinstance(raw, Mapping):
        return None

    def pick(*names: str) -> int | None:
        for name in names:
            if isinstance(raw.get(name), int):
                return int(raw[name])
        return None

    return TurnUsage(input_tokens=pick("inputTokens", "input_tokens", "prompt_tokens"),
                     output_tokens=pick("outputTokens", "output_tokens", "completion_tokens"),
                     cached_tokens=pick("cachedReadTokens", "cached_tokens",
                                        "cache_read_input_tokens"))


def _sum(usages: list[TurnUsage]) -> TurnUsage | None:
    if not usages:
        return None

    def total(field: str) -> int | None:
        values = [getattr(u, field) for u in usages if getattr(u, field) is not None]
        return sum(values) if values else None

    return TurnUsage(input_tokens=total("input_tokens"), output_tokens=total("output_tokens"),
                     cached_tokens=total("cached_tokens"))


class JsonRpcDriver:
    """A JSON-RPC agent for one account; ``command`` is required."""

    cli = "jsonrpc"
    can_load_history = False
    concurrent_turns = True

    def __init__(self, config: DriverConfig) -> None:
        if not config.command:
            raise DriverError("command: the jsonrpc driver needs the agent's command")
        self.config = config
        self.options = JsonRpcOptions.parse(config.options)
        self.version: str | None = None
        self.agent_name: str | None = None
        self.logged_out_reason: str | None = None
        self._agent: Agent | None = None
        self._spare: tuple[Agent, str] | None = None  # a session opened by start()
        self._lock = asyncio.Lock()
        self._conversations: weakref.WeakSet[JsonRpcConversation] = weakref.WeakSet()
        self._ending: set[asyncio.Future[None]] = set()  # end_session of orphaned sessions

    def end_later(self, agent: Agent, session_id: str) -> None:
        """End an agent session no conversation holds, in a task of its own (the
        request that opened it may be cancelled): the agent keeps no stray sessions."""
        agent.sessions.pop(session_id, None)
        if self.options.end_session and agent.running:
            task = asyncio.ensure_future(self._end(agent, session_id))
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

    async def _end(self, agent: Agent, session_id: str) -> None:
        assert self.options.end_session is not None
        with contextlib.suppress(RpcError, asyncio.TimeoutError):
            await agent.call(self.options.end_session, {self.options.session_field: session_id},
                             timeout=2.0)

    def env(self) -> dict[str, str]:
        return {**self.config.env, "HOME": self.config.home}

    async def _ensure_agent(self) -> Agent:
        async with self._lock:
            if self._agent is not None and self._agent.running:
                return self._agent
            if self._agent is not None:
                await self._agent.proc.close(grace=0.5)
            env, cwd = self.env(), self.config.workspace_root or self.config.cwd
            if self.config.mode != "agent":
                cwd = self.config.cwd
            # one process serves every key: its sandbox shows all of this account's workspaces
            argv = self.config.sandboxed(self.config.command or (), cwd=cwd, env=env)
            proc = await JsonLineProcess.spawn(argv, env=env, cwd=cwd, label="jsonrpc agent",
                                               secrets=lambda: account_secrets(
                                                   self.config.home, self.config.env))
            agent = Agent(proc, self.options, self.config.mode)
            if self.options.initialize:
                try:
                    info = await agent.call(self.options.initialize, self.options.initialize_params)
                except (RpcError, asyncio.TimeoutError) as exc:
                    await proc.close(grace=0.5)
                    raise DriverError(f"jsonrpc: {self.options.initialize} failed: {exc}; "
                                      f"{proc.why_exited()}") from None
                agent_info = info.get("agentInfo") if isinstance(info, Mapping) else None
                if isinstance(agent_info, Mapping):
                    self.agent_name = agent_info.get("name")
                    self.version = agent_info.get("version")
            self._agent = agent
            log.info("cli.jsonrpc.started", worker=self.config.name, pid=proc.pid,
                     agent=self.agent_name, version=self.version)
            return agent

    async def start(self) -> CliHealth:
        """Start the agent and open one session: that tells whether the account
        is logged in before any request, and the first conversation takes it."""
        agent = await self._ensure_agent()
        try:
            self._spare = (agent, await agent.new_session(self.config.cwd))
        except RpcError as exc:
            if exc.code == self.options.auth_error_code:
                self.logged_out_reason = f"jsonrpc: {exc}"
            else:
                log.warning("cli.jsonrpc_session_failed", worker=self.config.name, error=str(exc))
        except (asyncio.TimeoutError, ValueError) as exc:
            log.warning("cli.jsonrpc_session_failed", worker=self.config.name, error=repr(exc))
        return await self.health()

    async def health(self) -> CliHealth:
        running = self._agent is not None and self._agent.running
        detail: dict[str, Any] = {"agent": self.agent_name, "running": running,
                                  "conversations": sum(1 for c in self._conversations if c.alive)}
        if self.logged_out_reason:
            detail["reason"] = self.logged_out_reason
        return CliHealth(login="logged_out" if self.logged_out_reason else "ready",
                         version=self.version, detail=detail)

    async def open(self, setup: ConversationSetup) -> JsonRpcConversation:
        agent = await self._ensure_agent()
        conversation = JsonRpcConversation(self, agent, setup)
        spare, self._spare = self._spare, None
        if spare is not None and spare[0] is agent and setup.workspace in (None, self.config.cwd):
            conversation.adopt(spare[1])
        self._conversations.add(conversation)
        return conversation

    async def stop(self) -> None:
        await asyncio.gather(*(c.close() for c in list(self._conversations)),
                             return_exceptions=True)
        if self._agent is not None:
            await self._agent.proc.close()

    def note_terminal(self, event: CliEvent) -> None:
        if isinstance(event, LoginRequired):
            self.logged_out_reason = event.message
        elif isinstance(event, TurnFinished):
            self.logged_out_reason = None


class JsonRpcConversation:
    """One agent session; its session is created on the first turn."""

    def __init__(self, driver: JsonRpcDriver, agent: Agent, setup: ConversationSetup) -> None:
        self.driver = driver
        self.agent = agent
        self.o = driver.options
        self.setup = setup
        self._session_id: str | None = None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._closed = False
        self._interrupted = False
        self._turns = 0
        self._notified: list[TurnUsage] = []  # usage the agent put in notifications

    @property
    def session_id(self) -> str | None:
        return self._session_id

    @property
    def alive(self) -> bool:
        return (not self._closed and self.agent.running and
                (self._session_id is None or self._session_id in self.agent.sessions))

    def _failure(self, exc: RpcError) -> CliEvent:
        if exc.code == self.o.auth_error_code:
            return LoginRequired(f"jsonrpc: {exc}")
        if exc.code is None:  # the process went away
            return TurnFailed("upstream", f"jsonrpc: {exc}; {self.agent.proc.why_exited()}")
        return TurnFailed("upstream", f"jsonrpc: {exc} (code {exc.code})")

    def adopt(self, session_id: str) -> None:
        """Use an agent session opened already; its notifications come here."""
        self._session_id = session_id
        self.agent.sessions[session_id] = self._queue

    async def _start_session(self) -> CliEvent:
        # shielded: a request cancelled meanwhile still learns the session, to end it
        starting = asyncio.ensure_future(
            self.agent.new_session(self.setup.workspace or self.driver.config.cwd))
        try:
            session_id = await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(self._orphaned)
            raise
        except RpcError as exc:
            return self._failure(exc)
        except asyncio.TimeoutError:
            return TurnFailed("timeout", f"jsonrpc: no answer to {self.o.start_session}")
        except ValueError as exc:
            return TurnFailed("upstream", f"jsonrpc: {exc}")
        if self._closed:  # closed while the agent opened it
            self.driver.end_later(self.agent, session_id)
            return TurnFailed("interrupted", "jsonrpc: the conversation was closed")
        self.adopt(session_id)
        return SessionStarted(self._session_id or "", self.setup.model)

    def _orphaned(self, starting: asyncio.Future[str]) -> None:
        if not starting.cancelled() and starting.exception() is None:
            self.driver.end_later(self.agent, starting.result())

    def _prompt_blocks(self, turn: Turn) -> list[dict[str, Any]]:
        blocks = turn_blocks(turn)
        if self._turns == 0 and self.setup.system and self.driver.config.mode == "chat":
            blocks.insert(0, {"type": "text", "text": self.setup.system})
        self._turns += 1
        return blocks

    def _update(self, params: Mapping[str, Any]) -> CliEvent | None:
        usage = _usage(dig(params, self.o.update_usage_path))
        if usage is not None:
            self._notified.append(usage)
        kind = dig(params, self.o.update_kind_path)
        if kind == self.o.text_kind:
            text = dig(params, self.o.text_path)
            return TextChunk(str(text)) if text else None
        if self.o.thinking_kind and kind == self.o.thinking_kind:
            text = dig(params, self.o.thinking_path)
            return ThinkingChunk(str(text)) if text else None
        update = params.get("update") if isinstance(params.get("update"), Mapping) else params
        if self.o.tool_call_kind and kind == self.o.tool_call_kind:
            return ToolExecuted(str(update.get("toolCallId")), str(update.get("title") or "tool"),
                                json.dumps(update.get("rawInput") or {}))
        if self.o.tool_update_kind and kind == self.o.tool_update_kind and \
                update.get("status") in ("completed", "failed"):
            content = update.get("content") or []
            text = "\n".join(str(dig(c, "content.text") or "") for c in content
                             if isinstance(c, Mapping))
            return ToolOutput(str(update.get("toolCallId")), text, update.get("status") == "failed")
        return None

    def _finish(self, result: Any) -> list[CliEvent]:
        stop = dig(result, self.o.stop_reason_path)
        if self._interrupted or stop in _CANCELLED:
            return [TurnFailed("interrupted", "jsonrpc: cancelled")]
        events: list[CliEvent] = []
        usage = _usage(dig(result, self.o.usage_path)) or _sum(self._notified)
        if usage is not None:
            events.append(usage)
        events.append(TurnFinished(_STOP_REASONS.get(str(stop), "end_turn")))  # type: ignore[arg-type]
        return events

    async def send(self, turn: Turn) -> AsyncIterator[CliEvent]:
        async for event in guarded(self._run(turn), on_terminal=self.driver.note_terminal,
                                   on_abandon=self.interrupt):
            yield event

    async def _run(self, turn: Turn) -> AsyncIterator[CliEvent]:
        if not self.alive:
            yield TurnFailed("upstream", "jsonrpc: the agent is not running")
            return
        self._interrupted = False
        self._notified = []
        if self._session_id is None:
            started = await self._start_session()
            yield started
            if not isinstance(started, SessionStarted):
                return
        elif self._turns == 0:
            yield SessionStarted(self._session_id, self.setup.model)
        while not self._queue.empty():  # late updates of an earlier, cancelled prompt
            self._queue.get_nowait()
        params = {self.o.session_field: self._session_id,
                  self.o.prompt_field: self._prompt_blocks(turn)}
        reply = self.agent.call_nowait(self.o.send_prompt, params)
        reply.add_done_callback(self._replied)
        async for event in self._pump(reply):
            yield event

    async def _pump(self, reply: asyncio.Future[Any]) -> AsyncIterator[CliEvent]:
        """The prompt's updates, to its reply (or a failure)."""
        idle = self.driver.config.idle_timeout
        while True:
            try:
                async with asyncio.timeout(idle):
                    item = await self._queue.get()
            except TimeoutError:
                yield await self._stalled(idle)
                return
            events, done = await self._consume(item, reply)
            for event in events:
                yield event
            if done:
                return

    async def _stalled(self, idle: float) -> CliEvent:
        log.warning("cli.jsonrpc_stalled", session=self._session_id, seconds=idle)
        await self.interrupt()
        return TurnFailed("timeout", f"jsonrpc: the agent said nothing for {idle:g} s")

    async def _consume(self, item: Any, reply: asyncio.Future[Any]) -> tuple[list[CliEvent], bool]:
        """What one item of the session's queue means: its events, and whether
        the prompt is over."""
        if item is reply:
            try:
                result = reply.result()
            except RpcError as exc:
                return [self._failure(exc)], True
            return self._finish(result), True
        if item is OVERFLOW:
            await self.interrupt()
            return [TurnFailed("upstream", "jsonrpc: the agent sent more updates than were "
                               "read; the conversation is closed")], True
        if item is EOF:
            await self.agent.proc.proc.wait()
            return [TurnFailed("upstream", f"{self.agent.proc.why_exited()} during the turn")], True
        if isinstance(item, Mapping) and (event := self._update(item)) is not None:
            return [event], False
        return [], False

    def _replied(self, reply: asyncio.Future[Any]) -> None:
        if not reply.cancelled():
            reply.exception()  # retrieved here; raised again where the queue yields it
        self._queue.put_nowait(reply)

    async def answer_tools(self, answers: Sequence[ToolAnswer]) -> AsyncIterator[CliEvent]:
        yield TurnFailed("invalid_request", "jsonrpc: no tool call is held")

    async def interrupt(self) -> None:
        self._interrupted = True
        if self.o.cancel and self._session_id is not None and self.agent.running:
            self.agent.notify(self.o.cancel, {self.o.session_field: self._session_id})

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._session_id is None:
            return
        self.agent.sessions.pop(self._session_id, None)
        if self.o.end_session and self.agent.running:
            with contextlib.suppress(RpcError, asyncio.TimeoutError):
                await self.agent.call(self.o.end_session, {self.o.session_field: self._session_id},
                                      timeout=2.0)
