"""Gemini CLI's Google login, for one account's home.

Only the interactive ``gemini`` logs in (``-p`` and ``--acp`` refuse: "Manual
authorization is required but the current session is non-interactive"). On a
pty with no browser (``NO_BROWSER``, no display) 0.61.0 prints "Please visit
the following URL to authorize the application:", Google's authorize URL
(``redirect_uri=https://codeassist.google.com/authcode``, PKCE) and "Enter the
authorization code:"; the code typed into *that* process is exchanged and
``~/.gemini/oauth_creds.json`` written. The CLI then goes on into its
interactive screen instead of exiting, so the login is over when that file
appears (and the process is then ended), or failed on "Failed to
authenticate" or when the process exits.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Mapping, Sequence

from .gemini_home import OAUTH_AUTH, GeminiHome
from .login import ClaudeLogin, LoginChallenge, LoginFailed
from .proc import find_binary

__all__ = ["GeminiLogin"]

_POLL = 0.1


class GeminiLogin(ClaudeLogin):
    """The interactive ``gemini`` on a pty, up to its ``oauth_creds.json``."""

    label = "gemini login"
    prompt_marker = "authorization code"

    def __init__(self, *, home: str, env: Mapping[str, str],
                 command: Sequence[str] | None) -> None:
        super().__init__(home=home, env={}, command=command or ("gemini",))
        self.env = {**env, "HOME": home, "NO_BROWSER": "true", "TERM": "xterm"}
        self.env.pop("GEMINI_API_KEY", None)  # a key would win over the Google login
        self.argv = [*find_binary(command, "gemini", self.env), "--skip-trust"]
        self.account = GeminiHome(Path(home), {}, "chat")

    async def begin(self, timeout: float) -> LoginChallenge:
        self.account.select_auth(OAUTH_AUTH)
        self.stamp = self.account.credentials_stamp()
        return await super().begin(timeout)

    async def submit(self, code: str, timeout: float) -> None:
        if self.master is None or self.proc is None:
            raise LoginFailed("no login in progress")
        self._code = code
        self.output = ""  # what follows the code tells whether it was taken
        os.write(self.master, code.encode() + b"\r")
        try:
            async with asyncio.timeout(timeout):
                while self.account.credentials_stamp() in (None, self.stamp):
                    if "Failed to authenticate" in self.output or "code is required" in self.output:
                        raise LoginFailed(f"{self.label} refused the code: {self._tail()}",
                                          "code_refused")
                    if self.proc.returncode is not None:
                        raise LoginFailed(f"{self.label} exited with {self.proc.returncode}: "
                                          f"{self._tail()}", "code_refused")
                    await asyncio.sleep(_POLL)
        except TimeoutError:
            raise LoginFailed(f"{self.label} did not finish after the code", "timeout") from None
        await self.close()  # logged in: the interactive screen that follows is not needed

    async def wait(self, timeout: float) -> None:
        raise LoginFailed("gemini needs the code pasted back")
