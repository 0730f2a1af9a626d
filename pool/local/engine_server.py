"""An inference engine's own server run from the worker child, for the ``vllm``
and ``sglang`` engines: the subprocess under a guard that takes its whole
process group down with the worker (:class:`ServerProcess`), readiness,
the loopback HTTP client and its SSE reader (:class:`_ServerEngine`).
The engines themselves (``pool/local/vllm.py``, ``pool/local/sglang.py``)
add only their command line and request/stream shapes."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import time
from typing import Any, AsyncIterator, Mapping, Sequence, TextIO

import aiohttp

from .engine import EngineError, GenParams, Tokenizer

__all__ = ["ServerProcess", "ServerStartError", "free_port"]

_PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError):
    """The inference server exited, or never answered, before it was ready.
    ``log_tail`` holds the last lines it printed."""

    def __init__(self, message: str, log_tail: Sequence[str] = ()) -> None:
        tail = "".join(f"\n  | {line}" for line in log_tail)
        super().__init__(message + (f"; its last output:{tail}" if tail else ""))
        self.log_tail = list(log_tail)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# The guard: the process spawn() starts, leader of the server's process group.
# It runs the server as its child and, the moment the worker child is gone (the
# pipe it holds the write end of reads EOF, or the kernel's parent-death signal
# SIGUSR1 arrives), SIGKILLs the whole group: the server and every process the
# server forked (vLLM's engine core and workers, which PR_SET_PDEATHSIG on the
# server alone would leave running). A group SIGTERM from stop() reaches the
# server directly; the guard outlives it and exits with the server's status.
_GUARD = r"""
import os, signal, subprocess, sys, threading
fd = int(sys.argv[1])
def end(*_):
    os.killpg(os.getpgrp(), signal.SIGKILL)
def watch():
    try:
        while os.read(fd, 512):
            pass
    except OSError:
        pass
    end()
signal.signal(signal.SIGTERM, lambda *_: None)  # handlers, unlike SIG_IGN, reset at exec
signal.signal(signal.SIGINT, lambda *_: None)
signal.signal(signal.SIGUSR1, end)
try:
    server = subprocess.Popen(sys.argv[2:])
except OSError as exc:
    print(f"cannot start {sys.argv[2]!r}: {exc}", flush=True)
    sys.exit(127)
threading.Thread(target=watch, daemon=True).start()
while True:
    try:
        code = server.wait()
        break
    except InterruptedError:
        pass
sys.exit(code if code >= 0 else 128 - code)
"""


def _prctl() -> Any:
    """libc's ``prctl``, looked up in the parent: the forked child only calls it."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the guard's pipe still ends the server
        return None


def _guard_setup(prctl: Any, parent: int) -> None:
    """Runs in the forked guard before exec: the kernel sends it SIGUSR1 when
    the thread that forked it (the worker child's event loop) ends."""
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.killpg(0, signal.SIGKILL)


class ServerProcess:
    """An HTTP inference server run as a supervised subprocess.

    Its stdout and stderr are merged, copied line by line to ``log`` (default
    our stderr) with a ``[name]`` prefix, and the last ``tail`` lines kept for
    error messages."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], name: str,
                 log: TextIO | None = None, tail: int = 60) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.name = name
        self._log = log
        self._tail: collections.deque[str] = collections.deque(maxlen=tail)
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._exited: asyncio.Task[int] | None = None
        self._lifeline: int | None = None  # the pipe's write end: the guard reads EOF when we are gone

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    def log_tail(self) -> list[str]:
        return list(self._tail)

    async def spawn(self) -> None:
        """Start the server under its guard (see ``_GUARD``): ``pid`` is the
        guard's, which is also the process group's id."""
        parent, prctl = os.getpid(), _prctl()
        read_end, self._lifeline = os.pipe()  # both non-inheritable: only the guard gets read_end
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _GUARD, str(read_end), *self.argv, env=self.env,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, pass_fds=(read_end,), limit=1 << 20,
                process_group=0,  # its own group: stop() signals the server and its helpers together
                preexec_fn=lambda: _guard_setup(prctl, parent))
        except BaseException:
            os.close(self._lifeline)
            self._lifeline = None
            raise
        finally:
            os.close(read_end)
        self._reader = asyncio.create_task(self._pump(self.proc.stdout), name=f"{self.name}-log")
        self._exited = asyncio.create_task(self.proc.wait(), name=f"{self.name}-wait")

    async def _pump(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        prefix = f"[{self.name} {self.pid}] "
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line past the reader's limit: take what there is
                raw = await stream.read(65536)
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._tail.append(line)
            out = self._log or sys.stderr
            try:
                out.write(prefix + line + "\n")
                out.flush()
            except (OSError, ValueError):
                pass

    async def wait_ready(self, url: str, session: aiohttp.ClientSession, *, timeout: float,
                         interval: float = 0.25) -> None:
        """Poll ``GET url`` until it answers 200; raise :class:`ServerStartError`
        if the process exits first or ``timeout`` seconds pass."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.returncode is not None:
                await self._drain()
                raise ServerStartError(
                    f"{self.name} server exited with code {self.proc.returncode} before it was ready",
                    self.log_tail())
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(f"{self.name} server not ready after {timeout:.0f}s", self.log_tail())
            assert self._exited is not None
            await asyncio.wait({self._exited}, timeout=interval)  # wakes early if the process dies

    async def _drain(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._reader), 2)

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, wait up to ``grace`` s for the server,
        then SIGKILL whatever of the group is left."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # process_group=0 made it the group's leader
        if proc.returncode is None:
            _killpg(pgid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace)
            except asyncio.TimeoutError:
                pass
        _killpg(pgid, signal.SIGKILL)  # stragglers (engine-core workers) and a stuck leader
        await proc.wait()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        deadline = time.monotonic() + 5.0
        while _group_alive(pgid) and time.monotonic() < deadline:  # SIGKILL lands asynchronously
            await asyncio.sleep(0.05)
        await self._drain()
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def iter_sse(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The ``data:`` payloads of a server-sent-event stream (one per event).

    Lines are split here rather than by aiohttp's ``readline``, which refuses
    lines past 64 KiB: vLLM's first chunk carries the whole prompt's ids."""
    buf = bytearray()
    data: list[str] = []
    async for piece in resp.content.iter_any():
        buf += piece
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            line = bytes(buf[start:nl]).rstrip(b"\r")
            start = nl + 1
            if not line:
                if data:
                    yield "\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                data.append(line[6:].decode() if line.startswith(b"data: ") else line[5:].decode())
        del buf[:start]
    if buf.startswith(b"data:"):
        data.append(bytes(buf[5:]).decode().strip())
    if data:
        yield "\n".join(data)


async def error_text(resp: aiohttp.ClientResponse) -> str:
    """The message of an error answer, whatever shape it has."""
    text = await resp.text()
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip() or resp.reason or str(resp.status)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)
        if isinstance(err, str):
            return err
        return str(body.get("message") or body.get("detail") or body)
    return text


def _server_env(env: Mapping[str, str], gpu_ids: tuple[int, ...] | None,
                defaults: Mapping[str, str]) -> dict[str, str]:
    """Ours, less what belongs to our interpreter, then the engine's
    ``defaults``, the GPUs, and last the caller's ``env``."""
    out = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
        out.pop(name, None)  # our venv's settings must not leak into the server's interpreter
    out.update(defaults)
    if gpu_ids is not None:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
    out.update(env)
    return out


class _ServerEngine:
    """What the vLLM and SGLang engines share: the subprocess, the HTTP client,
    start/aclose/healthy."""

    name = ""
    _ready_path = "/health"
    _health_path = "/health"

    def __init__(self, model: str, *, context_length: int | None = None, capacity: int = 8,
                 gpu_ids: tuple[int, ...] | None = None, python: str | None = None,
                 port: int | None = None, extra_args: tuple[str, ...] = (),
                 env: Mapping[str, str] | None = None, ready_timeout: float = 600.0,
                 tokenizer: Tokenizer | None = None, log: TextIO | None = None,
                 stop_grace: float = 10.0) -> None:
        self.model = model
        self._context_length = context_length
        self.capacity = capacity
        self.gpu_ids = tuple(gpu_ids) if gpu_ids is not None else None
        self.python = python or sys.executable
        self.port = port
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.ready_timeout = ready_timeout
        self.stop_grace = stop_grace
        self._tokenizer = tokenizer
        self._log = log
        self.server: ServerProcess | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- what the subclasses say -------------------------------------------------

    def command(self) -> list[str]:
        raise NotImplementedError

    #: environment the server always gets unless ``env`` says otherwise
    env_defaults: Mapping[str, str] = {}

    def server_env(self) -> dict[str, str]:
        return _server_env(self.env, self.gpu_ids, self.env_defaults)

    # -- Engine ----------------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise RuntimeError(f"{self.name} engine not started")
        return self._tokenizer

    @property
    def context_length(self) -> int:
        if self._context_length is None:
            raise RuntimeError(f"{self.name} engine not started")
        return self._context_length

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        if self.port is None:
            self.port = free_port()
        if self._tokenizer is None:
            from .hf import HFTokenizer

            self._tokenizer = await asyncio.to_thread(HFTokenizer.from_pretrained, self.model)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.capacity + 4, force_close=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        self.server = ServerProcess(self.command(), env=self.server_env(), name=self.name, log=self._log)
        try:
            await self.server.spawn()
            await self.server.wait_ready(self.base_url + self._ready_path, self._session,
                                         timeout=self.ready_timeout)
            await self._after_ready()
        except BaseException:
            await self.aclose()
            raise

    async def _after_ready(self) -> None:
        if self._context_length is None:
            self._context_length = await self._served_context_length()

    async def _served_context_length(self) -> int:
        """``max_model_len`` from ``GET /v1/models`` (vLLM and SGLang both give it)."""
        assert self._session is not None
        async with self._session.get(self.base_url + "/v1/models") as resp:
            resp.raise_for_status()
            body = await resp.json()
        return int(body["data"][0]["max_model_len"])

    async def healthy(self) -> bool:
        """The server process is alive and answers its health check."""
        if self.server is None or self.server.returncode is not None or self._session is None:
            return False
        try:
            async with self._session.get(self.base_url + self._health_path,
                                         timeout=aiohttp.ClientTimeout(total=10)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.server is not None:
            await self.server.stop(self.stop_grace)

    def _check(self, prompt_ids: list[int], params: GenParams) -> aiohttp.ClientSession:
        if self._session is None or self.server is None:
            raise RuntimeError(f"{self.name} engine not started")
        if self.server.returncode is not None:
            raise EngineError(f"the {self.name} server has exited (code {self.server.returncode})",
                              status=503)
        if not prompt_ids:
            raise EngineError("the prompt is empty", param="prompt")
        if params.max_tokens < 1:
            raise EngineError("max_tokens must be at least 1", param="max_tokens")
        if len(prompt_ids) >= self.context_length:
            raise EngineError(f"the prompt has {len(prompt_ids)} tokens; this model's context holds "
                              f"{self.context_length}", param="messages")
        return self._session

    async def _events(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """POST ``body`` and yield the JSON events of the streamed answer (up to
        ``[DONE]``). Errors become :class:`EngineError`; closing this iterator
        drops the connection, which both servers take as an abort."""
        session = self._session
        assert session is not None
        try:
            resp = await session.post(self.base_url + path, json=body)
        except aiohttp.ClientError as exc:
            raise EngineError(f"the {self.name} server did not answer: {exc}", status=503) from exc
        try:
            if resp.status != 200:
                message = await error_text(resp)
                # the server's own 503 (not ready, overloaded) stays one; another 5xx is a bad gateway
                status = resp.status if 400 <= resp.status < 500 or resp.status == 503 else 502
                raise EngineError(f"{self.name}: {message}", status=status)
            async for data in iter_sse(resp):
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if isinstance(event, dict) and ("error" in event or event.get("object") == "error"):
                    err = event.get("error", event)
                    message = err.get("message", err) if isinstance(err, dict) else err
                    raise EngineError(f"{self.name}: {message}", status=502)
                yield event
        except aiohttp.ClientError as exc:
            raise EngineError(f"the {self.name} server broke off the stream: {exc}", status=502) from exc
        finally:
            resp.close()
