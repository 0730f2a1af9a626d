"""The Codex driver: one ``codex app-server`` per account, a thread per conversation.

``CODEX_HOME`` is the worker's ``home`` (``auth.json`` there is the account).
The app-server runs threads concurrently, so every conversation of the
account shares the process; each is an ephemeral thread (nothing written to
``sessions/``) started with the gateway's system prompt as
``baseInstructions`` and the API client's tools as ``dynamicTools``. In chat
mode the thread also gets ``environments: []`` (no shell, no files), and the
process runs with Codex's own tools and prompt additions off (see
:mod:`pool.cli.codex_config`).

A conversation rebuilt from a stateless history is a new thread plus
``thread/inject_items`` with the history as Responses items (verified on
0.169.0: the upstream then sees exactly those items before the new turn;
``thread/resume`` with ``history`` is marked unstable and drops
``dynamicTools``). A client tool named like one of Codex's own
(:data:`~pool.cli.codex_config.RESERVED_TOOLS`) is offered as
``client_<name>`` and reported back under its own name.

Login state: ``account/read`` (``account: null`` when ``auth.json`` holds no
credentials), and the first 401 of a turn (see :mod:`pool.cli.codex_thread`).
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
from pathlib import Path
from typing import Any, Callable

import structlog

from .codex_config import (
    DEFAULT_CHAT_SYSTEM, CodexOptions, app_server_argv, codex_name, dynamic_tools,
    history_items, native_binary,
)
from .codex_rpc import STREAM_LIMIT, CodexRpc, RpcClosed, RpcError
from .codex_thread import CodexThread
from .driver import DriverConfig, DriverError
from .events import CliHealth, ConversationSetup

__all__ = ["CodexDriver"]

log = structlog.get_logger(__name__)

CLIENT_INFO = {"name": "poolgate", "title": "poolgate", "version": "0.1"}
_VERSION = re.compile(r"/(\d+\.\d+\.\d+\S*)")
_START_TIMEOUT = 30.0
_HEALTH_TIMEOUT = 5.0


class CodexDriver:
    """See the module docstring; the contract is :class:`pool.cli.driver.CliDriver`."""

    cli = "codex"
    can_load_history = True
    concurrent_turns = True

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self.options = CodexOptions(config.options)
        self.proc: asyncio.subprocess.Process | None = None
        self._rpc: CodexRpc | None = None
        self._threads: dict[str, CodexThread] = {}
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)
        self._stderr_task: asyncio.Task[None] | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.version: str | None = None
        #: called once when the app-server dies or hangs while not being stopped; the
        #: worker child sets it to end itself, so the supervisor restarts the account
        #: (every conversation lived in that one process)
        self.on_process_exit: Callable[[], None] | None = None

    @property
    def rpc(self) -> CodexRpc:
        if self._rpc is None:
            raise DriverError("the codex app-server is not started")
        return self._rpc

    # --- process ---------------------------------------------------------------------------

    async def start(self) -> CliHealth:
        env = dict(self.config.env)
        binary = native_binary(self.config.command, env)
        Path(self.config.home).mkdir(parents=True, exist_ok=True)
        Path(self.config.cwd).mkdir(parents=True, exist_ok=True)
        env["CODEX_HOME"] = self.config.home
        argv = app_server_argv(binary, chat=self.config.mode == "chat", options=self.options)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, cwd=self.config.cwd, limit=STREAM_LIMIT)
        except OSError as exc:
            raise DriverError(f"cannot run {argv[0]}: {exc}") from exc
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self._rpc = CodexRpc(self.proc.stdout, self.proc.stdin)
        self._stderr_task = asyncio.create_task(self._drain_stderr(), name="codex-stderr")
        try:
            info = await self.rpc.request("initialize", {
                "clientInfo": CLIENT_INFO, "capabilities": {"experimentalApi": True}},
                timeout=_START_TIMEOUT)
            await self.rpc.notify("initialized")
        except (RpcError, RpcClosed, TimeoutError) as exc:
            await self.stop()
            raise DriverError(f"codex app-server handshake failed: {exc}; "
                              f"stderr: {self.stderr_tail()}") from exc
        found = _VERSION.search(str(info.get("userAgent", "")))
        self.version = found[1] if found else None
        log.info("codex.started", worker=self.config.name, pid=self.proc.pid,
                 version=self.version)
        health = await self.health()
        self._watchers = [asyncio.create_task(self._watch_exit(), name="codex-exit"),
                          asyncio.create_task(self._watchdog(), name="codex-watchdog")]
        return health

    async def _watch_exit(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        if self._stopping:
            return
        log.error("codex.app_server_exited", worker=self.config.name, code=code,
                  stderr=self.stderr_tail())
        if self.on_process_exit is not None:
            self.on_process_exit()

    async def _watchdog(self) -> None:
        """A process that stops answering is as dead as one that exited."""
        while self.proc is not None and self.proc.returncode is None:
            await asyncio.sleep(self.options.watchdog)
            try:
                await self.health(timeout=min(_HEALTH_TIMEOUT, 2 * self.options.watchdog))
            except DriverError as exc:
                if self._stopping or self.proc.returncode is not None:
                    return
                log.error("codex.app_server_hung", worker=self.config.name, error=str(exc))
                self.proc.kill()  # _watch_exit takes it from here
                return

    async def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self._stderr.append(line.decode(errors="replace").rstrip())

    def stderr_tail(self) -> str:
        return " | ".join(self._stderr)[-1000:]

    async def health(self, timeout: float = _HEALTH_TIMEOUT) -> CliHealth:
        """``account/read``: cheap, local (no upstream call), answers even mid-turn."""
        if self.proc is None or self.proc.returncode is not None or self.rpc.closed.is_set():
            code = None if self.proc is None else self.proc.returncode
            raise DriverError(f"the codex app-server has exited (code {code})")
        try:
            answer = await self.rpc.request("account/read", {"refreshToken": False},
                                            timeout=timeout)
        except (RpcError, RpcClosed, TimeoutError) as exc:
            raise DriverError(f"codex app-server did not answer account/read: {exc!r}") from exc
        account = answer.get("account")
        detail: dict[str, Any] = {"conversations": len(self._threads),
                                  "requires_openai_auth": answer.get("requiresOpenaiAuth")}
        if account is None:
            return CliHealth(login="logged_out", version=self.version, detail=detail)
        detail["auth"] = account.get("type")
        if account.get("planType"):
            detail["plan"] = account["planType"]
        return CliHealth(login="ready", version=self.version, account=account.get("email"),
                         detail=detail)

    async def stop(self) -> None:
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        for thread in list(self._threads.values()):
            await thread.close()
        proc = self.proc
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()  # the app-server exits at stdin EOF
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._rpc is not None:
            await self._rpc.aclose()
        if self._stderr_task is not None:
            self._stderr_task.cancel()

    # --- conversations ---------------------------------------------------------------------

    async def open(self, setup: ConversationSetup) -> CodexThread:
        chat = self.config.mode == "chat"
        params: dict[str, Any] = {
            "cwd": self.config.cwd, "model": setup.model, "approvalPolicy": "never",
            "sandbox": "read-only" if chat else self.options.sandbox, "ephemeral": True,
            "dynamicTools": dynamic_tools(setup.tools),
        }
        if chat:
            params["environments"] = []
            params["baseInstructions"] = setup.system or DEFAULT_CHAT_SYSTEM
        elif setup.system:
            params["developerInstructions"] = setup.system
        try:
            result = await self.rpc.request("thread/start", params)
            thread_id = result["thread"]["id"]
            queue = self.rpc.subscribe(thread_id)
            if setup.history:
                await self.rpc.request("thread/inject_items", {
                    "threadId": thread_id, "items": history_items(setup.history)})
        except (RpcError, RpcClosed, TimeoutError) as exc:
            raise DriverError(f"codex thread/start failed: {exc}") from exc
        thread = CodexThread(self, thread_id, setup.model, setup.effort, queue,
                             {codex_name(t.name): t.name for t in setup.tools})
        self._threads[thread_id] = thread
        return thread

    def forget(self, thread_id: str) -> None:
        self._threads.pop(thread_id, None)
        if self._rpc is not None:
            self._rpc.unsubscribe(thread_id)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def __repr__(self) -> str:
        return f"CodexDriver({self.config.name!r}, pid={self.pid}, cwd={os.fspath(self.config.cwd)!r})"
