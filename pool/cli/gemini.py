"""The Gemini CLI driver: one ``gemini --acp`` process per conversation.

Gemini CLI 0.61.0 has two machine modes; measured against a fake Gemini API
(tests/fakes/gemini_cli_upstream.py), see docs/cli-workers.md:

* ``-p PROMPT -o stream-json``: one turn per process (the prompt comes from
  argv or stdin, there is no stream-json *input*), 2.5-2.8 s a turn, the next
  turn a new process with ``--resume``;
* ``--acp`` (Agent Client Protocol, JSON-RPC on stdio): 2.6 s to the first
  answer, then 24 ms per warm turn in the same process; several sessions per
  process; ``session/cancel`` stops a prompt and the process lives on.

So the driver speaks ACP, through the generic machinery of
:mod:`pool.cli.jsonrpc`. One process per conversation, not per account,
because the system prompt is per process: it goes in a 0600 file named by
``GEMINI_SYSTEM_MD`` (client text never on argv), replacing the CLI's own
agent prompt in chat mode. In chat mode ``tools.exclude`` in the home's
settings lets none of the CLI's own tools through (:mod:`pool.cli.gemini_home`).

Accounts: a Google login (``oauth_creds.json`` in ``$HOME/.gemini``) or an API
key (``GEMINI_API_KEY`` in the worker's ``env``; ``GOOGLE_GEMINI_BASE_URL``
points the CLI at another Gemini endpoint, read by ``@google/genai``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import weakref
from pathlib import Path
from typing import Any, AsyncIterator, Mapping, Sequence

import orjson
import structlog

from .content import turn_blocks
from .driver import DriverConfig, DriverError
from .events import (
    CliEvent, CliHealth, ConversationSetup, LoginRequired, PendingToolCall, RateLimited, ToolAnswer,
    ToolExecuted, ToolsPending, Turn, TurnFailed, TurnFinished,
)
from .gemini_home import GeminiHome
from .gemini_tools import SERVER_NAME, HeldCall, ToolServer
from .jsonrpc import JsonRpcConversation, RpcError
from .jsonrpc_agent import Agent
from .jsonrpc_options import JsonRpcOptions
from .private import private_dir
from .proc import JsonLineProcess, find_binary, run_probe
from .turns import guarded

__all__ = ["GeminiDriver", "GeminiConversation", "DEFAULT_CHAT_SYSTEM", "ACP_OPTIONS"]

log = structlog.get_logger("pool.cli.gemini")

DEFAULT_CHAT_SYSTEM = "You are a helpful assistant."
#: ACP as Gemini CLI 0.61.0 speaks it: usage in the prompt result's ``_meta.quota``
ACP_OPTIONS = JsonRpcOptions(usage_path="_meta.quota.token_count")
_OPTIONS = {"extra_args"}
_PROBE_TIMEOUT = 60.0
_TOOL_GRACE = 0.3  # after a held client tool call: how long to wait for its parallel siblings
#: ACP tool call ids of the client's tools (MCP server ``gw``), as 0.61.0 makes them
CLIENT_TOOL_PREFIX = f"mcp_{SERVER_NAME}_"


class GeminiDriver:
    """One Gemini CLI account (``home`` is its ``HOME``)."""

    cli = "gemini"
    can_load_history = False  # the host flattens history into the first turn
    concurrent_turns = True   # a process per conversation: they run side by side

    def __init__(self, config: DriverConfig) -> None:
        unknown = sorted(set(config.options) - _OPTIONS)
        if unknown:
            raise DriverError(f"cli_options.{unknown[0]}: not an option of the gemini driver "
                              f"(one of {', '.join(sorted(_OPTIONS))})")
        extra = config.options.get("extra_args", [])
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            raise DriverError("cli_options.extra_args: must be a list of strings")
        self.config = config
        self.options = ACP_OPTIONS
        self.extra_args: tuple[str, ...] = tuple(extra)
        self.home = Path(config.home)
        self.account = GeminiHome(self.home, config.env, config.mode)
        self.command: list[str] = []
        self.version: str | None = None
        self.logged_out_reason: str | None = None
        self._stamp: str | None = None
        self._conversations: weakref.WeakSet[GeminiConversation] = weakref.WeakSet()

    def env(self, system_file: Path | None = None) -> dict[str, str]:
        env = dict(self.config.env)
        env.update(HOME=str(self.home), NO_COLOR="1", TERM="dumb", NO_BROWSER="1")
        env.pop("GEMINI_SYSTEM_MD", None)
        if system_file is not None:
            env["GEMINI_SYSTEM_MD"] = str(system_file)
        return env

    # --- CliDriver ---

    async def start(self) -> CliHealth:
        self.command = find_binary(self.config.command, "gemini", self.config.env)
        private_dir(self.home)
        private_dir(self.config.cwd)
        self.account.write()
        try:
            code, out, err = await run_probe(
                [*self.command, "--version"], env=self.env(), cwd=self.config.cwd,
                timeout=min(_PROBE_TIMEOUT, self.config.idle_timeout))
        except (OSError, TimeoutError) as exc:
            raise DriverError(f"gemini: cannot run {self.command[0]}: {type(exc).__name__}") \
                from None
        if code != 0:  # its stderr may hold secrets: neither logged nor shown
            log.warning("cli.gemini.version_failed", worker=self.config.name, code=code)
            raise DriverError(f"gemini --version exited {code}")
        lines = out.decode(errors="replace").strip().splitlines()
        self.version = lines[-1].strip() if lines else None
        self._stamp = self.account.credentials_stamp()
        log.info("cli.gemini.started", worker=self.config.name, version=self.version,
                 auth=self.account.selected_auth())
        return await self.health()

    async def health(self) -> CliHealth:
        if self.logged_out_reason and self.account.credentials_stamp() != self._stamp:
            self.logged_out_reason = None  # the credentials were rewritten: try again
        login = "ready"
        if self.logged_out_reason is not None or not self.account.has_credentials():
            login = "logged_out"
        detail: dict[str, Any] = {"auth_type": self.account.selected_auth(),
                                  "credentials": self.account.credentials_stamp(),
                                  "conversations": sum(1 for c in self._conversations if c.alive)}
        if self.logged_out_reason:
            detail["reason"] = self.logged_out_reason
        return CliHealth(login=login, version=self.version, detail=detail)

    async def open(self, setup: ConversationSetup) -> GeminiConversation | LoggedOut:
        """Start the conversation's process (its system prompt in a 0600 file)."""
        system_file = None  # agent mode keeps the CLI's own prompt: the client's goes first
        if self.config.mode == "chat":
            system_file = self.account.system_prompt_file(setup.system or DEFAULT_CHAT_SYSTEM)
        tools = ToolServer(setup.tools) if setup.tools else None
        try:
            if tools is not None:
                await tools.start()
            agent = await self.spawn(setup, setup.workspace or self.config.cwd, system_file, tools)
        except BaseException as exc:
            self.account.forget(system_file)
            if tools is not None:
                await tools.close()
            if isinstance(exc, LoginPrompted):
                return LoggedOut("gemini: the Google login was not accepted; log in again")
            raise
        conversation = GeminiConversation(self, agent, setup, system_file, tools)
        self._conversations.add(conversation)
        return conversation

    async def stop(self) -> None:
        await asyncio.gather(*(c.close() for c in list(self._conversations)),
                             return_exceptions=True)

    def note_terminal(self, event: CliEvent) -> None:
        if isinstance(event, LoginRequired):
            self.logged_out_reason = event.message
            self._stamp = self.account.credentials_stamp()
        elif isinstance(event, TurnFinished):
            self.logged_out_reason = None

    def end_later(self, agent: Agent, session_id: str) -> None:
        """A session no conversation holds: its process goes with it (see close)."""
        agent.sessions.pop(session_id, None)

    # --- processes ---

    def argv(self, setup: ConversationSetup) -> list[str]:
        return [*self.command, "--acp", "--model", setup.model, *self.extra_args]

    async def spawn(self, setup: ConversationSetup, cwd: str, system_file: Path | None,
                    tools: ToolServer | None = None) -> Agent:
        """A ``gemini --acp`` process, initialized; DriverError when it is not.
        With client tools its session gets their MCP server, and the workspace is
        trusted (the CLI connects to no MCP server in an untrusted folder)."""
        env = self.env(system_file)
        options = self.options
        if tools is not None:
            env["GEMINI_CLI_TRUST_WORKSPACE"] = "true"
            options = dataclasses.replace(options, session_params={
                "mcpServers": [tools.acp_entry()]})
        argv = self.config.sandboxed(self.argv(setup), cwd=cwd, env=env)
        proc = await GeminiProcess.spawn(argv, env=env, cwd=cwd, label="gemini")
        agent = GeminiAgent(proc, options, self.config.mode)
        try:
            assert self.options.initialize is not None
            info = await agent.call(self.options.initialize, self.options.initialize_params,
                                    timeout=_PROBE_TIMEOUT)
        except (RpcError, asyncio.TimeoutError) as exc:
            await proc.close(grace=0.5)
            if proc.login_prompted:
                raise LoginPrompted() from None
            log.warning("cli.gemini.initialize_failed", worker=self.config.name,
                        error=type(exc).__name__, exit_code=proc.proc.returncode)
            raise DriverError("gemini: the CLI did not answer initialize") from None
        agent_info = info.get("agentInfo") if isinstance(info, Mapping) else None
        if isinstance(agent_info, Mapping) and agent_info.get("version"):
            self.version = str(agent_info["version"])
        return agent


def _executed(call_id: str, update: Mapping[str, Any]) -> ToolExecuted:
    """0.61.0's ``tool_call``: the tool's name only in its id (``read_file__read_file_<ms>_0``),
    a display title, the paths it touches, and no ``rawInput``: those stand in for it."""
    name = call_id.split("__", 1)[0] if "__" in call_id else str(update.get("title") or "tool")
    arguments = update.get("rawInput")
    if not isinstance(arguments, Mapping):
        paths = [loc.get("path") for loc in update.get("locations") or []
                 if isinstance(loc, Mapping) and loc.get("path")]
        arguments = {"title": update.get("title")} | ({"paths": paths} if paths else {})
    return ToolExecuted(call_id, name, json.dumps(arguments))


class LoginPrompted(DriverError):
    """The CLI did not accept the account's Google login and began its own."""


class GeminiProcess(JsonLineProcess):
    """A ``gemini --acp`` process. A Google login the CLI does not accept (expired,
    revoked, or Google unreachable) makes it print its interactive login on stdout
    and read codes from stdin, the ACP stream: its output ends there, so what waits
    on it fails at once instead of at a timeout."""

    login_prompted = False

    async def lines(self) -> AsyncIterator[dict[str, Any]]:
        stdout = self.proc.stdout
        assert stdout is not None
        while line := await stdout.readline():
            if b"authorize the application" in line:
                self.login_prompted = True
                return
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if type(obj) is dict:
                yield obj


class LoggedOut:
    """A conversation that could not start because the account is logged out:
    its one turn says so (the host then marks the account)."""

    session_id = None
    alive = False

    def __init__(self, message: str) -> None:
        self.message = message

    async def send(self, turn: Turn) -> AsyncIterator[CliEvent]:
        yield LoginRequired(self.message)

    async def answer_tools(self, answers: Sequence[ToolAnswer]) -> AsyncIterator[CliEvent]:
        yield LoginRequired(self.message)

    async def interrupt(self) -> None:
        return None

    async def close(self) -> None:
        return None


class GeminiAgent(Agent):
    """The ACP process; the client's tools (MCP server ``gw``) may always run:
    asking about them is the client's business, not the CLI's."""

    def _permission(self, params: Mapping[str, Any]) -> dict[str, Any]:
        tool_call = params.get("toolCall")
        call_id = str(tool_call.get("toolCallId", "")) if isinstance(tool_call, Mapping) else ""
        if call_id.startswith(CLIENT_TOOL_PREFIX):
            for option in params.get("options") or []:
                if isinstance(option, Mapping) and option.get("kind") == "allow_once":
                    return {"outcome": {"outcome": "selected", "optionId": option.get("optionId")}}
        return super()._permission(params)


class GeminiConversation(JsonRpcConversation):
    """One ``gemini --acp`` process holding one ACP session."""

    def __init__(self, driver: GeminiDriver, agent: Agent, setup: ConversationSetup,
                 system_file: Path | None, tools: ToolServer | None = None) -> None:
        super().__init__(driver, agent, setup)  # type: ignore[arg-type]
        self.gemini = driver
        self._system_file = system_file
        self._tools = tools
        self._reply: asyncio.Future[Any] | None = None  # a prompt held at client tool calls
        if tools is not None:
            tools.deliver = self._queue.put_nowait

    def _update(self, params: Mapping[str, Any]) -> CliEvent | None:
        update = params.get("update")
        call_id = str(update.get("toolCallId", "")) if isinstance(update, Mapping) else ""
        if call_id.startswith(CLIENT_TOOL_PREFIX):
            return None  # the client's own tool: it sees the call, not an executed pair
        if isinstance(update, Mapping) and update.get("sessionUpdate") == self.o.tool_call_kind:
            return _executed(call_id, update)
        return super()._update(params)

    async def _pump(self, reply: asyncio.Future[Any]) -> AsyncIterator[CliEvent]:
        """As the generic loop, and a client tool call (held by the MCP server)
        is a PendingToolCall; once the CLI has said nothing for a moment after
        one (parallel calls arrive together), the step ends with ToolsPending."""
        idle, held = self.driver.config.idle_timeout, False
        while True:
            try:
                async with asyncio.timeout(_TOOL_GRACE if held else idle):
                    item = await self._queue.get()
            except TimeoutError:
                if held:
                    self._reply = reply
                    yield ToolsPending()
                else:
                    yield await self._stalled(idle)
                return
            if isinstance(item, HeldCall):
                held = True
                yield PendingToolCall(item.call_id, item.name, item.arguments)
                continue
            events, done = await self._consume(item, reply)
            for event in events:
                yield event
            if done:
                return

    async def answer_tools(self, answers: Sequence[ToolAnswer]) -> AsyncIterator[CliEvent]:
        reply, self._reply = self._reply, None
        if self._tools is None or reply is None or not self._tools.answer(answers):
            yield TurnFailed("invalid_request", "gemini: no tool call is held")
            return
        async for event in guarded(self._pump(reply), on_terminal=self.driver.note_terminal,
                                   on_abandon=self.interrupt):
            yield event

    def _failure(self, exc: RpcError) -> CliEvent:
        """ACP errors of 0.61.0: -32000 (no key, no login) at ``session/new``; an API
        error fails the prompt with the HTTP status as code and Google's error body
        as message. That body is the vendor's: only its status goes on."""
        code, text = exc.code, str(exc)
        if code == self.o.auth_error_code or code in (401, 403) or "API_KEY_INVALID" in text:
            return LoginRequired("gemini: the account's credentials were refused")
        if code == 429 or "RESOURCE_EXHAUSTED" in text:
            return TurnFailed("overloaded", "gemini: the account hit a rate limit or quota",
                              status=429)
        if code is None:  # the process went away (its stderr stays in the child's log)
            log.warning("cli.gemini.exited", exit_code=self.agent.proc.proc.returncode)
            return TurnFailed("upstream", "gemini: the CLI exited")
        log.warning("cli.gemini.prompt_failed", code=code)  # its text is the vendor's
        status = code if isinstance(code, int) and 400 <= code < 600 else None
        return TurnFailed("upstream", "gemini: the turn failed"
                          + (f" (upstream status {status})" if status else ""), status=status)

    async def _consume(self, item: Any, reply: asyncio.Future[Any]) -> tuple[list[CliEvent], bool]:
        """The generic meaning of an item, with a quota error preceded by RateLimited
        and a process that died mid-turn reported without its stderr."""
        events, done = await super()._consume(item, reply)
        out: list[CliEvent] = []
        for event in events:
            if isinstance(event, TurnFailed) and event.status == 429:
                out.append(RateLimited(event.message))
            elif isinstance(event, TurnFailed) and event.message.startswith("gemini exited"):
                log.warning("cli.gemini.exited_mid_turn")  # its stderr: neither logged nor sent
                event = TurnFailed("upstream", "gemini: the CLI exited during the turn")
            out.append(event)
        return out, done

    def _prompt_blocks(self, turn: Turn) -> list[dict[str, Any]]:
        """Chat mode: the system prompt is the process's (GEMINI_SYSTEM_MD). Agent
        mode: that file would replace the CLI's agent prompt, so the client's goes
        first in the first prompt."""
        blocks = turn_blocks(turn)
        if self._turns == 0 and self.setup.system and self.gemini.config.mode == "agent":
            blocks.insert(0, {"type": "text", "text": self.setup.system})
        self._turns += 1
        return blocks

    async def close(self) -> None:
        try:
            await super().close()
        finally:  # the process goes with its one session
            if self._tools is not None:
                await self._tools.close()
            await self.agent.proc.close(grace=0.5)
            self.gemini.account.forget(self._system_file)
