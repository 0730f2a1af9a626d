"""The one small interface every vendor CLI sits behind.

How a cli worker runs
---------------------
The gateway supervises ``python -m pool.cli`` (a :class:`~pool.cli.worker.CliWorker`,
a :class:`~pool.process.ProcessWorker`) exactly like a local worker: readiness,
pings, restart with backoff, crash loops. That child builds one driver for the
worker's account (:func:`pool.cli.registry.make_driver`), ``await driver.start()``,
and then serves requests through :class:`pool.cli.host.CliHost`, which owns
everything that is not CLI-specific: which conversation a request continues
(session reuse), how many conversations stay warm (``max_conversations``,
idle and LRU eviction), the one-turn-at-a-time rule, held tool calls and their
timeout, translating :mod:`pool.cli.events` into canonical events, and the
account's status (login state, cooldown, counters).

Vendor processes are spawned by the driver in the child's process group (the
child runs ``start_new_session``), so when the supervisor kills the child's
group nothing is left behind.

Writing a driver
----------------
1. A class with ``cli = "name"`` whose constructor takes a :class:`DriverConfig`;
   register its import path in :data:`pool.cli.registry.DRIVERS`.
2. ``start()``: find the binary (``config.command`` or on ``PATH`` of
   ``config.env``), handshake if the CLI has one per account (Codex
   ``initialize``), and return a :class:`~pool.cli.events.CliHealth`. Raise
   :class:`DriverError` when the CLI cannot run at all (the child then exits
   and the supervisor backs off); a logged-out account is *not* an error:
   return ``login="logged_out"``.
3. ``open(setup)`` returns a :class:`Conversation`: a Claude process, a Codex
   thread... When ``setup.history`` is not empty and ``can_load_history`` is
   true, rebuild the CLI's session from it (Claude: write the transcript and
   ``--resume``); when false the host flattens history into the first turn.
4. ``Conversation.send(turn)`` and ``Conversation.answer_tools(answers)`` are
   async iterators of :data:`~pool.cli.events.CliEvent` that end with exactly
   one terminal event (``TurnFinished``, ``ToolsPending``, ``TurnFailed``,
   ``LoginRequired``). ``ToolsPending`` means every held client tool call of
   this step was yielded as ``PendingToolCall``; the host ends the HTTP
   answer there and later calls ``answer_tools`` with the client's results,
   whose iterator streams the rest of the turn.
   Report ``LoginRequired`` at the first sign (Claude: the first
   ``api_retry`` with 401 / ``authentication_failed``), not after the CLI's
   own retries; ``RateLimited`` before ``TurnFailed`` on a quota error.
5. ``interrupt()`` stops the running step; the open iterator then ends with
   its terminal event soon after (``TurnFailed(kind="interrupted")``). After
   an interrupt or any failure the host closes the conversation (its history
   is no longer what the gateway believes it is).
6. ``alive`` is false once the conversation cannot take another turn (its
   process exited); ``close()`` ends it (stdin EOF, then SIGTERM, SIGKILL).
7. ``health()`` is cheap (no upstream call when avoidable); ``stop()`` closes
   every conversation and process.

:class:`pool.cli.proc.JsonLineProcess` spawns a CLI speaking JSON lines on
stdio the right way (process group, parent-death signal, stderr tail, EOF →
SIGTERM → SIGKILL on close); :mod:`pool.cli.claude` is a complete example.

``mode`` is ``chat`` (the CLI's own tools off, ``setup.system`` as the whole
system prompt) or ``agent`` (the CLI runs its tools and reports them as
``ToolExecuted``/``ToolOutput``). Driver-specific settings arrive in
``config.options`` (the worker's ``[workers.cli_options]`` table), e.g. the
method names of the ``jsonrpc`` driver; validate them in the constructor and
raise :class:`DriverError` naming the option.

A fake of the CLI under ``tests/fakes/`` (stdlib Python, speaking the real
protocol, replies from a fake upstream) is how a driver is tested fast; the
real binary against a fake upstream under the ``cli`` marker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Protocol, Sequence

from .events import CliEvent, CliHealth, ConversationSetup, Mode, ToolAnswer, Turn
from .sandbox import Sandbox, key_dir

__all__ = ["DriverConfig", "CliDriver", "Conversation", "DriverError", "credentials_stamp"]


class DriverError(Exception):
    """The CLI cannot be used as configured (binary missing, bad option, failed handshake)."""


@dataclass(frozen=True, slots=True)
class DriverConfig:
    """What a driver is built from (the worker's settings, resolved).

    ``env`` is the complete environment for the vendor processes (the
    gateway's, then the worker's ``env``, secrets resolved); the driver adds
    the variables its CLI needs (config home, no telemetry). ``cwd`` is the
    fixed working directory of the account (Claude keys sessions by it) in
    chat mode; in agent mode each API key works in its own directory under
    ``workspace_root`` (:meth:`workspace`). ``sandbox`` is what a vendor
    process runs in (:mod:`pool.cli.sandbox`): spawn through :meth:`sandboxed`."""

    name: str
    cli: str
    home: str
    cwd: str
    command: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    mode: Mode = "chat"
    max_conversations: int = 4
    options: Mapping[str, Any] = field(default_factory=dict)
    tool_timeout: float = 300.0
    idle_timeout: float = 300.0  # silence from the CLI mid-turn after which it counts as hung
    workspace_root: str = ""  # agent mode: one workspace per API key under it
    sandbox: Sandbox = field(default_factory=Sandbox)
    proxy: str | None = field(default=None, repr=False)  # the account's egress proxy, if any

    def workspace(self, key: str | None) -> str:
        """The working directory of a conversation of ``key``: its own workspace
        in agent mode, the account's fixed ``cwd`` in chat mode (no tool runs)."""
        if self.mode != "agent" or not self.workspace_root:
            return self.cwd
        return os.path.join(self.workspace_root, key_dir(key))

    def every_cwd(self) -> list[str]:
        """Every directory a conversation of this account may have run in (the CLIs
        key their transcripts by it): the fixed ``cwd`` and, in agent mode, each
        key's workspace there is."""
        found = [self.cwd]
        if self.mode == "agent" and self.workspace_root and os.path.isdir(self.workspace_root):
            found += [os.path.join(self.workspace_root, name)
                      for name in sorted(os.listdir(self.workspace_root))]
        return found

    def sandboxed(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str]) -> list[str]:
        """``argv`` wrapped in the worker's sandbox, ``cwd`` (a key's workspace, or
        the root of all of them for a CLI serving every key from one process)
        created and writable."""
        self.sandbox.prepare(cwd)
        return self.sandbox.command(argv, cwd=cwd, writable=(cwd,), env=env)


class Conversation(Protocol):
    """One live upstream conversation; the host runs one step at a time on it."""

    @property
    def session_id(self) -> str | None: ...

    @property
    def alive(self) -> bool: ...

    def send(self, turn: Turn) -> AsyncIterator[CliEvent]: ...

    def answer_tools(self, answers: Sequence[ToolAnswer]) -> AsyncIterator[CliEvent]: ...

    async def interrupt(self) -> None: ...

    async def close(self) -> None: ...


class CliDriver(Protocol):
    """One account's CLI (see the module docstring for the contract)."""

    cli: str
    #: true when ``open`` can rebuild a session from ``setup.history``
    can_load_history: bool
    #: how many conversations may run a turn at the same time (Codex: several)
    concurrent_turns: bool

    async def start(self) -> CliHealth: ...

    async def open(self, setup: ConversationSetup) -> Conversation: ...

    async def health(self) -> CliHealth: ...

    async def stop(self) -> None: ...


def credentials_stamp(path: str) -> str | None:
    """What changes when a credentials file is rewritten (``None``: no file). A driver
    puts it in ``CliHealth.detail["credentials"]``, so that an account a turn found
    logged out is trusted again only once its credentials changed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{st.st_mtime_ns}:{st.st_size}:{st.st_ino}"
