"""Accounts for cli worker tests: a config home with a planted
``.credentials.json`` (what a logged-in Claude Code keeps), and the log the
fake CLI writes (argv and every stdin line, per process)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from app.settings import WorkerSettings

REPO = Path(__file__).resolve().parents[2]
FAKE_CLAUDE = REPO / "tests" / "fakes" / "fake_claude.py"


def claude_home(root: Path, token: str | None) -> Path:
    """A Claude config home, logged in with OAuth ``token`` (None: logged out)."""
    root.mkdir(parents=True, exist_ok=True)
    if token is not None:
        (root / ".credentials.json").write_text(json.dumps({"claudeAiOauth": {
            "accessToken": token, "refreshToken": "sk-ant-ort01-fake",
            "expiresAt": int(time.time() * 1000) + 86_400_000,
            "scopes": ["user:inference", "user:profile"], "subscriptionType": "max"}}))
        (root / ".credentials.json").chmod(0o600)
        (root / ".claude.json").write_text(json.dumps({"oauthAccount": {
            "emailAddress": f"{root.name}@example.com", "accountUuid": "acct-" + root.name},
            "hasCompletedOnboarding": True}))
    return root


def fake_claude_worker(name: str, home: Path, base_url: str, log: Path, *,
                       models: tuple[str, ...] = ("claude-sonnet-4-6",),
                       **extra: Any) -> WorkerSettings:
    env = {"ANTHROPIC_BASE_URL": base_url, "FAKE_CLAUDE_LOG": str(log), **extra.pop("env", {})}
    fields: dict[str, Any] = dict(
        name=name, kind="cli", cli="claude", models=models, home=str(home),
        command=(sys.executable, str(FAKE_CLAUDE)), env=env, health_interval=0.5,
        health_timeout=2.0, backoff_initial=0.2, backoff_max=2.0, stop_timeout=5.0)
    fields.update(extra)
    return WorkerSettings(**fields)


def read_log(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def user_lines(log: Path) -> list[dict[str, Any]]:
    """Every user message the CLI got on stdin, with the pid that got it."""
    return [{"pid": e["pid"], **e["stdin"]} for e in read_log(log)
            if "stdin" in e and e["stdin"].get("type") == "user"]


def spawns(log: Path) -> list[dict[str, Any]]:
    """Every CLI process started: pid and argv."""
    return [e for e in read_log(log) if "argv" in e]


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value
