"""Each CLI's own login, started for one account's home: the URL (or device
code) to open, and the way back for the code.

- Claude: ``claude auth login`` in a pseudo-terminal. It prints the authorize
  URL and waits at "Paste code here if prompted >"; the ``code#state`` from
  the callback page is written to the *same* process (a new one would have a
  new PKCE pair) through the pty, and the CLI exchanges it and writes
  ``.credentials.json``.
- Codex: ``account/login/start {"type": "chatgpt"}`` in ``codex app-server``
  (``CODEX_HOME`` = the home) answers ``authUrl``; the browser's redirect to
  ``http://localhost:1455/auth/callback`` reaches the app-server's own
  listener (a fixed port: logins are serialized), or the operator pastes that
  redirect URL and it is fetched locally. ``account/login/completed`` ends it.
- Gemini: the interactive ``gemini`` on a pty with no browser prints Google's
  authorize URL and "Enter the authorization code:" (:mod:`pool.cli.gemini_login`).
- Qwen: no browser login (its OAuth was discontinued; accounts are API keys
  in ``settings.json``, ``.env`` or the worker's env): :class:`LoginUnsupported`.

Nothing here logs the URL's secrets, the code or the CLI's output (the pty
echoes what is pasted): errors carry a scrubbed last line.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import signal
import struct
import termios
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from .private import private_dir
from .proc import JsonLineProcess, find_binary

__all__ = ["LoginChallenge", "LoginFailed", "LoginUnsupported", "CliLogin", "ClaudeLogin",
           "CodexLogin", "make_login", "FIXED_PORTS"]

_URL = re.compile(r"https?://[^\s'\"<>]+")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
#: CLIs whose login listens on a fixed local port: one login at a time per host
FIXED_PORTS: Mapping[str, int] = {"codex": 1455}
_CLAUDE_QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
                 "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1"}


@dataclass(frozen=True, slots=True)
class LoginChallenge:
    url: str | None = None  # open this in a browser
    user_code: str | None = None  # device flow: type this at verification_url
    verification_url: str | None = None
    wants_code: bool = True  # the code shown at the end must be pasted back


class LoginFailed(Exception):
    """The CLI did not complete the login; ``reason`` is a metric label."""

    def __init__(self, message: str, reason: str = "cli_error") -> None:
        super().__init__(message)
        self.reason = reason


class LoginUnsupported(LoginFailed):
    def __init__(self, message: str) -> None:
        super().__init__(message, "unsupported")


class CliLogin(Protocol):
    async def begin(self, timeout: float) -> LoginChallenge: ...

    async def submit(self, code: str, timeout: float) -> None: ...

    async def wait(self, timeout: float) -> None: ...

    async def close(self) -> None: ...


def make_login(cli: str, *, home: str, env: Mapping[str, str],
               command: Sequence[str] | None = None) -> CliLogin:
    if cli == "claude":
        return ClaudeLogin(home=home, env=env, command=command)
    if cli == "codex":
        return CodexLogin(home=home, env=env, command=command)
    if cli == "gemini":
        from .gemini_login import GeminiLogin  # its module imports this one
        return GeminiLogin(home=home, env=env, command=command)
    raise LoginUnsupported(
        f"{cli} accounts do not log in through a browser: give the worker an API key "
        "(its env or settings) or import a bundle")


def _scrub(text: str, *secrets: str) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _URL.sub("<url>", text)


class ClaudeLogin:
    """``claude auth login`` on a pty (its prompt reads the code from a terminal)."""

    label = "claude auth login"
    prompt_marker = "aste"  # "Paste code here if prompted >"

    def __init__(self, *, home: str, env: Mapping[str, str],
                 command: Sequence[str] | None) -> None:
        self.home = home
        self.env = {**env, **_CLAUDE_QUIET, "CLAUDE_CONFIG_DIR": home}
        self.argv = [*find_binary(command, "claude", self.env), "auth", "login"]
        self.proc: asyncio.subprocess.Process | None = None
        self.master: int | None = None
        self.output = ""
        self._changed = asyncio.Event()
        self._code = ""

    async def begin(self, timeout: float) -> LoginChallenge:
        private_dir(self.home)
        master, slave = os.openpty()
        # wide enough that the URL is never wrapped across lines
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 4000, 0, 0))
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=slave, stdout=slave, stderr=slave, env=self.env,
                cwd=self.home, start_new_session=True)
        except OSError as exc:
            os.close(master)
            raise LoginFailed(f"cannot run {self.argv[0]}: {exc.strerror}") from None
        finally:
            os.close(slave)
        self.master = master
        os.set_blocking(master, False)
        asyncio.get_running_loop().add_reader(master, self._read)
        try:
            async with asyncio.timeout(timeout):
                while not (_URL.search(self.output) and self.prompt_marker in self.output):
                    if self.proc.returncode is not None:
                        raise LoginFailed(f"{self.label} exited with {self.proc.returncode} "
                                          f"before showing a URL: {self._tail()}")
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise LoginFailed(f"{self.label} showed no URL in time", "timeout") from None
        url = _URL.search(self.output)
        assert url is not None
        return LoginChallenge(url=url.group(), wants_code=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def submit(self, code: str, timeout: float) -> None:
        if self.master is None or self.proc is None:
            raise LoginFailed("no login in progress")
        self._code = code
        os.write(self.master, code.encode() + b"\r")
        try:
            async with asyncio.timeout(timeout):
                rc = await self.proc.wait()
        except TimeoutError:
            raise LoginFailed("claude auth login did not finish after the code", "timeout") from None
        if rc != 0:
            raise LoginFailed(f"claude auth login refused the code (exit {rc}): {self._tail()}",
                              "code_refused")

    async def wait(self, timeout: float) -> None:
        raise LoginFailed("claude needs the code pasted back")

    async def close(self) -> None:
        if self.master is not None:
            asyncio.get_running_loop().remove_reader(self.master)
            os.close(self.master)
            self.master = None
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    def _read(self) -> None:
        try:
            data = os.read(self.master, 65536) if self.master is not None else b""
        except BlockingIOError:
            return
        except OSError:  # EIO: the CLI closed its terminal
            data = b""
        if not data and self.master is not None:
            asyncio.get_running_loop().remove_reader(self.master)
        self.output = (self.output + _ANSI.sub("", data.decode(errors="replace")))[-16384:]
        self._changed.set()

    def _tail(self) -> str:
        lines = [ln.strip() for ln in self.output.splitlines() if ln.strip()]
        return _scrub(lines[-1] if lines else "no output", self._code)[:200]


#: no proxy: the pasted callback is this host's, and the code in it goes nowhere else
#: (urlopen would send it through any proxy the gateway's environment names)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _fetch(url: str, timeout: float) -> None:
    with _DIRECT.open(url, timeout=timeout) as response:
        response.read()


class CodexLogin:
    """``account/login/start`` in a ``codex app-server`` of the account's home."""

    def __init__(self, *, home: str, env: Mapping[str, str],
                 command: Sequence[str] | None) -> None:
        self.home = home
        self.env = {**env, "CODEX_HOME": home}
        self.argv = [*find_binary(command, "codex", self.env), "app-server"]
        self.proc: JsonLineProcess | None = None
        self.login_id: str | None = None
        self._done: asyncio.Future[dict[str, Any]] | None = None
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def begin(self, timeout: float) -> LoginChallenge:
        private_dir(self.home)
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        # its own process group: a login that is abandoned is ended whole (the
        # npm launcher and the binary under it, which holds port 1455)
        self.proc = await JsonLineProcess.spawn(self.argv, env=self.env, cwd=self.home,
                                                label="codex app-server (login)",
                                                new_session=True)
        self._reader = asyncio.ensure_future(self._read())
        try:
            async with asyncio.timeout(timeout):
                await self._call(1, "initialize", {"clientInfo": {"name": "poolgate",
                                                                  "version": "0.1"}})
                self.proc.send({"method": "initialized"})
                result = await self._call(2, "account/login/start", {"type": "chatgpt"})
        except TimeoutError:
            raise LoginFailed("codex app-server gave no login URL in time", "timeout") from None
        self.login_id = result.get("loginId")
        if not result.get("authUrl"):
            raise LoginFailed("codex app-server answered no authUrl")
        return LoginChallenge(url=result["authUrl"], wants_code=False)

    async def submit(self, code: str, timeout: float) -> None:
        """The operator's pasted redirect URL (``http://localhost:1455/auth/callback?…``),
        fetched here so it reaches the app-server's listener."""
        if not re.match(r"^http://(localhost|127\.0\.0\.1):\d+/", code):
            raise LoginFailed("paste the whole redirect URL (http://localhost:1455/auth/callback?…)",
                              "code_refused")
        with contextlib.suppress(Exception):  # the listener answers with a redirect page
            await asyncio.to_thread(_fetch, code, timeout)
        await self.wait(timeout)

    async def wait(self, timeout: float) -> None:
        assert self._done is not None
        try:
            async with asyncio.timeout(timeout):
                params = await asyncio.shield(self._done)
        except TimeoutError:
            raise LoginFailed("codex did not complete the login in time", "timeout") from None
        if not params.get("success"):
            raise LoginFailed(f"codex refused the login: {_scrub(str(params.get('error')))[:200]}",
                              "code_refused")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def close(self) -> None:
        """End the app-server: stdin closed, then its whole process group killed
        if it is still there (signalled while its leader lives, never after)."""
        if self._reader is not None:
            self._reader.cancel()
        if self.proc is None:
            return
        proc = self.proc.proc
        if proc.returncode is None:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()
            try:
                async with asyncio.timeout(0.5):
                    await proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        await self.proc.close(grace=0)

    async def _call(self, rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc is not None
        self._replies[rid] = asyncio.get_running_loop().create_future()
        self.proc.send({"id": rid, "method": method, "params": params})
        return dict(await self._replies[rid])

    async def _read(self) -> None:
        assert self.proc is not None
        async for msg in self.proc.lines():
            rid = msg.get("id")
            if rid in self._replies and not self._replies[rid].done():
                if "error" in msg:
                    self._replies[rid].set_exception(LoginFailed(
                        f"codex: {_scrub(str(msg['error'].get('message')))[:200]}"))
                else:
                    self._replies[rid].set_result(msg.get("result") or {})
            elif msg.get("method") == "account/login/completed" and self._done is not None \
                    and not self._done.done():
                self._done.set_result(msg.get("params") or {})
        for fut in (*self._replies.values(), self._done):
            if fut is not None and not fut.done():
                fut.set_exception(LoginFailed(self.proc.why_exited()))
