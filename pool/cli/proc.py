"""A vendor CLI process speaking newline-delimited JSON on stdio, for drivers.

Spawned in the worker child's process group (so the supervisor's group kill
takes it along) and with a parent-death signal (so a child that is SIGKILLed
or crashes, whose group the supervisor can no longer signal safely, leaves no
CLI behind), with a bounded tail of its stderr kept for the logs: scrubbed of
credential shapes and of the account's secrets (:mod:`pool.cli.scrub`) and
cut, never shown to a client (a CLI may print its tokens there).
:meth:`close` follows the notes: stdin EOF (let it finish), then SIGTERM,
then SIGKILL.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import shutil
import signal
import sys
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Sequence

import orjson
import structlog

from .driver import DriverError
from .scrub import scrub

__all__ = ["JsonLineProcess", "find_binary", "kill_and_reap", "run_probe"]

log = structlog.get_logger("pool.cli")
_LINE_LIMIT = 64 * 1024 * 1024  # one stream-json line can carry a whole tool result
_PR_SET_PDEATHSIG = 1
_LINE_KEPT = 4096   # characters of one stderr line kept (whole enough to scrub)
_EXCERPT = 300      # characters of scrubbed stderr a log line gets


def _die_with_parent() -> None:  # runs in the forked process, before exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def find_binary(command: Sequence[str] | None, default: str, env: Mapping[str, str]) -> list[str]:
    """``command`` as given, else ``default`` found on the CLI's ``PATH``."""
    if command:
        return list(command)
    found = shutil.which(default, path=env.get("PATH"))
    if found is None:
        raise DriverError(f"'{default}' is not on PATH; set the worker's command")
    return [found]


async def kill_and_reap(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL ``proc`` unless it has exited, and wait for it (SIGKILL cannot be
    ignored: the wait is short). Shielded: a cancelled caller still reaps it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    waiting = asyncio.ensure_future(proc.wait())
    try:
        await asyncio.shield(waiting)
    except asyncio.CancelledError:
        await waiting  # cancelled again: finish the reap, then let the cancel go on
        raise


async def run_probe(argv: Sequence[str], *, env: Mapping[str, str], cwd: str,
                    timeout: float) -> tuple[int, bytes, bytes]:
    """Run a short command (``--version``): its exit code, stdout and stderr.
    TimeoutError after ``timeout`` s, with the process killed and reaped."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=dict(env), cwd=cwd, preexec_fn=_die_with_parent)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    finally:
        await kill_and_reap(proc)
    return proc.returncode if proc.returncode is not None else -1, out, err


def _no_secrets() -> Iterable[str]:
    return ()


class JsonLineProcess:
    def __init__(self, proc: asyncio.subprocess.Process, label: str,
                 secrets: Callable[[], Iterable[str]] = _no_secrets) -> None:
        self.proc = proc
        self.label = label
        self.secrets = secrets   # the account's secret values, read when a tail is logged
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())

    @classmethod
    async def spawn(cls, argv: Sequence[str], *, env: Mapping[str, str], cwd: str,
                    label: str, new_session: bool = False,
                    secrets: Callable[[], Iterable[str]] = _no_secrets) -> JsonLineProcess:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=dict(env), cwd=cwd, limit=_LINE_LIMIT,
                preexec_fn=_die_with_parent, start_new_session=new_session)
        except OSError as exc:
            raise DriverError(f"cannot run {argv[0]}: {exc.strerror}") from None
        return cls(proc, label, secrets)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    def send(self, obj: Any) -> None:
        stdin = self.proc.stdin
        if stdin is None or stdin.is_closing():
            raise BrokenPipeError(f"{self.label} is not reading")
        stdin.write(orjson.dumps(obj) + b"\n")

    async def lines(self) -> AsyncIterator[dict[str, Any]]:
        """Each JSON object the CLI prints; ends at EOF. Lines that are not
        JSON objects (a CLI's stray output) are skipped."""
        stdout = self.proc.stdout
        assert stdout is not None
        while line := await stdout.readline():
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if type(obj) is dict:
                yield obj

    def why_exited(self) -> str:
        """For logs only: the exit status and the scrubbed end of its stderr."""
        code = self.proc.returncode
        tail = self.stderr_excerpt()
        return f"{self.label} exited" + (f" with {code}" if code is not None else "") + (
            f": {tail}" if tail else "")

    def stderr_excerpt(self) -> str:
        """The end of the CLI's stderr, scrubbed and cut (a log field, never a client's)."""
        tail = " | ".join(line for line in self.stderr_tail if line)
        if not tail:
            return ""
        try:
            secrets = list(self.secrets())
        except Exception:  # noqa: BLE001 - unreadable account files: the shapes still go
            secrets = []
        # scrubbed whole, then cut: a cut first could leave part of a secret unmatched
        clean = scrub(tail, secrets, limit=None)
        return clean if len(clean) <= _EXCERPT else "…" + clean[-_EXCERPT + 1:]

    async def close(self, grace: float = 2.0) -> None:
        """End the process: stdin EOF, ``grace`` s; SIGTERM, 3 s; SIGKILL. Returns
        once it is reaped, also when the caller's deadline cancels the sequence
        midway: then it is SIGKILLed and reaped on the way out, so no caller
        ever frees a slot while the process still runs."""
        proc = self.proc
        try:
            if proc.returncode is None:
                if proc.stdin is not None and not proc.stdin.is_closing():
                    proc.stdin.close()
                for signal_it, wait in ((None, grace), (proc.terminate, 3.0)):
                    if signal_it is not None:
                        with contextlib.suppress(ProcessLookupError):
                            signal_it()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await proc.wait()
                            break
        finally:
            await kill_and_reap(proc)
            self._stderr_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stderr_task

    async def _drain_stderr(self) -> None:
        stderr = self.proc.stderr
        assert stderr is not None
        while line := await stderr.readline():
            self.stderr_tail.append(line.decode(errors="replace").rstrip()[:_LINE_KEPT])
