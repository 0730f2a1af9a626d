"""A fake ``claude`` (Claude Code) CLI for fast tests: stdlib only, the same
stream-json protocol as the real binary (2.1.x), replies from a real HTTP
Anthropic upstream (``ANTHROPIC_BASE_URL``, e.g. tests/fakes/upstreams.py).

Speaks: ``--version``; ``-p --input-format stream-json --output-format
stream-json --verbose --include-partial-messages``; ``system/init``,
``stream_event`` (the upstream's SSE events as they come), one ``assistant``
line per content block, ``user`` tool results, ``result`` with the turn's
usage; control ``initialize`` and ``interrupt``; the in-band SDK MCP server of
``--mcp-config`` (``mcp_message`` initialize, tools/list, a held tools/call);
``--session-id`` / ``--resume`` with ``$CLAUDE_CONFIG_DIR/projects/<cwd>/<sid>.jsonl``
(an unknown session fails as the real one does; what a resume does to a
session that ends in a tool call: fake_claude_resume.py); the not-logged-in pair when
there is neither ``.credentials.json`` nor an API key; a 401 from the upstream
as ``system/api_retry`` lines, ten of them, a second apart, as with an API key.

Switches (environment): ``FAKE_CLAUDE_LOG=path`` appends argv and every stdin
line as JSON; ``FAKE_CLAUDE_FAULT=crash-mid-turn`` SIGKILLs itself after the
first text delta, ``hang`` reads a user message and never answers,
``rate-limited`` answers every turn with a rejected ``rate_limit_event`` and
a 429 result (a 429 from the upstream does the same), ``leak-token`` prints
its bearer token on stderr at the first user message and exits 1.

Quota, as the real one reads it (docs/cli-workers.md, "Quota"): with a
subscription login (``.credentials.json``, no API key) the upstream's
``anthropic-ratelimit-unified-*`` headers become a ``rate_limit_event`` line
whenever the derived info changes (``allowed_warning`` with the window's
``utilization`` fraction by the real warning rule, ``rejected`` at the limit,
else ``allowed``), with every window's numbers in ``unifiedWindows`` as 2.1.332
sends them (``FAKE_CLAUDE_RATE_EVENTS=2.1.197``: without, as the older one);
the control request ``get_usage`` answers every window's percent and ISO reset
from the last answer's headers (``FAKE_CLAUDE_USAGE=hang``: never;
``junk``: with junk). ``FAKE_CLAUDE_FAULT=junk-quota`` prints junk
``rate_limit_event`` lines before each real one.

``auth login``: see fake_claude_login.py (the real prompts, the code read from a pty).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import fake_claude_resume as resume  # the same directory

VERSION = "2.1.197"
MCP_PREFIX = "mcp__gw__"
OUT_LOCK = threading.Lock()
ENV = os.environ
# Claude Code 2.1.x takes its proxy from any of these, for http:// and https://
# upstreams alike (verified on the real binary, docs/cli-workers.md), and sends
# the hosts NO_PROXY lists direct; a socks5:// ALL_PROXY it ignores
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _opener(base: str) -> urllib.request.OpenerDirector:
    """What reaches ``base``: through the environment's proxy as the real CLI
    picks it, else direct."""
    proxy = next((ENV[name] for name in _PROXY_VARS
                  if ENV.get(name) and not ENV[name].startswith("socks")), None)
    host = urllib.parse.urlsplit(base).netloc
    no_proxy = ENV.get("NO_PROXY", ENV.get("no_proxy", ""))
    if proxy is None or (no_proxy and urllib.request.proxy_bypass_environment(
            host, {"no": no_proxy})):
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy,
                                                                    "https": proxy}))


def emit(obj: dict) -> None:
    with OUT_LOCK:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def log(entry: dict) -> None:
    path = ENV.get("FAKE_CLAUDE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")


def parse_args(argv: list[str]) -> dict:
    """Options as Claude's commander parses them: ``--name=value``, or ``--name``
    taking the next word whatever it starts with."""
    valued = {"--input-format", "--output-format", "--model", "--tools", "--system-prompt",
              "--append-system-prompt", "--system-prompt-file", "--append-system-prompt-file",
              "--session-id", "--resume", "--mcp-config",
              "--allowedTools", "--effort", "--permission-mode", "--max-turns"}
    opts: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if eq and name in valued:
            opts[name] = value
            i += 1
        elif arg in valued:
            opts[arg] = argv[i + 1]
            i += 2
        else:
            opts[arg] = True
            i += 1
    return opts


def read_prompt_files(opts: dict) -> str | None:
    """``--system-prompt-file`` / ``--append-system-prompt-file``: read once at
    startup, with the real CLI's errors; None when all is well."""
    for flag in ("--system-prompt", "--append-system-prompt"):
        path = opts.pop(f"{flag}-file", None)
        if path is None:
            continue
        if flag in opts:
            return f"Error: Cannot use both {flag} and {flag}-file. Please use only one."
        try:
            with open(path, encoding="utf-8") as fh:
                opts[flag] = fh.read()
        except FileNotFoundError:
            return f"Error: System prompt file not found: {os.path.abspath(path)}"
    return None


class Cli:
    def __init__(self, opts: dict) -> None:
        self.opts = opts
        self.home = ENV.get("CLAUDE_CONFIG_DIR") or os.path.join(ENV.get("HOME", "/tmp"), ".claude")
        self.model = opts.get("--model", "claude-opus-4-8[1m]")
        self.session_id = opts.get("--resume") or opts.get("--session-id") or str(uuid.uuid4())
        self.project = os.path.join(self.home, "projects", re.sub(r"[^A-Za-z0-9]", "-", os.getcwd()))
        self.messages: list[dict] = []
        self.last_uuid: str | None = None
        self.resume_turn = False  # the resumed session is an interrupted turn, run at start
        self.inbox: queue.Queue = queue.Queue()
        self.pending: dict[str, queue.Queue] = {}
        self.interrupted = threading.Event()
        self.response = None  # the upstream response being relayed (an interrupt closes it)
        self.ids = iter(range(1, 1 << 30))
        self.mcp_tools: list[dict] | None = None
        mcp = opts.get("--mcp-config")
        self.mcp = json.loads(mcp)["mcpServers"] if mcp else {}
        self.token = self.credentials()
        self.rate_info: dict | None = None  # the last rate_limit_info emitted
        self.windows: dict[str, tuple[float, int]] = {}  # name -> (fraction, reset) from headers

    # --- state on disk ---

    def credentials(self) -> str | None:
        try:
            with open(os.path.join(self.home, ".credentials.json"), encoding="utf-8") as fh:
                return json.load(fh)["claudeAiOauth"]["accessToken"]
        except (OSError, ValueError, KeyError):
            return None

    def load(self) -> bool:
        path = os.path.join(self.project, f"{self.session_id}.jsonl")
        try:
            with open(path, encoding="utf-8") as fh:
                records = [json.loads(line) for line in fh if line.strip()]
        except OSError:
            return False
        self.messages = resume.messages_of(records)
        self.last_uuid = next((r["uuid"] for r in reversed(records) if r.get("uuid")), None)
        interrupted = resume.interrupted_results(self.messages)
        if interrupted:
            self.save({"role": "user", "content": interrupted})
        self.resume_turn = resume.resumes_interrupted_turn(self.messages, ENV)
        if not self.resume_turn and resume.ends_unanswered(self.messages):
            self.save({"role": "assistant", "content": [{"type": "text", "text": resume.NO_RESPONSE}]})
        return True

    def save(self, message: dict) -> None:
        os.makedirs(self.project, exist_ok=True)
        record_id = str(uuid.uuid4())
        record = {"parentUuid": self.last_uuid, "sessionId": self.session_id, "cwd": os.getcwd(),
                  "type": message["role"], "message": message, "uuid": record_id}
        with open(os.path.join(self.project, f"{self.session_id}.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        self.last_uuid = record_id
        self.messages.append(message)

    # --- stdin ---

    def read_stdin(self) -> None:
        for line in sys.stdin:
            if not line.strip():
                continue
            msg = json.loads(line)
            log({"stdin": msg})
            if msg.get("type") == "control_request":
                self.on_control(msg)
            elif msg.get("type") == "control_response":
                response = msg["response"]
                waiter = self.pending.pop(response.get("request_id"), None)
                if waiter is not None:
                    waiter.put(response)
            else:
                self.inbox.put(msg)
        self.inbox.put(None)

    def on_control(self, msg: dict) -> None:
        subtype = msg["request"].get("subtype")
        response: dict = {}
        if subtype == "interrupt":
            self.interrupted.set()
            response = self.response
            if response is not None:
                try:
                    response.fp.raw._sock.shutdown(2)  # abort the read the turn is blocked in
                except (AttributeError, OSError):
                    pass
            for waiter in list(self.pending.values()):
                waiter.put(None)
        elif subtype == "initialize":
            response = {"commands": [], "output_style": "default"}
        elif subtype == "get_usage" and ENV.get("FAKE_CLAUDE_USAGE") == "hang":
            return
        elif subtype == "get_usage" and ENV.get("FAKE_CLAUDE_USAGE") == "junk":
            response = {"rate_limits": {"five_hour": {"utilization": "lots"}, "x" * 500: {},
                                        "seven_day": [1], "w": {"utilization": 1e308 * 10}}}
        elif subtype == "get_usage":
            response = {"subscription_type": "max", "rate_limits_available": True,
                        "rate_limits": {name: {"utilization": round(fraction * 100, 2),
                                               "resets_at": _iso(reset)}
                                        for name, (fraction, reset) in self.windows.items()}}
        emit({"type": "control_response", "response": {
            "subtype": "success", "request_id": msg["request_id"], "response": response}})

    def ask(self, request: dict) -> dict | None:
        """A control request to the SDK host; blocks until it answers (or an interrupt)."""
        request_id = f"cli_{next(self.ids)}"
        waiter: queue.Queue = queue.Queue()
        self.pending[request_id] = waiter
        emit({"type": "control_request", "request_id": request_id, "request": request})
        return waiter.get()

    def mcp_call(self, server: str, method: str, params: dict, notify: bool = False) -> dict | None:
        message: dict = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notify:
            message["id"] = next(self.ids)
        response = self.ask({"subtype": "mcp_message", "server_name": server, "message": message})
        return None if response is None else response["response"]["mcp_response"]

    # --- a turn ---

    def tools(self) -> list[dict]:
        if self.mcp_tools is None:
            self.mcp_tools = []
            for server in self.mcp:
                self.mcp_call(server, "initialize", {"protocolVersion": "2025-06-18",
                                                     "capabilities": {}, "clientInfo": {"name": "claude-code"}})
                self.mcp_call(server, "notifications/initialized", {}, notify=True)
                listed = self.mcp_call(server, "tools/list", {}) or {}
                for tool in listed.get("result", {}).get("tools", []):
                    self.mcp_tools.append({"name": f"mcp__{server}__{tool['name']}",
                                           "description": tool.get("description", ""),
                                           "input_schema": tool.get("inputSchema", {})})
        return self.mcp_tools

    def turn(self, user: dict | None) -> None:
        """One turn: of a prompt from stdin, or (None) the interrupted turn resumed."""
        self.interrupted.clear()
        emit({"type": "system", "subtype": "init", "session_id": self.session_id, "model": self.model,
              "tools": [t["name"] for t in self.tools()], "cwd": os.getcwd(),
              "permissionMode": self.opts.get("--permission-mode", "default"),
              "apiKeySource": "ANTHROPIC_API_KEY" if ENV.get("ANTHROPIC_API_KEY") else "none",
              "claude_code_version": VERSION})
        if self.token is None and not ENV.get("ANTHROPIC_API_KEY"):
            self.not_logged_in()
            return
        if user is None:
            self.save({"role": "user", "content": [{"type": "text", "text": resume.CONTINUE}]})
        else:
            self.save({"role": "user", "content": resume.prompt_content(
                user["message"]["content"], self.messages)})
        usage = {"input_tokens": 0, "output_tokens": 0}
        texts: list[str] = []
        for step in range(1, 50):
            status, message = self.call_upstream(usage)
            if status == "interrupted":
                return self.result(True, "error_during_execution", "", usage, step,
                                   terminal="aborted_streaming")
            if status != 200:
                return self.failed(status, usage, step)
            self.save(message)
            texts += [b["text"] for b in message["content"] if b["type"] == "text"]
            uses = [b for b in message["content"] if b["type"] == "tool_use"]
            if message.get("stop_reason") != "tool_use" or not uses:
                return self.result(False, "success", "".join(texts), usage, step,
                                   stop_reason=message.get("stop_reason"))
            results = []
            for use in uses:
                result = self.run_tool(use)
                if result is None:
                    return self.result(True, "error_during_execution", "", usage, step,
                                       terminal="aborted_tools")
                results.append(result)
            tool_message = {"role": "user", "content": results}
            emit({"type": "user", "message": tool_message, "session_id": self.session_id,
                  "parent_tool_use_id": None})
            self.save(tool_message)

    def run_tool(self, use: dict) -> dict | None:
        name = use["name"]
        if name.startswith("mcp__"):
            server, tool = name[5:].split("__", 1)
            response = self.mcp_call(server, "tools/call", {
                "name": tool, "arguments": use["input"], "_meta": {"claudecode/toolUseId": use["id"]}})
            if response is None:
                return None
            result = response.get("result", {})
            blocks = result.get("content", [])  # several: passed on as blocks, like the real CLI
            text = blocks if len(blocks) > 1 else "".join(c.get("text", "") for c in blocks)
            return {"type": "tool_result", "tool_use_id": use["id"], "content": text,
                    "is_error": bool(result.get("isError"))}
        if name == "Read":  # a built-in tool: the file, relative to the working directory
            path = use["input"].get("file_path") or use["input"].get("path") or ""
            try:
                with open(os.path.join(os.getcwd(), path), encoding="utf-8") as fh:
                    return {"type": "tool_result", "tool_use_id": use["id"], "content": fh.read()}
            except OSError:
                return {"type": "tool_result", "tool_use_id": use["id"], "is_error": True,
                        "content": f"File does not exist: {path}"}
        return {"type": "tool_result", "tool_use_id": use["id"], "is_error": True,
                "content": f"No such tool available: {name}"}

    def request_body(self) -> dict:
        system = self.opts.get("--system-prompt")
        if system is None:
            system = "You are Claude Code, Anthropic's official CLI for Claude." + (
                "\n" + self.opts["--append-system-prompt"] if "--append-system-prompt" in self.opts else "")
        body = {"model": self.model, "max_tokens": int(ENV.get("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "32000")),
                "stream": True, "system": [{"type": "text", "text": system}],
                "messages": resume.merged(self.messages), "metadata": {"user_id": self.session_id}}
        if ENV.get("MAX_THINKING_TOKENS"):  # as the real CLI: extended thinking with that budget
            body["thinking"] = {"type": "enabled", "budget_tokens": int(ENV["MAX_THINKING_TOKENS"])}
        tools = self.tools()
        if self.opts.get("--tools") != "" and not tools:
            tools = [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}]
        if tools:
            body["tools"] = tools
        return body

    def call_upstream(self, usage: dict) -> tuple[object, dict]:
        base = ENV.get("ANTHROPIC_BASE_URL", "https://api.anthropic.com").rstrip("/")
        headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
        if ENV.get("ANTHROPIC_API_KEY"):
            headers["x-api-key"] = ENV["ANTHROPIC_API_KEY"]
        else:
            headers["authorization"] = f"Bearer {self.token}"
        data = json.dumps(self.request_body()).encode()
        for attempt in range(1, 12):
            if ENV.get("FAKE_CLAUDE_FAULT") == "rate-limited":  # the account's quota is spent
                return self.limited()
            request = urllib.request.Request(f"{base}/v1/messages", data=data, headers=headers)
            try:
                response = _opener(base).open(request, timeout=600)
            except urllib.error.HTTPError as exc:
                if exc.code == 429:
                    return (429, {}) if self.read_quota(exc.headers) else self.limited()
                if attempt > 10 or exc.code not in (401, 500, 529):
                    return exc.code, {}
                emit({"type": "system", "subtype": "api_retry", "attempt": attempt, "max_retries": 10,
                      "retry_delay_ms": 1000, "error_status": exc.code,
                      "error": "authentication_failed" if exc.code == 401 else "rate_limit",
                      "session_id": self.session_id})
                time.sleep(1)
                continue
            except urllib.error.URLError:  # the upstream (or the proxy) cannot be reached
                return 503, {}
            self.read_quota(response.headers)
            return self.relay(response, usage)
        return 500, {}

    def read_quota(self, headers) -> bool:
        """A subscription's ``rate_limit_event``, when the derived info changed;
        False when the answer says nothing of the quota (or an API key is used)."""
        p = "anthropic-ratelimit-unified-"
        status = headers.get(p + "status")
        if status is None or self.token is None or ENV.get("ANTHROPIC_API_KEY"):
            return False
        windows: dict[str, tuple[float, int]] = {}
        unified: dict[str, dict] = {}
        warned: tuple[str, float, int] | None = None
        for abbr, name, length, rules in (("5h", "five_hour", 18000, ((0.9, 0.72),)),
                                          ("7d", "seven_day", 604800,
                                           ((0.75, 0.6), (0.5, 0.35), (0.25, 0.15)))):
            used, reset = headers.get(f"{p}{abbr}-utilization"), headers.get(f"{p}{abbr}-reset")
            if used is None or reset is None:
                continue
            windows[name] = (float(used), int(reset))
            unified[name] = {"utilization": float(used), "resetsAt": int(reset),
                             "status": headers.get(f"{p}{abbr}-status")}
            elapsed = (time.time() - (int(reset) - length)) / length
            if warned is None and (headers.get(f"{p}{abbr}-surpassed-threshold") is not None
                                   or any(float(used) >= u and elapsed <= e for u, e in rules)):
                warned = (name, float(used), int(reset))
        self.windows = windows
        info: dict = {"status": status, "resetsAt": int(headers.get(p + "reset") or 0),
                      "rateLimitType": headers.get(p + "representative-claim"),
                      "overageStatus": headers.get(p + "overage-status"),
                      "overageDisabledReason": headers.get(p + "overage-disabled-reason"),
                      "isUsingOverage": False}
        if status != "rejected":
            info["status"] = "allowed"
            if warned is not None:
                info.update(status="allowed_warning", rateLimitType=warned[0],
                            resetsAt=warned[2], utilization=warned[1])
        info = {k: v for k, v in info.items() if v is not None}
        if unified and ENV.get("FAKE_CLAUDE_RATE_EVENTS") != "2.1.197":
            info["unifiedWindows"] = unified
        if ENV.get("FAKE_CLAUDE_FAULT") == "junk-quota":
            for junk in (None, "x", [1], {"status": "allowed_warning", "utilization": "high",
                                          "rateLimitType": {"a": 1}},
                         {"status": "rejected", "rateLimitType": "five hour\n", "resetsAt": -5},
                         {"unifiedWindows": {"z" * 200: {"utilization": 0.5}, "a": 7}}):
                emit({"type": "rate_limit_event", "rate_limit_info": junk})
        if info != self.rate_info:
            self.rate_info = info
            emit({"type": "rate_limit_event", "rate_limit_info": info,
                  "uuid": str(uuid.uuid4()), "session_id": self.session_id})
        return True

    def limited(self) -> tuple[object, dict]:
        """A subscription's limit: reported once with its reset time, not retried."""
        emit({"type": "rate_limit_event", "rate_limit_info": {
            "status": "rejected", "resetsAt": int(time.time()) + 1800,
            "rateLimitType": "five_hour"}, "session_id": self.session_id})
        return 429, {}

    def relay(self, response, usage: dict) -> tuple[object, dict]:
        fault = ENV.get("FAKE_CLAUDE_FAULT")
        self.response = response
        try:
            return self.relay_events(response, usage, fault)
        except (OSError, ValueError):
            if self.interrupted.is_set():
                return "interrupted", {}
            raise
        finally:
            self.response = None
            response.close()

    def relay_events(self, response, usage: dict, fault: str | None) -> tuple[object, dict]:
        message: dict = {}
        blocks: dict[int, dict] = {}
        partial: dict[int, str] = {}
        for raw in response:
            if self.interrupted.is_set():
                return "interrupted", {}
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            emit({"type": "stream_event", "event": event, "session_id": self.session_id,
                  "parent_tool_use_id": None, "uuid": str(uuid.uuid4())})
            kind = event["type"]
            if kind == "message_start":
                message = dict(event["message"], content=[])
                usage["input_tokens"] += event["message"]["usage"].get("input_tokens", 0)
            elif kind == "content_block_start":
                blocks[event["index"]] = dict(event["content_block"])
            elif kind == "content_block_delta":
                delta, block = event["delta"], blocks[event["index"]]
                if delta["type"] == "text_delta":
                    block["text"] = block.get("text", "") + delta["text"]
                    if fault == "crash-mid-turn":
                        os.kill(os.getpid(), signal.SIGKILL)
                elif delta["type"] == "thinking_delta":
                    block["thinking"] = block.get("thinking", "") + delta["thinking"]
                elif delta["type"] == "signature_delta":
                    block["signature"] = delta["signature"]
                elif delta["type"] == "input_json_delta":
                    partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
            elif kind == "content_block_stop":
                block = blocks[event["index"]]
                if block["type"] == "tool_use":
                    block["input"] = json.loads(partial.get(event["index"]) or "{}")
                message["content"].append(block)
                emit({"type": "assistant", "message": dict(message, content=[block]),
                      "parent_tool_use_id": None, "session_id": self.session_id})
            elif kind == "message_delta":
                message["stop_reason"] = event["delta"].get("stop_reason")
                usage["output_tokens"] += event.get("usage", {}).get("output_tokens", 0)
        if self.interrupted.is_set():
            return "interrupted", {}
        return 200, {"role": "assistant", "content": message.get("content", []),
                     "stop_reason": message.get("stop_reason")}

    # --- endings ---

    def result(self, is_error: bool, subtype: str, text: str, usage: dict, turns: int, *,
               stop_reason: str | None = None, terminal: str = "completed", **extra: object) -> None:
        emit({"type": "result", "subtype": subtype, "is_error": is_error, "duration_ms": 1,
              "num_turns": turns, "result": text, "stop_reason": stop_reason,
              "session_id": self.session_id, "total_cost_usd": 0.0, "usage": usage,
              "permission_denials": [], "terminal_reason": terminal, **extra})

    def not_logged_in(self) -> None:
        text = "Not logged in · Please run /login"
        emit({"type": "assistant", "message": {"id": str(uuid.uuid4()), "model": "<synthetic>",
              "role": "assistant", "content": [{"type": "text", "text": text}]},
              "error": "authentication_failed", "session_id": self.session_id})
        self.result(True, "success", text, {"input_tokens": 0, "output_tokens": 0}, 1)

    def failed(self, status: object, usage: dict, turns: int) -> None:
        if status == 401:
            text = "Failed to authenticate. API Error: 401 authentication_error"
            emit({"type": "assistant", "message": {"id": str(uuid.uuid4()), "model": "<synthetic>",
                  "role": "assistant", "content": [{"type": "text", "text": text}]},
                  "error": "authentication_failed", "session_id": self.session_id})
        else:
            text = f"API Error: {status}"
        self.result(True, "success", text, usage, turns, api_error_status=status)


def _iso(unix: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(unix))


def main() -> int:
    argv = sys.argv[1:]
    if "--version" in argv:
        print(f"{VERSION} (Claude Code)")
        return 0
    if argv[:2] == ["auth", "login"]:
        from fake_claude_login import auth_login  # the same directory

        return auth_login(ENV.get("CLAUDE_CONFIG_DIR") or os.path.join(ENV["HOME"], ".claude"))
    opts = parse_args(argv)
    log({"argv": argv, "cwd": os.getcwd(), "env": dict(ENV)})
    failed = read_prompt_files(opts)
    if failed:
        sys.stderr.write(failed + "\n")
        return 1
    cli = Cli(opts)
    if "--resume" in opts and not cli.load():
        sys.stderr.write(f"No conversation found with session ID: {cli.session_id}\n")
        return 1
    threading.Thread(target=cli.read_stdin, daemon=True).start()
    if cli.resume_turn:
        cli.turn(None)
    while (msg := cli.inbox.get()) is not None:
        if ENV.get("FAKE_CLAUDE_FAULT") == "hang":
            time.sleep(3600)
        if ENV.get("FAKE_CLAUDE_FAULT") == "leak-token":  # a CLI that prints its credentials
            sys.stderr.write(f"request failed: Authorization: Bearer {cli.token}\n"
                             f"token was {cli.token}\n")
            sys.stderr.flush()
            return 1
        cli.turn(msg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
