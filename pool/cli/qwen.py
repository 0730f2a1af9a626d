"""The Qwen Code driver: one ``qwen`` process per conversation, stream-json.

``qwen --auth-type openai --input-format stream-json -o stream-json
--include-partial-messages --model M`` reads user messages and control
requests on stdin, one JSON per line, and runs one turn at a time. What the
driver does about Qwen's habits (verified on 0.15.10, and on 0.24.4 since):

* ``initialize`` goes first (without it a tool needing approval hangs with no
  ``can_use_tool``); the CLI answers with its session id.
* ``memory.enableManagedAutoMemory = false`` is written into the home's
  ``.qwen/settings.json``; otherwise every prompt costs a second upstream call.
* Chat mode: every built-in tool excluded and the system prompt replacing the
  agent prompt (1.8 KB requests instead of 64 KB). Agent mode: ``--approval-mode
  yolo``, and any ``can_use_tool`` is allowed.
* Nothing a client wrote goes on the command line: the system prompt is a
  private file named by ``QWEN_SYSTEM_MD`` (:mod:`pool.cli.qwen_prompt`), the
  model goes as ``--model=…``.
* ``interrupt`` ends the whole process, so the driver SIGKILLs it instead (it
  may ignore SIGTERM) and the next turn respawns with ``--resume <sid>``.
* A conversation opened with history gets it as a transcript written in
  Qwen's own session format and ``--resume`` (nothing is flattened).
* No credentials: the CLI prints a ``result`` error ("Missing API key ...")
  and exits 1; an upstream 401 comes back as assistant text (see
  :mod:`pool.cli.qwen_events`).
"""

from __future__ import annotations

import asyncio
import weakref
from pathlib import Path
from typing import Any

import structlog

from ..errors import BadRequest
from ..model import Message
from .driver import DriverConfig, DriverError
from .events import CliEvent, CliHealth, ConversationSetup, LoginRequired, TurnFailed
from .history import ends_in_tool_calls
from .private import private_dir
from .proc import find_binary, run_probe
from .prompt_file import remove_stale, safe_value
from .qwen_conversation import DEFAULT_CHAT_SYSTEM, HANDSHAKE_TIMEOUT, QwenConversation
from .qwen_home import QwenHome
from .qwen_launch import CHAT_EXCLUDED_TOOLS, direct_command
from .qwen_prompt import QwenPrompts
from .qwen_transcript import forget_sessions, write_transcript
from .scrub import account_secrets, scrub

__all__ = ["QwenDriver", "QwenConversation", "CHAT_EXCLUDED_TOOLS", "DEFAULT_CHAT_SYSTEM"]

log = structlog.get_logger("pool.cli.qwen")

_OPTIONS = {"auth_type", "approval_mode", "extra_args"}
class QwenDriver:
    """One Qwen Code account (``home`` is its ``HOME``)."""

    cli = "qwen"
    can_load_history = True   # a transcript written for --resume (pool/cli/qwen_transcript.py)
    concurrent_turns = False

    def __init__(self, config: DriverConfig) -> None:
        unknown = sorted(set(config.options) - _OPTIONS)
        if unknown:
            raise DriverError(f"cli_options.{unknown[0]}: not an option of the qwen driver "
                              f"(one of {', '.join(sorted(_OPTIONS))})")
        self.config = config
        self.auth_type = str(config.options.get("auth_type", "openai"))
        extra = config.options.get("extra_args", [])
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            raise DriverError("cli_options.extra_args: must be a list of strings")
        self.extra_args: tuple[str, ...] = tuple(extra)
        self.approval_mode = str(config.options.get(
            "approval_mode", "yolo" if config.mode == "agent" else "default"))
        self.home = Path(config.home)
        self.account = QwenHome(self.home, self.auth_type, config.env)
        self.command: list[str] = []   # the binary and its fixed arguments, set by start()
        self.version: str | None = None
        self.logged_out_reason: str | None = None
        self._conversations: weakref.WeakSet[QwenConversation] = weakref.WeakSet()
        self.prompts = QwenPrompts(str(self.home), config.cwd, self.env, self.argv)

    def argv(self, model: str, *options: str) -> list[str]:
        """A stream-json ``qwen`` command line (no client text but the checked model)."""
        return [*self.command, "--auth-type", self.auth_type, "--input-format", "stream-json",
                "-o", "stream-json", f"--model={model}", *options, *self.extra_args]

    # --- the process environment ---

    def env(self) -> dict[str, str]:
        env = dict(self.config.env)
        env.update(HOME=str(self.home), QWEN_CODE_NO_RELAUNCH="true", QWEN_DISABLE_AUTO_TITLE="1",
                   QWEN_CODE_DISABLE_PRECONNECT="1", NO_COLOR="1", TERM="dumb")
        return env

    # --- CliDriver ---

    async def start(self) -> CliHealth:
        self.command = direct_command(find_binary(self.config.command, "qwen", self.config.env),
                                      self.config.env)
        private_dir(self.home)
        remove_stale(self.home)
        private_dir(self.config.cwd)
        for cwd in self.config.every_cwd():  # left by a worker that died
            forget_sessions(self.home, cwd)
        self.account.write()
        try:  # a probe that hangs is killed (idle_timeout: silence that counts as hung)
            code, out, err = await run_probe(
                [*self.command, "--version"], env=self.env(), cwd=self.config.cwd,
                timeout=min(HANDSHAKE_TIMEOUT, self.config.idle_timeout))
        except (OSError, TimeoutError) as exc:
            raise DriverError(f"qwen: cannot run {self.command[0]}: {exc!r}") from None
        if code != 0:
            raise DriverError(f"qwen --version exited {code}: "
                              f"{scrub(err.decode(errors='replace').strip(), self.secrets())}")
        self.version = out.decode(errors="replace").strip().splitlines()[-1] if out.strip() else None
        log.info("cli.qwen.started", worker=self.config.name, version=self.version)
        return await self.health()

    async def health(self) -> CliHealth:
        login = "ready"
        if self.logged_out_reason is not None or not self.account.has_credentials():
            login = "logged_out"
        detail: dict[str, Any] = {"auth_type": self.auth_type,
                                  "conversations": sum(1 for c in self._conversations if c.alive)}
        if self.logged_out_reason:
            detail["reason"] = self.logged_out_reason
        return CliHealth(login=login, version=self.version, account=None, detail=detail)

    def secrets(self) -> set[str]:
        """The account's secret values (scrubbed from what the CLI prints)."""
        return account_secrets(self.home, self.config.env)

    async def open(self, setup: ConversationSetup) -> QwenConversation:
        if not safe_value(setup.model, 128):
            raise BadRequest("model: not a value the qwen CLI takes", param="model")
        conversation = QwenConversation(self, setup)
        if setup.history and not ends_in_tool_calls(setup.history):
            conversation.resume_from(self.transcript(conversation.cwd, setup))
        elif setup.history:  # written with the results the first turn brings
            conversation.results_first = True
        self._conversations.add(conversation)
        return conversation

    def transcript(self, cwd: str, setup: ConversationSetup,
                   results: Message | None = None) -> str:
        """The conversation's history (and the results that answer its last
        calls) written as a Qwen session; its id."""
        history = setup.history if results is None else (*setup.history, results)
        return write_transcript(self.home, cwd, history, version=self.version,
                                client_tools=frozenset(t.name for t in setup.tools))

    async def stop(self) -> None:
        await asyncio.gather(*(c.close() for c in list(self._conversations)),
                             return_exceptions=True)

    def note_terminal(self, event: CliEvent) -> None:
        """Remember a logged-out account until its credentials change (a restart)."""
        if isinstance(event, LoginRequired):
            self.logged_out_reason = scrub(event.message, self.secrets())
        elif not isinstance(event, TurnFailed):
            self.logged_out_reason = None
