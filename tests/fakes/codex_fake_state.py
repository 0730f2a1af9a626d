"""State of the fake codex app-server (see :mod:`tests.fakes.codex_app_server`):
its threads and turns, and the Responses upstream it gets replies from."""

from __future__ import annotations

import http.client
import json
import math
import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["RESERVED_TOOLS", "parse_config", "Upstream", "Thread", "Turn", "dynamic_tools",
           "text_item", "turn_info", "rate_limits", "wham_limits"]

RESERVED_TOOLS = ("exec_command", "shell_command", "request_user_input")


def parse_config(argv: list[str]) -> dict[str, Any]:
    """The ``-c key=value`` overrides (values as TOML scalars, roughly)."""
    config: dict[str, Any] = {}
    for n, arg in enumerate(argv):
        if arg == "-c" and n + 1 < len(argv):
            key, _, raw = argv[n + 1].partition("=")
            try:
                value: Any = json.loads(raw)
            except ValueError:
                value = raw
            config[key] = value
    return config


class Upstream:
    """Where a provider's requests go, and with which key."""

    def __init__(self, config: dict[str, Any], home: Path) -> None:
        provider = config.get("model_provider", "openai")
        self.base_url = config.get(f"model_providers.{provider}.base_url", "")
        self.retries = int(config.get(f"model_providers.{provider}.stream_max_retries", 5))
        # like Codex: the built-in openai provider needs an OpenAI login, a custom one
        # only when its requires_openai_auth says so
        self.requires_openai_auth = bool(config.get(
            f"model_providers.{provider}.requires_openai_auth", provider == "openai"))
        self.chatgpt_base_url = str(config.get("chatgpt_base_url",
                                               "https://chatgpt.com/backend-api/"))
        self.home = home

    def auth(self) -> dict[str, Any]:
        try:
            auth = json.loads((self.home / "auth.json").read_text())
        except (OSError, ValueError):
            return {}
        return auth if isinstance(auth, dict) else {}

    def key(self) -> str | None:
        return self.auth().get("OPENAI_API_KEY") or None

    def chatgpt(self) -> bool:
        return self.auth().get("auth_mode") == "chatgpt"

    def wham_usage(self) -> dict[str, Any]:
        """``GET {chatgpt_base_url}/wham/usage`` with the login's token (as Codex
        asks it for ``account/rateLimits/read``)."""
        url = urlsplit(self.chatgpt_base_url.rstrip("/") + "/wham/usage")
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        try:
            conn.request("GET", url.path, headers={"authorization": f"Bearer {self.key()}"})
            response = conn.getresponse()
            if response.status != 200:
                raise OSError(f"wham/usage answered {response.status}")
            return json.loads(response.read())
        finally:
            conn.close()

    def stream(self, body: dict[str, Any], turn: Turn) -> tuple[int, Any]:
        """POST and return (status, an iterator of SSE events or the error body)."""
        url = urlsplit(self.base_url.rstrip("/") + "/responses")
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
        turn.conn = conn
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if (key := self.key()) is not None:
            headers["authorization"] = f"Bearer {key}"
        conn.request("POST", url.path, json.dumps(body), headers)
        response = conn.getresponse()
        turn.rate_headers = {k.lower(): v for k, v in response.getheaders()
                             if k.lower().startswith("x-codex-")}
        if response.status != 200:
            return response.status, json.loads(response.read() or b"{}")
        return 200, _sse_events(response)


def _sse_events(response: http.client.HTTPResponse):
    for raw in response:
        line = raw.decode().strip()
        if line.startswith("data:"):
            yield json.loads(line[5:].strip())


class Thread:
    def __init__(self, tid: str, params: dict[str, Any], home: Path) -> None:
        self.id = tid
        self.params = params
        self.path = home / "sessions" / f"{tid}.json"
        self.input: list[dict[str, Any]] = []
        self.total = {"inputTokens": 0, "cachedInputTokens": 0, "outputTokens": 0,
                      "reasoningOutputTokens": 0, "totalTokens": 0}

    def save(self) -> None:
        if self.params.get("ephemeral"):
            return  # like the real one: an ephemeral thread leaves no rollout
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"params": self.params, "input": self.input}))

    def info(self, cwd: str) -> dict[str, Any]:
        return {"id": self.id, "sessionId": self.id, "preview": "", "ephemeral": False,
                "modelProvider": "fake", "cwd": cwd, "environments": [], "turns": [],
                "status": {"type": "idle"}}


class Turn:
    def __init__(self, thread: Thread) -> None:
        self.id = str(uuid.uuid4())
        self.thread = thread
        self.interrupted = threading.Event()
        self.conn: http.client.HTTPConnection | None = None
        self.held: dict[str, threading.Event] = {}
        self.effort: str | None = None
        self.rate_headers: dict[str, str] = {}  # the last upstream answer's x-codex-* headers


def dynamic_tools(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The thread's usable dynamic tools: like 0.169.0, names of Codex's own
    tools are silently left out."""
    return {t["name"]: t for t in params.get("dynamicTools") or ()
            if t["name"] not in RESERVED_TOOLS}


def text_item(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def rate_limits(headers: dict[str, str]) -> dict[str, Any] | None:
    """The ``rateLimits`` of ``account/rateLimits/updated`` from an answer's
    ``x-codex-primary-*`` / ``x-codex-secondary-*`` headers (None: none there)."""
    if "x-codex-primary-used-percent" not in headers:
        return None
    limits: dict[str, Any] = {"limitId": "codex", "limitName": None, "credits": None,
                              "planType": None, "rateLimitReachedType": None}
    for slot in ("primary", "secondary"):
        used = headers.get(f"x-codex-{slot}-used-percent")
        minutes = headers.get(f"x-codex-{slot}-window-minutes")
        reset = headers.get(f"x-codex-{slot}-reset-at")
        limits[slot] = None if used is None else {  # whole percents, as 0.171.0 sends them
            "usedPercent": math.floor(float(used) + 0.5), "windowDurationMins": int(minutes) if minutes else None,
            "resetsAt": int(reset) if reset else None}
    return limits


def wham_limits(usage: dict[str, Any]) -> dict[str, Any]:
    """``account/rateLimits/read``'s ``rateLimits`` from a ``wham/usage`` answer."""
    limits: dict[str, Any] = {"limitId": "codex", "limitName": None, "credits": None,
                              "planType": usage.get("plan_type"), "rateLimitReachedType": None}
    for slot in ("primary", "secondary"):
        window = (usage.get("rate_limit") or {}).get(f"{slot}_window")
        limits[slot] = None if not window else {
            "usedPercent": window["used_percent"],
            "windowDurationMins": window["limit_window_seconds"] // 60,
            "resetsAt": window["reset_at"]}
    return limits


def turn_info(turn: Turn, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": turn.id, "items": [], "status": status, "error": error}
