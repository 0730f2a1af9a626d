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

Quota: every ``account/rateLimits/updated`` notification (after each upstream
answer that carried the ``x-codex-*`` headers, any login) is reported through
``on_quota``; a ChatGPT login is also asked ``account/rateLimits/read`` once
per credentials (at start and after a login), in the background. An API-key
login's answer to that is the error −32600, which is no failure.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from typing import Any, Callable

import structlog

from .codex_config import (
    DEFAULT_CHAT_SYSTEM, CodexOptions, app_server_argv, codex_name, dynamic_tools,
    history_items, native_binary,
)
from .codex_rpc import CodexRpc, RpcClosed, RpcError
from .codex_thread import CodexThread
from .driver import DriverConfig, DriverError, credentials_stamp
from ..quota import QuotaWindow
from .events import CliHealth, ConversationSetup
from .private import private_dir
from .proc import JsonLineProcess, find_binary
from .quota_events import codex_rate_limits
from .scrub import account_secrets

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
        self.process: JsonLineProcess | None = None
        self._rpc: CodexRpc | None = None
        self._threads: dict[str, CodexThread] = {}
        # background requests: unsubscribes of orphaned threads, rateLimits/read
        self._closing: set[asyncio.Future[None]] = set()
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.version: str | None = None
        #: called once when the app-server dies or hangs while not being stopped; the
        #: worker child sets it to end itself, so the supervisor restarts the account
        #: (every conversation lived in that one process)
        self.on_process_exit: Callable[[], None] | None = None
        #: the account's quota windows as Codex reports them (set by the host)
        self.on_quota: Callable[[tuple[QuotaWindow, ...]], None] | None = None
        self._limits_read: str | None = None  # the credentials stamp rateLimits/read was for

    @property
    def rpc(self) -> CodexRpc:
        if self._rpc is None:
            raise DriverError("the codex app-server is not started")
        return self._rpc

    # --- process ---------------------------------------------------------------------------

    def _secrets(self) -> set[str]:
        return account_secrets(self.config.home, self.config.env)

    async def start(self) -> CliHealth:
        env = {**self.config.env, "CODEX_HOME": self.config.home}
        binary = native_binary(find_binary(self.config.command, "codex", env), env)
        private_dir(self.config.home)
        private_dir(self.config.cwd)
        argv = app_server_argv(binary, chat=self.config.mode == "chat", options=self.options)
        # one app-server serves every key: its sandbox shows all of this account's workspaces
        cwd = self.config.workspace_root if self.config.mode == "agent" and \
            self.config.workspace_root else self.config.cwd
        argv = self.config.sandboxed(argv, cwd=cwd, env=env)
        self.process = await JsonLineProcess.spawn(argv, env=env, cwd=cwd,
                                                   label="codex app-server",
                                                   secrets=self._secrets)
        proc = self.process.proc
        assert proc.stdout is not None and proc.stdin is not None
        self._rpc = CodexRpc(proc.stdout, proc.stdin)
        self._rpc.on_account = self._on_account
        try:
            info = await self.rpc.request("initialize", {
                "clientInfo": CLIENT_INFO, "capabilities": {"experimentalApi": True}},
                timeout=_START_TIMEOUT)
            await self.rpc.notify("initialized")
        except (RpcError, RpcClosed, TimeoutError) as exc:
            await self.stop()
            raise DriverError(f"codex app-server handshake failed: {exc!r}; "
                              f"{self.process.why_exited()}") from exc
        found = _VERSION.search(str(info.get("userAgent", "")))
        self.version = found[1] if found else None
        log.info("codex.started", worker=self.config.name, pid=proc.pid, version=self.version)
        health = await self.health()
        self._watchers = [asyncio.create_task(self._watch_exit(), name="codex-exit"),
                          asyncio.create_task(self._watchdog(), name="codex-watchdog")]
        return health

    async def _watch_exit(self) -> None:
        assert self.process is not None
        code = await self.process.proc.wait()
        if self._stopping:
            return
        if code == -signal.SIGTERM:  # the worker's group is being stopped: not a failure
            log.info("codex.app_server_terminated", worker=self.config.name)
        else:
            log.error("codex.app_server_exited", worker=self.config.name,
                      detail=self.process.why_exited())
        if self.on_process_exit is not None:
            self.on_process_exit()

    async def _watchdog(self) -> None:
        """A process that stops answering is as dead as one that exited."""
        while self.process is not None and self.process.running:
            await asyncio.sleep(self.options.watchdog)
            try:
                await self.health(timeout=min(_HEALTH_TIMEOUT, 2 * self.options.watchdog))
            except DriverError as exc:
                if self._stopping or not self.process.running:
                    return
                log.error("codex.app_server_hung", worker=self.config.name, error=str(exc))
                self.process.proc.kill()  # _watch_exit takes it from here
                return

    async def health(self, timeout: float = _HEALTH_TIMEOUT) -> CliHealth:
        """``account/read``: cheap, local (no upstream call), answers even mid-turn."""
        if self.process is None or not self.process.running or self.rpc.closed.is_set():
            raise DriverError(self.process.why_exited() if self.process
                              else "the codex app-server is not started")
        try:
            answer = await self.rpc.request("account/read", {"refreshToken": False},
                                            timeout=timeout)
        except (RpcError, RpcClosed, TimeoutError) as exc:
            raise DriverError(f"codex app-server did not answer account/read: {exc!r}") from exc
        account = answer.get("account")
        detail: dict[str, Any] = {"conversations": len(self._threads),
                                  "requires_openai_auth": answer.get("requiresOpenaiAuth"),
                                  "credentials": credentials_stamp(
                                      os.path.join(self.config.home, "auth.json"))}
        if account is None:
            # a provider that needs no OpenAI login (a custom model_provider) serves as it is
            ready = answer.get("requiresOpenaiAuth") is False
            return CliHealth(login="ready" if ready else "logged_out", version=self.version,
                             detail=detail)
        detail["auth"] = account.get("type")
        if account.get("planType"):
            detail["plan"] = account["planType"]
        if account.get("type") == "chatgpt" and detail["credentials"] != self._limits_read:
            self._limits_read = detail["credentials"]  # once per login
            self._background(self._read_limits())
        return CliHealth(login="ready", version=self.version, account=account.get("email"),
                         detail=detail)

    # --- quota ---------------------------------------------------------------------------

    def _on_account(self, method: str, params: Any) -> None:
        if method == "account/rateLimits/updated":
            self._report(codex_rate_limits(params, time.time()))

    def _report(self, windows: tuple[QuotaWindow, ...]) -> None:
        if windows and self.on_quota is not None:
            self.on_quota(windows)

    async def _read_limits(self) -> None:
        """``account/rateLimits/read``: a ChatGPT login's windows before any turn."""
        try:
            answer = await self.rpc.request("account/rateLimits/read", None,
                                            timeout=_HEALTH_TIMEOUT * 3)
        except RpcError as exc:  # -32600: not a ChatGPT login after all; nothing to read
            log.info("codex.rate_limits_unreadable", worker=self.config.name, code=exc.code)
            return
        except (RpcClosed, TimeoutError, DriverError) as exc:
            log.info("codex.rate_limits_unreadable", worker=self.config.name,
                     error=type(exc).__name__)
            return
        self._report(codex_rate_limits(answer, time.time()))

    def _background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def stop(self) -> None:
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        for thread in list(self._threads.values()):
            await thread.close()
        if self.process is not None:
            await self.process.close(grace=5.0)  # the app-server exits at stdin EOF
        if self._rpc is not None:
            await self._rpc.aclose()

    # --- conversations ---------------------------------------------------------------------

    async def open(self, setup: ConversationSetup) -> CodexThread:
        chat = self.config.mode == "chat"
        params: dict[str, Any] = {
            "cwd": setup.workspace or self.config.cwd, "model": setup.model,
            "approvalPolicy": "never",
            "sandbox": "read-only" if chat else self.options.sandbox, "ephemeral": True,
            # says when a model response is complete (how many tool calls it made)
            "experimentalRawEvents": self.options.raw_events,
            "dynamicTools": dynamic_tools(setup.tools),
        }
        if chat:
            params["environments"] = []
            params["baseInstructions"] = setup.system or DEFAULT_CHAT_SYSTEM
        elif setup.system:
            params["developerInstructions"] = setup.system
        # shielded: a request cancelled meanwhile still learns the thread's id, to close it
        starting = asyncio.ensure_future(self.rpc.request("thread/start", params))
        try:
            result = await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(self._close_started)
            raise
        except (RpcError, RpcClosed, TimeoutError) as exc:
            raise DriverError(f"codex thread/start failed: {exc}") from exc
        thread_id = result["thread"]["id"]
        queue = self.rpc.subscribe(thread_id)
        try:
            if setup.history:
                await self.rpc.request("thread/inject_items", {
                    "threadId": thread_id, "items": history_items(setup.history)})
        except BaseException as exc:  # a failed inject or a cancelled request: no thread left open
            self._close_later(thread_id)
            if isinstance(exc, (RpcError, RpcClosed, TimeoutError)):
                raise DriverError(f"codex thread/inject_items failed: {exc}") from exc
            raise
        thread = CodexThread(self, thread_id, setup.model, setup.effort, queue,
                             {codex_name(t.name): t.name for t in setup.tools})
        self._threads[thread_id] = thread
        return thread

    def _close_started(self, starting: asyncio.Future[Any]) -> None:
        if not starting.cancelled() and starting.exception() is None:
            thread = (starting.result() or {}).get("thread") or {}
            if thread.get("id"):
                self._close_later(str(thread["id"]))

    def _close_later(self, thread_id: str) -> None:
        """Unsubscribe a thread no conversation owns, in a task of its own (the
        request that opened it may be cancelled)."""
        self.forget(thread_id)
        self._background(self._unsubscribe(thread_id))

    async def _unsubscribe(self, thread_id: str) -> None:
        if self._rpc is None or self._rpc.closed.is_set():
            return
        try:
            await self._rpc.request("thread/unsubscribe", {"threadId": thread_id}, timeout=5)
        except (RpcError, RpcClosed, TimeoutError) as exc:
            log.info("codex.unsubscribe_failed", thread=thread_id, error=type(exc).__name__)

    def forget(self, thread_id: str) -> None:
        self._threads.pop(thread_id, None)
        if self._rpc is not None:
            self._rpc.unsubscribe(thread_id)

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid
