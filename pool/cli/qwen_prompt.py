"""A Qwen conversation's system prompt, given as a file, never as an argument.

Qwen Code parses its options with yargs: a ``--system-prompt`` value that
starts with ``-`` is dropped (0.15.10 then exits with its help), one that
reads ``--openai-base-url=…`` becomes that option, ``ps`` shows it to every
local user and 128 KiB of it cannot start a process. Qwen also reads its
base system prompt from the file named by ``QWEN_SYSTEM_MD`` (for every
request, so the file lives as long as the conversation) and appends to it
what ``--system-prompt`` would get (tool list, memory): that file is how the
client's prompt gets in (a :class:`~pool.cli.prompt_file.PromptFile`).

* Chat mode: the file holds the client's system prompt (or the default), which
  replaces Qwen's agent prompt as ``--system-prompt`` did.
* Agent mode: Qwen's own agent prompt stays and the client's is appended, as
  ``--append-system-prompt`` did. Qwen has no file form of that option, so the
  driver asks Qwen for its prompt once per model: a probe process with
  ``QWEN_WRITE_SYSTEM_MD`` writes it at startup (after ``initialize``, no
  upstream call; verified on 0.15.10), and the file then holds that prompt, a
  ``---`` rule and the client's text (the layout Qwen gives appended text).
  Without a probe result (a CLI that writes nothing) the client's prompt
  replaces Qwen's, as in chat mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Callable, Sequence

import orjson
import structlog

from .prompt_file import PromptFile

__all__ = ["QwenPrompts"]

log = structlog.get_logger("pool.cli.qwen")

_PROBE_TIMEOUT = 60.0


class QwenPrompts:
    """The system prompt files of one Qwen account's conversations."""

    def __init__(self, home: str, cwd: str, env: Callable[[], dict[str, str]],
                 probe_argv: Callable[[str], Sequence[str]]) -> None:
        self.home, self.cwd, self.env, self.probe_argv = home, cwd, env, probe_argv
        self._agent_prompts: dict[str, str | None] = {}   # model -> Qwen's own prompt
        self._lock = asyncio.Lock()

    async def file_for(self, mode: str, model: str, system: str | None,
                       default: str) -> PromptFile | None:
        """The file a conversation's ``QWEN_SYSTEM_MD`` names; None: Qwen's own prompt."""
        if mode == "chat":
            return PromptFile(self.home, system or default, "system.md")
        if not system:
            return None
        base = await self._agent_prompt(model)
        text = f"{base.rstrip()}\n\n---\n\n{system.strip()}" if base else system
        return PromptFile(self.home, text, "system.md")

    async def _agent_prompt(self, model: str) -> str | None:
        async with self._lock:
            if model not in self._agent_prompts:
                self._agent_prompts[model] = await self._probe(model)
            return self._agent_prompts[model]

    async def _probe(self, model: str) -> str | None:
        """Qwen's agent prompt for ``model``, written by a process that makes no turn."""
        out = PromptFile(self.home, "", "agent.md")
        os.unlink(out.path)
        env = {**self.env(), "QWEN_WRITE_SYSTEM_MD": out.path}
        env.pop("QWEN_SYSTEM_MD", None)
        argv = self.probe_argv(model)
        proc: asyncio.subprocess.Process | None = None
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, cwd=self.cwd, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            assert proc.stdin is not None
            proc.stdin.write(orjson.dumps({"type": "control_request", "request_id": "probe",
                                           "request": {"subtype": "initialize", "hooks": None}}) + b"\n")
            async with asyncio.timeout(_PROBE_TIMEOUT):
                size = -1
                while proc.returncode is None and (size <= 0 or size != _size(out.path)):
                    size = _size(out.path)  # written at once, but wait until it stops growing
                    await asyncio.sleep(0.1)
            with open(out.path, encoding="utf-8") as fh:
                return fh.read() or None
        except (OSError, TimeoutError) as exc:
            log.warning("cli.qwen.prompt_probe_failed", model=model, error=type(exc).__name__)
            return None
        finally:
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
            out.remove()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1
