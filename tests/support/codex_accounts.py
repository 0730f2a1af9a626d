"""Codex accounts for cli worker tests: a ``CODEX_HOME`` with an API-key
``auth.json``, a provider pointed at a fake Responses upstream, and the
worker settings that run the fake app-server or the real binary on it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from app.settings import WorkerSettings

REPO = Path(__file__).resolve().parents[2]
FAKE_CODEX = (sys.executable, "-m", "tests.fakes.codex_app_server")
CODEX_MODEL = "gpt-5-codex"


def codex_home(root: Path, key: str | None) -> Path:
    """A Codex home logged in with API key ``key`` (None: no credentials)."""
    root.mkdir(parents=True, exist_ok=True)
    if key is not None:
        (root / "auth.json").write_text(json.dumps({"auth_mode": "apikey",
                                                    "OPENAI_API_KEY": key}))
        (root / "auth.json").chmod(0o600)
    return root


def provider_options(base_url: str, **extra: Any) -> dict[str, Any]:
    """``cli_options`` for a custom Responses provider at ``base_url`` (ends in
    ``/v1``) that takes the key from ``auth.json``."""
    return {"config": {
        "model_providers.fake.name": "fake", "model_providers.fake.base_url": base_url,
        "model_providers.fake.wire_api": "responses",
        "model_providers.fake.requires_openai_auth": True, "model_provider": "fake"}, **extra}


def codex_worker(name: str, home: Path, base_url: str, *,
                 command: tuple[str, ...] = FAKE_CODEX,
                 models: tuple[str, ...] = (CODEX_MODEL,), **extra: Any) -> WorkerSettings:
    env = {"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           # the real binary reaches nothing but loopback
           "NO_PROXY": "127.0.0.1,localhost", "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", **extra.pop("env", {})}
    fields: dict[str, Any] = dict(
        name=name, kind="cli", cli="codex", models=models, home=str(home), command=command,
        env=env, cli_options=provider_options(base_url, **extra.pop("cli_options", {})),
        health_interval=0.5, health_timeout=2.0, backoff_initial=0.2, backoff_max=2.0,
        stop_timeout=5.0)
    fields.update(extra)
    return WorkerSettings(**fields)


def turn_inputs(home: Path) -> list[dict[str, Any]]:
    """What the fake app-server got in each ``turn/start``: thread id and text."""
    log = home / "turns.jsonl"
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        text = "".join(i.get("text", "") for i in entry["input"] if i.get("type") == "text")
        out.append({"thread": entry["threadId"], "text": text})
    return out


def app_server_pid(home: Path) -> int | None:
    """The pid of the app-server whose ``CODEX_HOME`` is ``home`` (the fake
    writes it down; the real one is found in ``/proc``)."""
    pid_file = home / "app-server.pid"
    if pid_file.exists():
        try:
            return int(pid_file.read_text())
        except (OSError, ValueError):  # being written (or replaced) right now: look again
            return None
    wanted = f"CODEX_HOME={home}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"app-server" in cmdline and wanted in environ:
            return int(entry.name)
    return None
