"""The gateway's side of a cli worker: a supervised ``python -m pool.cli``
child (see :mod:`pool.cli.__main__`) driving one account's vendor CLI.

Readiness, pings, restart with backoff and crash loops come from
:class:`~pool.process.ProcessWorker`. On top: the account's status (CLI
version, account, login state, conversations, cooldown) polled from the child
and shown in ``/internal/workers``; a logged-out account is not picked
(``unavailable_reason`` says why); and the session index is kept: written
after a clean answer, dropped on an error and for every new incarnation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from hashlib import blake2b
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping

import orjson
import structlog

from ..childenv import child_environment
from ..egress import proxy_reachable
from ..errors import GatewayError
from ..accumulate import Accumulator
from ..model import ChatRequest, Event, Finish, Usage
from ..process import ProcessSpec, ProcessWorker
from ..quota import AccountQuota
from ..supervisor import SupervisorPolicy
from ..worker import Capabilities, WorkerState
from .counted import CountedQuota, CountedWindow
from .history import answer_message, conversation_hash, split, system_text
from .index import SessionIndex
from .limits import check_request
from .sandbox import Sandbox

__all__ = ["CliSpec", "CliWorker"]

log = structlog.get_logger("pool.cli")
ENV_CONFIG = "POOLGATE_CLI_CONFIG"
#: the CLIs that can call tools the API client defines (others: a 400 naming ``tools``)
CLIENT_TOOLS = frozenset({"claude", "codex", "qwen", "gemini"})
#: the CLIs that take images in a user turn
IMAGES = frozenset({"claude"})
_POLICY_FIELDS = ("ready_timeout", "health_interval", "health_timeout", "backoff_initial",
                  "backoff_max", "crash_loop_threshold", "crash_loop_window", "stop_timeout")


@dataclass(frozen=True, slots=True)
class CliSpec:
    name: str
    cli: str
    models: tuple[str, ...]
    home: str
    aliases: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # secrets resolved
    env_passthrough: tuple[str, ...] = ()  # names of the gateway's variables the CLI also gets
    mode: str = "chat"
    max_conversations: int = 4
    options: Mapping[str, Any] = field(default_factory=dict)
    tool_timeout: float = 300.0
    conversation_idle: float = 900.0
    idle_timeout: float = 300.0
    sandbox: Sandbox = field(default_factory=Sandbox)  # resolved (pool/cli/sandbox.py)
    workspace_root: str | None = None  # agent mode: one workspace per key; default <home>-workspaces
    login_timeout: float = 600.0  # a login (its code included) ends by then
    login_probe_interval: float = 60.0  # a refused account is tried again after this, doubling
    supervision: SupervisorPolicy = field(default_factory=SupervisorPolicy)
    # the account's egress proxy (its variables are in env); checked on the health interval
    proxy: str | None = field(default=None, repr=False)
    # windows the gateway counts the account's tokens in (for CLIs that report no quota)
    quota_windows: tuple[CountedWindow, ...] = ()
    # percent of the quota kept back from new conversations (pool/headroom.py); None: the model's
    quota_reserve: float | None = None

    @property
    def cwd(self) -> str:
        """The account's fixed working directory (Claude keys sessions by it)."""
        return os.path.join(os.path.abspath(os.path.expanduser(self.home)), "workspace")

    @property
    def workspaces(self) -> str:
        """Where agent mode's per-key workspaces live: outside the credential home."""
        if self.workspace_root:
            return os.path.abspath(os.path.expanduser(self.workspace_root))
        return os.path.abspath(os.path.expanduser(self.home)).rstrip("/") + "-workspaces"

    def child_config(self, base_env: Mapping[str, str]) -> dict[str, Any]:
        return {"name": self.name, "cli": self.cli,
                "home": os.path.abspath(os.path.expanduser(self.home)), "cwd": self.cwd,
                "command": list(self.command) or None,
                # the allow-listed part of the gateway's environment, never its secrets
                "env": {**child_environment(base_env, self.env_passthrough), **self.env},
                "mode": self.mode, "max_conversations": self.max_conversations,
                "options": dict(self.options), "tool_timeout": self.tool_timeout,
                "conversation_idle": self.conversation_idle, "idle_timeout": self.idle_timeout,
                "workspace_root": self.workspaces, "sandbox": self.sandbox.to_dict(),
                "proxy": self.proxy,  # (also in env): the host tells it down from a logout
                # a logged-out account is probed again on the health interval
                "login_recheck": self.supervision.health_interval}

    def process_spec(self, base_env: Mapping[str, str]) -> ProcessSpec:
        config = orjson.dumps(self.child_config(base_env)).decode()
        policy = self.supervision
        return ProcessSpec(
            name=self.name, command=(sys.executable, "-m", "pool.cli"), models=self.models,
            aliases=dict(self.aliases), capacity=self.max_conversations,
            env={ENV_CONFIG: config}, env_passthrough=self.env_passthrough,
            **{f: getattr(policy, f) for f in _POLICY_FIELDS})


class CliWorker(ProcessWorker):
    kind = "cli"

    def __init__(self, spec: CliSpec, *, base_env: Mapping[str, str] = {},
                 sessions: SessionIndex | None = None) -> None:
        super().__init__(spec.process_spec(base_env), base_env=base_env,
                         capabilities=Capabilities(images=False, logprobs=False, max_n=1,
                                                   tools=spec.cli in CLIENT_TOOLS,
                                                   token_ids=False))
        self.capabilities.images = spec.cli in IMAGES
        self.cli_spec = spec
        self.sessions = sessions
        self._status: dict[str, Any] = {}
        self._poller: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        self._proxy_down = False
        self._signer: str | None = None  # the account that signs (see signing_account)
        self._quota = AccountQuota()
        self._counted = CountedQuota(spec.quota_windows)

    # --- status -------------------------------------------------------------------------

    #: set by the gateway while it logs the account in (hook for app/logins.py)
    login_override: str | None = None
    #: the account's state machine (pool/cli/account.py), set by the gateway
    account: Any = None

    @property
    def signs_per_account(self) -> bool:
        """Whether this account's signed thinking is refused by any other
        (Claude's is: pool/signatures.py keeps it home)."""
        return self.cli_spec.cli == "claude"

    @property
    def signing_account(self) -> str:
        """Who signs this worker's thinking: the account the CLI reports (its
        e-mail, hashed), else its API key (hashed), else the worker's name.
        Not the name alone: replicas on other hosts run other accounts under
        the same worker names, and share what they noted through Redis."""
        who = self._status.get("account") or self.cli_spec.env.get("ANTHROPIC_API_KEY")
        if who:  # kept: a restart forgets the status, not whose account this is
            self._signer = "cli:" + blake2b(str(who).encode(), digest_size=12).hexdigest()
        return self._signer or f"cli:{self.name}"

    @property
    def process_state(self) -> WorkerState:
        """The process's state, whatever the account's login says."""
        return super().state

    @property
    def login(self) -> str | None:
        return self.login_override or self._status.get("login")

    @property
    def state(self) -> WorkerState:
        state = super().state
        if state is WorkerState.READY:
            if self._proxy_down or self.login == "logged_out":
                return WorkerState.UNHEALTHY
            if self.login == "logging_in":
                return WorkerState.LOGGING_IN
        return state

    @property
    def unavailable_reason(self) -> str | None:
        """Why the pool does not pick this worker, in words a client may read."""
        if self._proxy_down:
            return f"the egress proxy of worker {self.name} cannot be reached"
        if self.login == "logged_out":
            return f"the {self.cli_spec.cli} account of worker {self.name} is logged out"
        if self.login == "logging_in":
            return f"the {self.cli_spec.cli} account of worker {self.name} is logging in"
        return None

    @property
    def cooldown_until(self) -> float | None:
        until = self._status.get("cooldown_until")
        return until if until is not None and until > time.time() else None

    @property
    def quota(self) -> AccountQuota:
        """The account's usage windows as the child last reported them (the
        vendor's numbers), else as counted against ``quota_windows``; empty when
        nothing is known. The numbers are the account's, not the process's: a
        new incarnation that knows nothing yet leaves the last ones standing."""
        return self._quota if self._quota.windows else self._counted.quota()

    def _take_status(self, status: Any) -> None:
        self._status = dict(status)
        reported = AccountQuota.from_json(self._status.get("quota"))
        if reported.windows:
            self._quota = self._quota.merged(reported.windows)

    def info(self) -> dict[str, Any]:
        status = self._status
        return {**super().info(), "cli": self.cli_spec.cli, "version": status.get("version"),
                "account": status.get("account"), "login": self.login,
                "conversations": status.get("conversations", 0),
                "held_tool_calls": status.get("held_tool_calls", 0),
                "cooldown_until": self.cooldown_until, "mode": self.cli_spec.mode,
                "quota": self.quota.to_json(time.time()),
                "sandbox": self.cli_spec.sandbox.kind,
                "account_state": self.account.state.value if self.account is not None else None}

    def session_counts(self) -> dict[str, int]:
        return dict(self._status.get("sessions") or {})

    async def refresh(self) -> None:
        """Ask the child for the account's status (no-op while it is not running),
        and check the account's egress proxy."""
        if self.cli_spec.proxy is not None:
            down = not await proxy_reachable(self.cli_spec.proxy, self.spec.health_timeout)
            if down != self._proxy_down:
                log.warning("cli.proxy_down" if down else "cli.proxy_up", worker=self.name)
            self._proxy_down = down
        child = self._child()
        if child is None or super().state not in (WorkerState.READY, WorkerState.DRAINING):
            return
        with contextlib.suppress(GatewayError):
            status = await child.call("status", None, timeout=self.spec.health_timeout)
            self._take_status(status)

    async def start(self) -> bool:
        ready = await super().start()
        await self.refresh()
        self._poller = asyncio.ensure_future(self._poll())
        return ready

    async def stop(self) -> None:
        """Stop the process until :meth:`restart` (what a bundle import needs)."""
        await self.drain(self.spec.stop_timeout)
        await self.supervisor.stop()
        self.resume()

    async def probe_login(self) -> None:
        """Have the child try the refused account with a one-token turn."""
        child = self._child()
        if child is None or super().state is not WorkerState.READY:
            return
        with contextlib.suppress(GatewayError):
            status = await child.call("probe_login", {"model": self.models[0]},
                                      timeout=self.spec.health_timeout + 120.0)
            self._take_status(status)

    async def aclose(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        await super().aclose()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.spec.health_interval)
            await self.refresh()

    async def _launch(self) -> Any:
        # a new incarnation holds no conversation: forget what the old one held
        self._status = {}
        if self.sessions is not None:
            await self.sessions.drop_worker(self.name)
        child = await super()._launch()
        asyncio.get_running_loop().call_later(0.2, lambda: self._soon(self.refresh()))
        return child

    # --- the request ----------------------------------------------------------------------

    # stream() below wraps the child's events with session bookkeeping: the
    # gateway must not take the batches of ProcessWorker.stream_batches around it
    stream_batches = None  # type: ignore[assignment]

    async def stream(self, request: ChatRequest) -> AsyncIterator[Event]:
        check_request(request)
        history, new = split(request)
        # the index is read by request_prefix_hash: the client's system text, not the host's default
        system = system_text(request.messages)
        answer = Accumulator()  # what the client will send back, for the session hash
        finished = False
        tokens = [0, 0]  # the latest input and output counts (counted quota windows)
        try:
            async for event in super().stream(request):
                answer.feed(event)
                if type(event) is Finish:
                    finished = True
                elif type(event) is Usage:
                    tokens = [event.input_tokens if event.input_tokens is not None else tokens[0],
                              event.output_tokens if event.output_tokens is not None
                              else tokens[1]]
                yield event
        except GatewayError as exc:
            self._note_failure(exc)
            raise
        finally:
            self._counted.add(sum(tokens))
            self._soon(self.refresh())
            if self.sessions is not None:
                if history:
                    await self.sessions.drop(conversation_hash(
                        request.key_name, request.model, system, request.tools, history))
                if finished:
                    key = conversation_hash(request.key_name, request.model, system,
                                            request.tools, (*history, *new,
                                                            answer_message(answer.finish().parts)))
                    await self.sessions.put(key, self.name)

    def _note_failure(self, exc: GatewayError) -> None:
        if exc.code == "login_required":
            self._status["login"] = "logged_out"
            log.warning("cli.worker_logged_out", worker=self.name)
        elif exc.code == "rate_limited":
            self._status["cooldown_until"] = time.time() + (exc.retry_after or 60)

    def _soon(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
