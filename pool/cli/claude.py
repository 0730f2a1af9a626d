"""The Claude Code driver: one ``claude -p`` stream-json process per
conversation, one turn at a time, control ``initialize``/``interrupt``, and
the client's tools served by an in-band SDK MCP server (``mcp_message``)
whose ``tools/call`` is held open until the API client answers.

Nothing a client wrote goes on the command line: the system prompt reaches
the CLI as ``--system-prompt-file`` / ``--append-system-prompt-file`` (a
private file the CLI reads once at startup, removed once it answered
``initialize``), and the client-chosen model and effort as ``--model=…`` /
``--effort=…`` (one argument each, never taken for another option).

Quota: ``rate_limit_event`` is decoded with the output; the control request
``get_usage`` is asked after turns as :mod:`pool.cli.claude_usage` decides.

See :mod:`pool.cli.claude_events` for the output,
:mod:`pool.cli.claude_transcript` for rebuilding a session with ``--resume``
and :mod:`pool.cli.claude_resume` for one that ends in the model's tool calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import time
import uuid
from typing import Any, AsyncIterator, Callable, Sequence

import orjson
import structlog

from .claude_events import ClaudeStream
from .claude_resume import ResultsFirst
from .claude_transcript import (MCP_PREFIX, content_blocks, forget_session, forget_sessions,
                                write_transcript)
from ..errors import BadRequest
from ..model import Message
from .driver import DriverConfig, DriverError, credentials_stamp
from ..quota import QuotaWindow
from .events import (TERMINAL, CliEvent, CliHealth, ConversationSetup, ToolAnswer, Turn,
                     TurnFailed, TurnFinished)
from .history import ends_in_tool_calls
from .private import private_dir
from .proc import JsonLineProcess, find_binary, run_probe
from .prompt_file import PromptFile, remove_stale, safe_value
from .claude_usage import AUTH_ENV as _AUTH_ENV, UsageAsker
from .quota_events import claude_usage
from .scrub import account_secrets

__all__ = ["ClaudeDriver", "ClaudeConversation"]

log = structlog.get_logger("pool.cli.claude")

_QUIET_ENV = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
              "DISABLE_UPDATES": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
              "DISABLE_GROWTHBOOK": "1", "DISABLE_INSTALLATION_CHECKS": "1",
              "DISABLE_COST_WARNINGS": "1", "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
              "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
              "MCP_TOOL_TIMEOUT": "100000000"}  # a held client tool call may take long
_SERVER = "gw"
_PROBE_TIMEOUT = 30.0  # seconds for ``claude --version``
_USAGE_TIMEOUT = 15.0  # Claude Code first tries the vendor's usage endpoint (5 s timeout)


class ClaudeDriver:
    cli = "claude"
    can_load_history = True
    concurrent_turns = False

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self.permission_mode = str(config.options.get("permission_mode", "default"))
        self.idle_timeout = config.idle_timeout
        self.version: str | None = None
        self._argv0: list[str] = []
        self.usage = UsageAsker(config.home, config.env)  # when get_usage is asked

    @property
    def on_quota(self) -> Callable[[tuple[QuotaWindow, ...]], None] | None:
        """Where the account's quota windows from ``get_usage`` go (set by the host)."""
        return self.usage.on_quota

    @on_quota.setter
    def on_quota(self, report: Callable[[tuple[QuotaWindow, ...]], None] | None) -> None:
        self.usage.on_quota = report

    @property
    def env(self) -> dict[str, str]:
        return {**self.config.env, **_QUIET_ENV, "CLAUDE_CONFIG_DIR": self.config.home}

    async def start(self) -> CliHealth:
        self._argv0 = find_binary(self.config.command, "claude", self.config.env)
        private_dir(self.config.home)
        private_dir(self.config.cwd)
        for cwd in self.config.every_cwd():  # left by a worker that died
            forget_sessions(self.config.home, cwd)
        remove_stale(self.config.home)
        try:  # a probe that hangs is killed (idle_timeout: silence that counts as hung)
            _, out, _ = await run_probe([*self._argv0, "--version"], env=self.env,
                                        cwd=self.config.cwd,
                                        timeout=min(_PROBE_TIMEOUT, self.config.idle_timeout))
        except (OSError, TimeoutError) as exc:
            raise DriverError(f"cannot run {self._argv0[0]} --version ({type(exc).__name__})") from None
        match = re.search(rb"\d+\.\d+\.\d+", out or b"")
        self.version = match.group().decode() if match else None
        return await self.health()

    async def health(self) -> CliHealth:
        """Credentials present (in the home, or an API key/token in the
        environment); a 401 on a turn says the rest."""
        home = self.config.home
        stamp = credentials_stamp(os.path.join(home, ".credentials.json"))
        logged_in = (stamp is not None or any(self.config.env.get(k) for k in _AUTH_ENV)
                     or _has_api_key_helper(home))
        return CliHealth(login="ready" if logged_in else "logged_out", version=self.version,
                         account=_account(home), detail={"credentials": stamp})

    def secrets(self) -> set[str]:
        """The account's secret values (scrubbed from what the CLI prints)."""
        return account_secrets(self.config.home, self.config.env)

    async def open(self, setup: ConversationSetup) -> ClaudeConversation | ResultsFirst:
        for param, value in (("model", setup.model), ("reasoning_effort", setup.effort)):
            if value is not None and not safe_value(value, 128):
                raise BadRequest(f"{param}: not a value the claude CLI takes", param=param)
        if ends_in_tool_calls(setup.history):  # started by the client's results (claude_resume)
            return ResultsFirst(lambda results: self._open(setup, results))
        return await self._open(setup)

    async def _open(self, setup: ConversationSetup,
                    results: tuple[Message, ...] = ()) -> ClaudeConversation:
        session_id = str(uuid.uuid4())
        argv = [*self._argv0, "-p", "--input-format", "stream-json", "--output-format",
                "stream-json", "--verbose", "--include-partial-messages", f"--model={setup.model}"]
        prompt: PromptFile | None = None
        if self.config.mode == "chat":
            prompt = PromptFile(self.config.home, setup.system or "")
            argv += ["--tools", "", "--system-prompt-file", prompt.path]
        else:
            argv += ["--permission-mode", self.permission_mode]
            if setup.system:
                prompt = PromptFile(self.config.home, setup.system)
                argv += ["--append-system-prompt-file", prompt.path]
        try:
            return await self._spawn(setup, session_id, argv, results)
        finally:
            if prompt is not None:  # read at startup: gone once the CLI answered initialize
                prompt.remove()

    async def _spawn(self, setup: ConversationSetup, session_id: str, argv: list[str],
                     results: tuple[Message, ...]) -> ClaudeConversation:
        if setup.tools:
            argv += ["--mcp-config", orjson.dumps(
                {"mcpServers": {_SERVER: {"type": "sdk", "name": _SERVER}}}).decode(),
                "--allowedTools", ",".join(MCP_PREFIX + t.name for t in setup.tools)]
        if setup.effort:
            argv.append(f"--effort={setup.effort}")
        cwd = setup.workspace or self.config.cwd
        if setup.history:
            write_transcript(self.config.home, cwd, session_id, setup.model, (
                *setup.history, *results), (t.name for t in setup.tools), self.version)
            argv += ["--resume", session_id]
        else:
            argv += ["--session-id", session_id]
        env = self.env
        if results:  # the session ends with them: the CLI runs that turn by itself at start
            env["CLAUDE_CODE_RESUME_INTERRUPTED_TURN"] = "1"
        if setup.max_tokens:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(setup.max_tokens)
        if setup.thinking_budget:
            env["MAX_THINKING_TOKENS"] = str(setup.thinking_budget)
        argv = self.config.sandboxed(argv, cwd=cwd, env=env)
        try:
            proc = await JsonLineProcess.spawn(argv, env=env, cwd=cwd, label="claude",
                                               secrets=self.secrets)
        except BaseException:
            forget_session(self.config.home, cwd, session_id)
            raise
        conversation = ClaudeConversation(proc, setup, session_id, self.idle_timeout)
        conversation.on_closed = lambda: forget_session(self.config.home, cwd, session_id)
        conversation.on_turn_end = self.usage.after_turn
        try:
            await conversation.initialize()
        except BaseException:
            await conversation.close()
            raise
        return conversation

    async def stop(self) -> None:
        self.usage.stop()


class ClaudeConversation:
    """One ``claude -p`` process holding one session."""

    def __init__(self, proc: JsonLineProcess, setup: ConversationSetup, session_id: str,
                 idle_timeout: float) -> None:
        self.proc = proc
        self.setup = setup
        self._session_id = session_id
        self.idle_timeout = idle_timeout
        self._parser = ClaudeStream()
        self._events: asyncio.Queue[CliEvent] = asyncio.Queue()
        self._controls: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._held: dict[str, tuple[str, Any]] = {}      # tool_use id -> (request id, mcp id)
        self._answers: dict[str, ToolAnswer] = {}        # answered before the CLI asked
        self._reader = asyncio.ensure_future(self._read())
        self.on_closed: Callable[[], None] | None = None  # deletes the session's transcript
        #: called when a turn ended (not paused on a client tool), with the gist of the
        #: rate_limit_event that came during it, if any (the driver may ask get_usage)
        self.on_turn_end: Callable[[ClaudeConversation, tuple[str, ...] | None], None] | None \
            = None

    @property
    def session_id(self) -> str | None:
        return self._session_id

    @property
    def alive(self) -> bool:
        return self.proc.running and not self._reader.done()

    async def initialize(self) -> None:
        await self._control({"subtype": "initialize", "hooks": None}, timeout=60)

    def send(self, turn: Turn) -> AsyncIterator[CliEvent]:
        self._parser.new_turn()
        tools = frozenset(t.name for t in self.setup.tools)
        blocks = [b for m in turn.messages for b in content_blocks(m, tools)]
        content: Any = (blocks[0]["text"] if len(blocks) == 1 and blocks[0]["type"] == "text"
                        else blocks)
        self.proc.send({"type": "user", "message": {"role": "user", "content": content}})
        return self._step()

    def resumed_turn(self) -> AsyncIterator[CliEvent]:
        """The turn the CLI runs by itself at start (a session ending in tool results)."""
        return self._step()

    def answer_tools(self, answers: Sequence[ToolAnswer]) -> AsyncIterator[CliEvent]:
        for answer in answers:
            if answer.call_id in self._held:
                self._reply_tool(answer)
            else:
                self._answers[answer.call_id] = answer
        return self._step()

    async def interrupt(self) -> None:
        if self.alive:
            self._parser.interrupting = True
            with contextlib.suppress(Exception):
                await self._control({"subtype": "interrupt"}, timeout=5)

    async def close(self) -> None:
        try:
            await self.proc.close()
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        finally:  # the process is gone (or being killed): it writes no more
            if self.on_closed is not None:
                self.on_closed()

    # --- the process's output -----------------------------------------------------------

    async def _step(self) -> AsyncIterator[CliEvent]:
        while True:
            try:
                async with asyncio.timeout(self.idle_timeout):
                    event = await self._events.get()
            except TimeoutError:
                log.warning("cli.claude_stalled", pid=self.proc.pid, seconds=self.idle_timeout)
                self.proc.proc.kill()
                yield TurnFailed("timeout", f"claude said nothing for {self.idle_timeout:g} s")
                return
            if isinstance(event, TERMINAL):
                if self.on_turn_end is not None and isinstance(event, (TurnFinished, TurnFailed)):
                    info, self._parser.rate_info = self._parser.rate_info, None
                    self.on_turn_end(self, info)
                yield event
                return
            yield event

    async def _read(self) -> None:
        try:
            async for obj in self.proc.lines():
                kind = obj.get("type")
                if kind == "control_response":
                    response = obj.get("response") or {}
                    future = self._controls.pop(str(response.get("request_id")), None)
                    if future is not None and not future.done():
                        future.set_result(response)
                elif kind == "control_request":
                    self._on_control(obj)
                else:
                    for event in self._parser.feed(obj):
                        self._events.put_nowait(event)
            await self.proc.proc.wait()
        finally:
            for future in self._controls.values():
                if not future.done():
                    future.set_exception(BrokenPipeError("claude exited"))
            self._events.put_nowait(TurnFailed("upstream", self.proc.why_exited()))

    async def usage(self) -> tuple[QuotaWindow, ...]:
        """The account's windows by the control request ``get_usage`` (nothing when
        the process cannot answer it: it exited, it is too old, it timed out)."""
        try:
            response = await self._control({"subtype": "get_usage"}, timeout=_USAGE_TIMEOUT)
        except (OSError, TimeoutError) as exc:  # the process exited, or was too slow
            log.info("cli.claude_usage_unanswered", error=type(exc).__name__)
            return ()
        if response.get("subtype") != "success":
            log.info("cli.claude_usage_refused", error=str(response.get("error"))[:200])
            return ()
        return claude_usage(response.get("response"), time.time())

    async def _control(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        request_id = f"gw_{next(self._ids)}"
        future = self._controls[request_id] = asyncio.get_running_loop().create_future()
        self.proc.send({"type": "control_request", "request_id": request_id, "request": request})
        try:
            async with asyncio.timeout(timeout):
                return await future
        finally:
            self._controls.pop(request_id, None)

    def _respond(self, request_id: str, response: dict[str, Any]) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.proc.send({"type": "control_response", "response": {
                "subtype": "success", "request_id": request_id, "response": response}})

    def _on_control(self, obj: dict[str, Any]) -> None:
        request_id = str(obj.get("request_id"))
        request = obj.get("request") or {}
        if request.get("subtype") == "mcp_message" and request.get("server_name") == _SERVER:
            self._on_mcp(request_id, request.get("message") or {})
        elif request.get("subtype") == "can_use_tool":
            self._respond(request_id, {"behavior": "deny", "message": "not allowed here"})
        else:
            with contextlib.suppress(BrokenPipeError):
                self.proc.send({"type": "control_response", "response": {
                    "subtype": "error", "request_id": request_id,
                    "error": f"unsupported control request {request.get('subtype')!r}"}})

    def _on_mcp(self, request_id: str, message: dict[str, Any]) -> None:
        method = message.get("method")
        mcp_id = message.get("id")
        if method == "tools/call":
            params = message.get("params") or {}
            call_id = str((params.get("_meta") or {}).get("claudecode/toolUseId") or "")
            self._held[call_id] = (request_id, mcp_id)
            early = self._answers.pop(call_id, None)
            if early is not None:
                self._reply_tool(early)
            return
        if method == "initialize":
            result: Any = {"protocolVersion": (message.get("params") or {}).get(
                "protocolVersion", "2024-11-05"), "capabilities": {"tools": {}},
                "serverInfo": {"name": _SERVER, "version": "1.0"}}
        elif method == "tools/list":
            result = {"tools": [{"name": t.name, "description": t.description or "",
                                 "inputSchema": dict(t.parameters or {"type": "object"})}
                                for t in self.setup.tools]}
        elif mcp_id is None:  # a notification
            self._respond(request_id, {"mcp_response": {"jsonrpc": "2.0", "result": {}}})
            return
        else:
            self._respond(request_id, {"mcp_response": {"jsonrpc": "2.0", "id": mcp_id, "error": {
                "code": -32601, "message": f"method {method!r} not found"}}})
            return
        self._respond(request_id, {"mcp_response": {"jsonrpc": "2.0", "id": mcp_id, "result": result}})

    def _reply_tool(self, answer: ToolAnswer) -> None:
        request_id, mcp_id = self._held.pop(answer.call_id)
        self._respond(request_id, {"mcp_response": {"jsonrpc": "2.0", "id": mcp_id, "result": {
            "content": answer.blocks(), "isError": answer.is_error}}})


def _account(home: str) -> str | None:
    try:
        with open(os.path.join(home, ".claude.json"), "rb") as fh:
            data = orjson.loads(fh.read())
    except (OSError, orjson.JSONDecodeError):
        return None
    account = data.get("oauthAccount") if isinstance(data, dict) else None
    if isinstance(account, dict):
        return account.get("emailAddress") or account.get("accountUuid")
    return None


def _has_api_key_helper(home: str) -> bool:
    try:
        with open(os.path.join(home, "settings.json"), "rb") as fh:
            return bool(orjson.loads(fh.read()).get("apiKeyHelper"))
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return False


