"""One Qwen Code conversation: its ``qwen`` process, respawned with
``--resume`` after an interrupt (the driver's habits are in :mod:`pool.cli.qwen`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping, Sequence

import structlog

from .content import turn_blocks
from .driver import DriverError
from .events import (
    CliEvent, ConversationSetup, LoginRequired, PendingToolCall, SessionStarted, ToolAnswer,
    ToolsPending, Turn, TurnFailed,
)
from .history import results_message
from .proc import JsonLineProcess
from .prompt_file import PromptFile
from .qwen_events import QwenTurnParser, UsageTotals, is_login_error, refused_continue
from .qwen_launch import CHAT_EXCLUDED_TOOLS
from .qwen_tools import PREFIX, SdkToolServer
from .qwen_transcript import forget_session
from .turns import guarded

if TYPE_CHECKING:
    from .qwen import QwenDriver

__all__ = ["QwenConversation", "DEFAULT_CHAT_SYSTEM", "HANDSHAKE_TIMEOUT"]

log = structlog.get_logger("pool.cli.qwen")

DEFAULT_CHAT_SYSTEM = "You are a helpful assistant."
HANDSHAKE_TIMEOUT = 60.0


class QwenConversation:
    """One ``qwen`` process (respawned with ``--resume`` after an interrupt)."""

    def __init__(self, driver: QwenDriver, setup: ConversationSetup) -> None:
        self.driver = driver
        self.setup = setup
        self.cwd = setup.workspace or driver.config.cwd
        self._proc: JsonLineProcess | None = None
        self._lines: AsyncIterator[dict[str, Any]] | None = None
        self._tools = SdkToolServer(setup.tools) if setup.tools else None
        self._parser: QwenTurnParser | None = None  # of a step that ended at held tool calls
        self._session_id: str | None = None
        self._totals: UsageTotals = {}
        self._closed = False
        self._resumable = True   # false after a crash: the session on disk is suspect
        self._interrupted = False
        self._requests = 0
        self._sessions: set[str] = set()  # every session id it had: deleted on close
        self._prompt: PromptFile | None = None   # the system prompt (QWEN_SYSTEM_MD)
        #: a history ending in tool calls: written at the first turn, with its results
        self.results_first = False
        self._continue_id: str | None = None  # its continue_last_turn request

    @property
    def session_id(self) -> str | None:
        return self._session_id

    def resume_from(self, session_id: str) -> None:
        """Start the process with ``--resume session_id`` (a written transcript)."""
        self._session_id = session_id
        self._sessions.add(session_id)

    async def _read(self, timeout: float) -> dict[str, Any] | None:
        """The CLI's next JSON line; None at EOF. TimeoutError after ``timeout`` s of silence."""
        assert self._lines is not None
        async with asyncio.timeout(timeout):
            return await anext(self._lines, None)

    def _send(self, message: Mapping[str, Any]) -> None:
        assert self._proc is not None
        try:
            self._proc.send(message)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died: the read that follows sees EOF and says why

    def _kill(self) -> None:
        if self._proc is not None and self._proc.running:
            with contextlib.suppress(ProcessLookupError):
                self._proc.proc.kill()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.running else None

    @property
    def alive(self) -> bool:
        if self._closed:
            return False
        if self._proc is None or self._proc.running:
            return True
        return self._resumable and self._session_id is not None

    def argv(self) -> list[str]:
        d = self.driver
        options = ["--include-partial-messages", "--approval-mode", d.approval_mode]
        if d.config.mode == "chat":
            options += ["--exclude-tools", ",".join(CHAT_EXCLUDED_TOOLS)]
        if self._session_id is not None:
            options += ["--resume", self._session_id]
        return d.argv(self.setup.model, *options)

    def env(self) -> dict[str, str]:
        """The driver's environment, plus ``QWEN_SYSTEM_MD`` naming the system prompt's file."""
        env = self.driver.env()
        env.pop("QWEN_SYSTEM_MD", None)
        if self._prompt is not None:
            env["QWEN_SYSTEM_MD"] = self._prompt.path
        return env

    def _control_id(self) -> str:
        self._requests += 1
        return f"pg{self._requests}"

    async def _spawn(self) -> CliEvent | None:
        """Start the process and handshake; a terminal event when that failed."""
        self._interrupted = False
        if self._prompt is None:
            self._prompt = await self.driver.prompts.file_for(
                self.driver.config.mode, self.setup.model, self.setup.system, DEFAULT_CHAT_SYSTEM)
            if self._closed and self._prompt is not None:  # closed while Qwen was asked
                self._prompt.remove()
                return TurnFailed("upstream", "qwen: conversation closed")
        try:
            env = self.env()
            argv = self.driver.config.sandboxed(self.argv(), cwd=self.cwd, env=env)
            proc = await JsonLineProcess.spawn(argv, env=env, cwd=self.cwd, label="qwen",
                                               secrets=self.driver.secrets)
        except DriverError as exc:
            return TurnFailed("upstream", f"qwen: {exc}")
        self._proc, self._lines = proc, proc.lines()
        request_id = self._control_id()
        initialize: dict[str, Any] = {"subtype": "initialize", "hooks": None}
        if self._tools is not None:
            initialize["sdkMcpServers"] = self._tools.initialize_payload()
        self._send({"type": "control_request", "request_id": request_id, "request": initialize})
        initialized = False
        try:
            while (obj := await self._read(HANDSHAKE_TIMEOUT)) is not None:
                if obj.get("type") == "control_response":
                    response = obj.get("response") or {}
                    if response.get("request_id") == request_id:
                        sid = (response.get("response") or {}).get("session_id")
                        self._session_id = str(sid) if sid else self._session_id
                        if sid:
                            self._sessions.add(str(sid))
                        initialized = True
                elif obj.get("type") == "control_request":
                    await self._answer_control(obj)
                elif obj.get("type") == "result" and obj.get("is_error"):
                    return self._startup_failure(obj)
                # with client tools, the first turn waits until Qwen has listed them
                if initialized and (self._tools is None or self._tools.listed):
                    return None
        except TimeoutError:
            self._kill()
            return TurnFailed("timeout", "qwen: no answer to initialize")
        await proc.proc.wait()
        return self._exit_failure(proc)

    def _startup_failure(self, result: Mapping[str, Any]) -> CliEvent:
        error = result.get("error")
        message = (error.get("message") if isinstance(error, dict) else None) or "startup failed"
        self._resumable = False
        if is_login_error(message):
            return LoginRequired(f"qwen: {message}")
        return TurnFailed("upstream", f"qwen: {message}")

    def _exit_failure(self, proc: JsonLineProcess) -> CliEvent:
        if self._interrupted:
            return TurnFailed("interrupted", "qwen: interrupted")
        self._resumable = False
        return TurnFailed("upstream", proc.why_exited())

    async def _answer_control(self, obj: Mapping[str, Any]) -> None:
        """Answer the CLI's own control requests (tool permissions)."""
        assert self._proc is not None
        request = obj.get("request") or {}
        response: dict[str, Any]
        if request.get("subtype") == "mcp_message" and self._tools is not None:
            answer = self._tools.message(str(obj.get("request_id")), request.get("message") or {})
            if answer is not None:  # None: a tools/call held for the client
                self._send(answer)
            return
        if request.get("subtype") == "can_use_tool":
            if self.driver.config.mode == "agent":
                body = {"behavior": "allow", "updatedInput": request.get("input") or {}}
            else:
                body = {"behavior": "deny", "message": "tools are off in chat mode"}
            response = {"subtype": "success", "request_id": obj.get("request_id"), "response": body}
        else:
            response = {"subtype": "error", "request_id": obj.get("request_id"),
                        "error": f"unsupported control request {request.get('subtype')!r}"}
        self._send({"type": "control_response", "response": response})

    async def send(self, turn: Turn) -> AsyncIterator[CliEvent]:
        if self._closed:
            yield TurnFailed("upstream", "qwen: conversation closed")
            return
        # a caller that leaves mid-turn: the only way to stop Qwen is to end it
        async for event in guarded(self._run(turn), on_terminal=self.driver.note_terminal,
                                   on_abandon=self.interrupt):
            yield event

    async def _run(self, turn: Turn) -> AsyncIterator[CliEvent]:
        continuing = self._write_history(turn)
        if self._proc is None or not self._proc.running:
            failure = await self._spawn()
            if failure is not None:
                yield failure
                return
        proc = self._proc
        assert proc is not None
        if self._session_id:
            yield SessionStarted(self._session_id, self.setup.model)
        parser = QwenTurnParser(self._totals, client_tool_prefix=PREFIX if self._tools else None)
        if self._tools is not None:
            self._tools.new_turn()
        if continuing:  # the results are in the session: Qwen runs that turn by itself
            self._continue_id = self._control_id()
            self._send({"type": "control_request", "request_id": self._continue_id,
                        "request": {"subtype": "continue_last_turn"}})
        else:
            self._send({"type": "user", "message": {"role": "user",
                                                    "content": turn_blocks(turn)}})
        async for event in self._pump(parser):
            yield event

    def _write_history(self, turn: Turn) -> bool:
        """Write a history that ends in tool calls, with the results ``turn``
        brings; True when it brought some (Qwen is to continue that turn)."""
        if not self.results_first:
            return False
        self.results_first = False
        results = results_message(turn)
        self.resume_from(self.driver.transcript(self.cwd, self.setup, results))
        return results is not None

    async def _pump(self, parser: QwenTurnParser) -> AsyncIterator[CliEvent]:
        """Read the turn on to its end, or to client tool calls (then held)."""
        proc = self._proc
        assert proc is not None
        idle = self.driver.config.idle_timeout
        while True:
            try:
                obj = await self._read(idle)
            except TimeoutError:
                log.warning("cli.qwen_stalled", pid=proc.pid, seconds=idle)
                self._resumable = False
                self._kill()
                yield TurnFailed("timeout", f"qwen said nothing for {idle:g} s")
                return
            if obj is None:
                break
            kind = obj.get("type")
            if kind == "control_request":
                await self._answer_control(obj)
                continue
            if kind == "control_response" and refused_continue(obj, self._continue_id):
                self._resumable = False  # the session holds results no turn will read
                self._kill()
                yield TurnFailed("upstream", "qwen: the CLI did not continue the rebuilt "
                                 "tool turn (continue_last_turn needs Qwen Code 0.24)")
                return
            events = parser.feed(obj)
            if parser.done:  # before yielding: the consumer may stop at the terminal event
                self._totals = parser.totals
            for event in events:
                if isinstance(event, SessionStarted):
                    if event.session_id == self._session_id:
                        continue
                    self._session_id = event.session_id
                    self._sessions.add(event.session_id)
                elif isinstance(event, PendingToolCall) and self._tools is not None:
                    self._tools.called(event)
                yield event
            if parser.done:
                return
            if parser.pending:  # the client answers; Qwen's tools/call waits unanswered
                self._parser = parser
                yield ToolsPending()
                return
        await proc.proc.wait()
        yield self._exit_failure(proc)

    async def answer_tools(self, answers: Sequence[ToolAnswer]) -> AsyncIterator[CliEvent]:
        parser, self._parser = self._parser, None
        if self._tools is None or parser is None or self._proc is None or not self._proc.running:
            yield TurnFailed("invalid_request", "qwen: no tool call is held")
            return
        for response in self._tools.answer(answers):
            self._send(response)
        parser.pending = False
        async for event in guarded(self._pump(parser), on_terminal=self.driver.note_terminal,
                                   on_abandon=self.interrupt):
            yield event

    async def interrupt(self) -> None:
        """Qwen's own ``interrupt`` ends the process anyway; SIGKILL is certain."""
        if self._proc is not None and self._proc.running:
            self._interrupted = True
            self._kill()

    async def close(self) -> None:
        self._closed = True
        try:
            if self._proc is not None:
                await self._proc.close()
        finally:  # the process is gone: the conversation's text leaves the disk with it
            config = self.driver.config
            for session_id in self._sessions:
                forget_session(config.home, self.cwd, session_id)
            if self._prompt is not None:
                self._prompt.remove()

