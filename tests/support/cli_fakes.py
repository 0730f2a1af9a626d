"""Worker settings for the fake Qwen Code CLI and the fake JSON-RPC agent
(``tests/fakes/fake_qwen.py``, ``tests/fakes/fake_jsonrpc_agent.py``), and
what their logs say (argv and every stdin message, per process)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.cli_accounts import read_log
from tests.support.server import ServerThread

REPO = Path(__file__).resolve().parents[2]
FAKE_QWEN = REPO / "tests" / "fakes" / "fake_qwen.py"
FAKE_AGENT = REPO / "tests" / "fakes" / "fake_jsonrpc_agent.py"
#: the cli_options that point the jsonrpc driver at the fake's Lingma-style names
LINGMA_OPTIONS = {
    "initialize": "chat/init", "start_session": "chat/start", "session_id_path": "conversation.id",
    "send_prompt": "chat/ask", "session_field": "conversationId", "prompt_field": "content",
    "notification": "chat/delta", "notification_session_path": "conversationId",
    "update_kind_path": "delta.kind", "text_kind": "text", "text_path": "delta.text",
    "stop_reason_path": "finishReason", "usage_path": "usage", "cancel": "chat/stop",
    "end_session": "chat/end",
}
_FAST = dict(health_interval=0.5, health_timeout=2.0, backoff_initial=0.2, backoff_max=2.0,
             stop_timeout=5.0)


def fake_cli_worker(cli: str, name: str, home: Path, base_url: str, log: Path, *,
                    api_key: str | None, models: tuple[str, ...] = ("qwen-coder",),
                    **extra: Any) -> WorkerSettings:
    """A ``cli = "qwen"`` worker on the fake qwen, or a ``cli = "jsonrpc"`` one
    on the fake agent (``args`` are the agent's, e.g. ``("--dialect", "lingma")``)."""
    env = {"OPENAI_BASE_URL": base_url, "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "FAKE_QWEN_LOG" if cli == "qwen" else "FAKE_AGENT_LOG": str(log),
           **extra.pop("env", {})}
    if api_key is not None:
        env["OPENAI_API_KEY"] = api_key
    script = FAKE_QWEN if cli == "qwen" else FAKE_AGENT
    fields: dict[str, Any] = dict(
        name=name, kind="cli", cli=cli, models=models, home=str(home),
        command=(sys.executable, str(script), *extra.pop("args", ())), env=env, **_FAST)
    fields.update(extra)
    return WorkerSettings(**fields)


def stdin_of(log: Path) -> list[dict[str, Any]]:
    """Every message the CLI got on stdin, in order, with the pid that got it."""
    return [{"pid": e["pid"], **e["stdin"]} for e in read_log(log) if "stdin" in e]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def processes(log: Path) -> list[dict[str, Any]]:
    """Every conversation process the CLI was started as (``--version`` probes left out)."""
    return [e for e in read_log(log) if "argv" in e and "--version" not in e["argv"]]


ADMIN = {"authorization": "Bearer admin-token"}
CLIENT_KEY = "sk-team-a"


def serve(*workers: WorkerSettings) -> ServerThread:
    """A real poolgate with these workers (admin token ``admin-token``, one client key)."""
    settings = Settings(server=ServerSettings(admin_token="admin-token",
                                              api_keys={"team-a": CLIENT_KEY}),
                        workers=tuple(workers))
    return ServerThread(create_app(settings))


def worker_info(http: httpx.Client) -> dict[str, dict[str, Any]]:
    """``/internal/workers`` by worker name."""
    return {w["name"]: w for w in http.get("/internal/workers", headers=ADMIN).json()["workers"]}


def openai_client(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=CLIENT_KEY, max_retries=0)


def anthropic_client(srv: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key=CLIENT_KEY, max_retries=0)
