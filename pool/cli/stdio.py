"""A vendor CLI process spoken to in JSON lines over stdin/stdout.

Shared by the drivers whose CLI reads one JSON object per line and writes one
per line (Qwen Code stream-json, JSON-RPC agents). Lines that are not JSON
objects (banners, warnings) are skipped; stderr is drained into a short tail
kept for error messages, so a chatty CLI can never block on a full pipe.

The process is started in the caller's process group on purpose: the cli
worker child runs in a session of its own, so when the supervisor kills that
group nothing a driver started is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections import deque
from typing import Any, Mapping, Sequence

__all__ = ["JsonLineProcess", "STREAM_LIMIT"]

#: one stdout line may hold a whole transcript (Claude/Qwen ``assistant`` events)
STREAM_LIMIT = 64 * 1024 * 1024
_STDERR_TAIL_LINES = 40


class JsonLineProcess:
    """One spawned CLI. ``read()`` returns the next JSON object, or None at EOF."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self._stderr: deque[str] = deque(maxlen=_STDERR_TAIL_LINES)
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())
        self._write_lock = asyncio.Lock()

    @classmethod
    async def spawn(cls, argv: Sequence[str], *, env: Mapping[str, str],
                    cwd: str) -> JsonLineProcess:
        """Start ``argv``; raises OSError when the binary cannot be run."""
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=dict(env), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=STREAM_LIMIT)
        return cls(proc)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    @property
    def running(self) -> bool:
        return self._proc.returncode is None

    def stderr_tail(self, lines: int = 5) -> str:
        """The last lines the CLI wrote to stderr (for error messages)."""
        return "\n".join(list(self._stderr)[-lines:])

    async def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        with contextlib.suppress(Exception):
            async for raw in self._proc.stderr:
                text = raw.decode("utf-8", "replace").rstrip()
                if text:
                    self._stderr.append(text)

    async def send(self, message: Mapping[str, Any]) -> bool:
        """Write one JSON line; False when the CLI's stdin is gone."""
        stdin = self._proc.stdin
        if stdin is None or stdin.is_closing():
            return False
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        async with self._write_lock:
            try:
                stdin.write(data)
                await stdin.drain()
            except (BrokenPipeError, ConnectionResetError, RuntimeError):
                return False
        return True

    async def read(self) -> dict[str, Any] | None:
        """The next JSON object the CLI printed, or None once stdout ended."""
        stdout = self._proc.stdout
        assert stdout is not None
        while True:
            try:
                raw = await stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):  # a line past STREAM_LIMIT
                continue
            if not raw:
                return None
            raw = raw.strip()
            if not raw.startswith(b"{"):
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj

    async def wait(self) -> int:
        code = await self._proc.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._stderr_task, 1.0)
        return code

    def kill(self) -> None:
        """SIGKILL, now (Qwen ignores SIGTERM while it waits on a permission)."""
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGKILL)

    async def close(self, grace: float = 2.0) -> None:
        """stdin EOF, then SIGTERM after ``grace`` seconds, then SIGKILL."""
        stdin = self._proc.stdin
        if stdin is not None and not stdin.is_closing():
            with contextlib.suppress(Exception):
                stdin.close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and self._proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.send_signal(sig)
            try:
                await asyncio.wait_for(self._proc.wait(), grace)
                break
            except asyncio.TimeoutError:
                continue
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._stderr_task, 1.0)
