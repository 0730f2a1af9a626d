"""A fake Qwen Code CLI (stdlib only) speaking 0.15.10's stream-json mode.

Run as ``python fake_qwen.py --auth-type openai --input-format stream-json
-o stream-json [--include-partial-messages] --model M [--exclude-tools a,b]
[--system-prompt S] [--resume SID]``, options parsed as yargs does
(``--openai-base-url`` and ``--openai-api-key`` too); ``QWEN_SYSTEM_MD`` names a
file replacing the system prompt, read for every request; ``QWEN_WRITE_SYSTEM_MD``
names a file it writes its own base prompt into at startup. Replies come from ``OPENAI_BASE_URL``
(a fake upstream), so they are deterministic. What it copies from the real CLI
(each verified on the real binary against the same fake upstream):

* ``initialize`` → ``control_response`` carrying the session id;
* per turn: ``system/init`` (re-emitted every turn), ``stream_event`` deltas,
  one ``assistant``, ``message_stop``, then ``result`` whose ``usage`` is the
  session total (it survives ``--resume``);
* the upstream request: system prompt, a context user message and
  "Got it. Thanks for the context!", then the conversation;
* managed auto-memory: unless ``memory.enableManagedAutoMemory`` is false in
  ``$HOME/.qwen/settings.json``, a second upstream call after every turn;
* no API key: one ``result`` error ("Missing API key ...") and exit 1;
* an upstream error: text ``[API Error: 401 <message>]`` and a *successful* result;
* ``interrupt``: ``control_response``, "Operation cancelled." on stderr, exit 130;
* ``--resume`` of an unknown id: "No saved session found ..." and exit 1;
* transcripts in ``$HOME/.qwen/projects/<cwd>/chats/<sid>.jsonl``;
* ``sdkMcpServers`` in ``initialize``: the MCP handshake (``initialize``,
  ``notifications/initialized``, ``tools/list``) as ``mcp_message`` control
  requests, the tools offered upstream as ``mcp__<server>__<name>``, a call
  sent as ``tools/call`` after the ``assistant`` line that carries it, each
  request sent again after 30 s without an answer (``FAKE_QWEN_MCP_TIMEOUT``);
* (0.24.4) a user message's blocks other than text reach the model as their JSON
  text (a ``tool_result`` block too); a transcript's ``functionCall`` parts and
  ``tool_result`` records are the model's calls and the tools' answers; the
  ``continue_last_turn`` control request runs a session that ends in them
  (a call with no answer gets a made-up error result) with no new user message.

Test switches (not in the real CLI): a prompt containing ``[[crash]]`` makes the
process exit 1 after the first text delta; ``FAKE_QWEN_LOG=<file>`` appends
``{"pid", "argv"}`` at start and ``{"pid", "stdin"}`` for every input line;
``FAKE_QWEN_NO_CONTINUE=1`` answers ``continue_last_turn`` with an error, as a
CLI that does not know it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

VERSION = "0.15.10"
TOOLS = ("list_directory", "read_file", "grep_search", "glob", "edit", "write_file",
         "run_shell_command", "todo_write", "web_fetch")
_write_lock = threading.Lock()
BASE_PROMPT = "You are Qwen Code, an interactive CLI agent."
NOT_RECORDED = ("Tool execution result was not recorded \u2014 likely interrupted by network "
                "failure, abort, or process exit. Treat as failure and retry if needed.")


def log(entry: dict) -> None:
    path = os.environ.get("FAKE_QWEN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")


def emit(obj: dict) -> None:
    with _write_lock:
        sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
        sys.stdout.flush()


def parse_args(argv: list[str]) -> dict:
    """Options as Qwen's yargs parses them: ``--name=value``; ``--name value``
    unless the next word starts with ``-`` (then the option is empty and that
    word is parsed as an option itself, or dropped)."""
    args: dict = {"exclude": set(), "partial": False}
    takes_value = {"auth-type", "input-format", "o", "output-format", "model", "m",
                   "exclude-tools", "system-prompt", "append-system-prompt",
                   "approval-mode", "resume", "r", "openai-base-url", "openai-api-key"}
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word in ("--version", "-v"):
            print(VERSION)
            sys.exit(0)
        if not word.startswith("-") or word.strip("-") == "":
            continue  # a positional prompt (not used here), or a bare dash run: dropped
        name, eq, value = word.lstrip("-").partition("=")
        if name == "include-partial-messages":
            args["partial"] = True
            continue
        if name not in takes_value:
            continue
        if not eq:
            if i < len(argv) and not argv[i].startswith("-"):
                value = argv[i]
                i += 1
            else:
                value = ""
        if name == "exclude-tools":
            args["exclude"].update(v for v in value.split(",") if v)
        else:
            args[name] = value
    return args


class Session:
    def __init__(self, args: dict, home: Path, cwd: Path) -> None:
        self.args = args
        self.model = args.get("model") or args.get("m") or os.environ.get("OPENAI_MODEL", "qwen")
        settings_file = home / ".qwen" / "settings.json"
        try:
            self.settings = json.loads(settings_file.read_text())
        except (OSError, ValueError):
            self.settings = {}
        self.key = args.get("openai-api-key") or os.environ.get("OPENAI_API_KEY") or \
            self.settings.get("security", {}).get("auth", {}).get("apiKey")
        self.base = (args.get("openai-base-url") or os.environ.get(
            "OPENAI_BASE_URL", "https://api.openai.com/v1")).rstrip("/")
        chats = home / ".qwen" / "projects" / re.sub(r"[^a-zA-Z0-9]", "-", str(cwd)) / "chats"
        chats.mkdir(parents=True, exist_ok=True)
        self.cwd = cwd
        self.history: list[dict] = []
        self.parent: str | None = None
        self.totals = {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0}
        resume = args.get("resume") or args.get("r")
        self.id = resume or str(uuid.uuid4())
        self.transcript = chats / f"{self.id}.jsonl"
        if resume:
            if not self.transcript.exists():
                sys.stderr.write(f'No saved session found with title "{resume}".\n')
                sys.exit(1)
            for line in self.transcript.read_text().splitlines():
                self.load(json.loads(line))
        self.tools = [t for t in TOOLS if t not in args["exclude"]]
        self.mcp = SdkMcp()

    def load(self, record: dict) -> None:
        """One transcript record (Qwen's format: Gemini-style role/parts; a
        ``functionCall`` part is a tool call, a ``tool_result`` record's
        ``functionResponse`` parts are the tools' answers)."""
        if record.get("type") not in ("user", "assistant", "tool_result"):
            return
        parts = record["message"].get("parts", [])
        text = "".join(p.get("text", "") for p in parts)
        if record["type"] == "tool_result":
            for part in parts:
                answer = part.get("functionResponse") or {}
                response = answer.get("response") or {}
                self.history.append({"role": "tool", "tool_call_id": answer.get("id"), "content": [
                    {"type": "text", "text": str(response.get("output", response.get("error")))}]})
        elif record["type"] == "user":
            self.history.append({"role": "user", "content": [{"type": "text", "text": text}]})
        else:
            entry: dict = {"role": "assistant", "content": text}
            calls = [p["functionCall"] for p in parts if "functionCall" in p]
            if calls:
                entry["content"] = text or None
                entry["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                    "name": c["name"], "arguments": json.dumps(c.get("args") or {},
                                                               separators=(",", ":"))}}
                    for c in calls]
            self.history.append(entry)
        usage = record.get("usageMetadata") or {}
        self.totals["input_tokens"] += usage.get("promptTokenCount", 0)
        self.totals["output_tokens"] += usage.get("candidatesTokenCount", 0)
        self.parent = record.get("uuid")

    def record(self, kind: str, text: str, usage: dict | None = None) -> None:
        record = {"uuid": str(uuid.uuid4()), "parentUuid": self.parent, "sessionId": self.id,
                  "type": kind, "cwd": str(self.cwd), "version": VERSION,
                  "message": {"role": "user" if kind == "user" else "model",
                              "parts": [{"text": text}]}}
        if usage:
            record["usageMetadata"] = {"promptTokenCount": usage["input_tokens"],
                                       "candidatesTokenCount": usage["output_tokens"]}
        self.parent = record["uuid"]
        with self.transcript.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def system_prompt(self) -> str:
        """As Qwen builds it for every request: ``QWEN_SYSTEM_MD`` (a file read
        each time) or ``--system-prompt`` replace the agent prompt."""
        text = self.args.get("system-prompt") or BASE_PROMPT
        system_md = os.environ.get("QWEN_SYSTEM_MD")
        if system_md and system_md.lower() not in ("0", "false", "1", "true"):
            if not os.path.exists(system_md):
                raise RuntimeError(f"missing system prompt file '{os.path.abspath(system_md)}'")
            with open(system_md, encoding="utf-8") as fh:
                text = fh.read()
        if self.args.get("append-system-prompt"):
            text += "\n\n" + self.args["append-system-prompt"]
        return text

    def request_body(self, stream: bool) -> dict:
        context = (f"This is the Qwen Code. We are setting up the context for our chat.\n"
                   f"I'm currently working in the directory: {self.cwd}")
        body = {"model": self.model, "stream": stream, "max_tokens": 8000, "messages": [
            {"role": "system", "content": self.system_prompt()},
            {"role": "user", "content": [{"type": "text", "text": context}]},
            {"role": "assistant", "content": "Got it. Thanks for the context!"},
            *self.history]}
        if stream:
            body["stream_options"] = {"include_usage": True}
        body["tools"] = [{"type": "function", "function": {  # [] when all are excluded, as Qwen
            "name": t, "description": t, "parameters": {"type": "object"}}} for t in self.tools] + [
            {"type": "function", "function": {"name": f"mcp__{server}__{t['name']}",
                                              "description": t.get("description", ""),
                                              "parameters": t.get("inputSchema") or {}}}
            for server, tools in self.mcp.servers.items() for t in tools]
        return body

    def post(self, body: dict):
        request = urllib.request.Request(
            self.base + "/chat/completions", data=json.dumps(body).encode(), method="POST",
            headers={"content-type": "application/json", "authorization": f"Bearer {self.key}"})
        return urllib.request.urlopen(request, timeout=120)

    def wrap(self, event: dict) -> None:
        if self.args["partial"]:
            emit({"type": "stream_event", "uuid": str(uuid.uuid4()), "session_id": self.id,
                  "parent_tool_use_id": None, "event": event})

    def turn(self, content) -> None:
        """A user message's turn; None: ``continue_last_turn`` (the session ends
        in tool results, sent upstream with no new user message)."""
        emit({"type": "system", "subtype": "init", "uuid": self.id, "session_id": self.id,
              "cwd": str(self.cwd), "tools": self.tools + self.mcp_tools(), "model": self.model,
              "mcp_servers": [{"name": n, "status": "connected"} for n in self.mcp.servers],
              "permission_mode": self.args.get("approval-mode", "default"),
              "qwen_code_version": VERSION, "agents": []})
        if isinstance(content, list):  # as 0.24.4: any block but text is sent as its JSON
            content = [b if b.get("type") == "text" and b.get("text") else
                       {"type": "text", "text": json.dumps(b, separators=(",", ":"))}
                       for b in content if isinstance(b, dict) and "type" in b]
        text_in = content if isinstance(content, str) else \
            "\n".join(b.get("text", "") for b in content or ())
        if content is not None:
            self.history.append({"role": "user", "content": content})
            self.record("user", text_in)
        text, calls = self.call_model(text_in)
        while calls:  # tools run here, one upstream call per step, like the real CLI
            results = [self.run_tool(call) for call in calls]
            emit({"type": "user", "session_id": self.id, "parent_tool_use_id": None,
                  "message": {"role": "user", "content": [
                      {"type": "tool_result", "tool_use_id": c["id"], "is_error": err,
                       "content": out} for c, (out, err) in zip(calls, results)]}})
            self.history += [{"role": "tool", "tool_call_id": c["id"],
                              "content": [{"type": "text", "text": out}]}
                             for c, (out, _) in zip(calls, results)]
            text, calls = self.call_model(text_in)
        if self.settings.get("memory", {}).get("enableManagedAutoMemory", True):
            with self.post(self.request_body(stream=False)):
                pass  # the managed auto-memory extraction pass
        emit({"type": "result", "subtype": "success", "uuid": str(uuid.uuid4()),
              "session_id": self.id, "is_error": False, "num_turns": 1, "result": text,
              "usage": dict(self.totals), "permission_denials": []})

    def call_model(self, text_in: str) -> tuple[str, list[dict]]:
        """One streamed upstream call: its text and tool calls, as Qwen prints them."""
        mid = str(uuid.uuid4())
        self.wrap({"type": "message_start", "message": {"id": mid, "role": "assistant",
                                                         "model": self.model, "content": []}})
        self.wrap({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}})
        text, usage, calls = "", {"prompt_tokens": 0, "completion_tokens": 0}, {}
        try:
            with self.post(self.request_body(stream=True)) as response:
                for raw in response:
                    line = raw.decode().strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        for tc in delta.get("tool_calls") or []:
                            call = calls.setdefault(tc["index"], {"id": "", "name": "", "args": ""})
                            call["id"] = tc.get("id") or call["id"]
                            call["name"] += (tc.get("function") or {}).get("name") or ""
                            call["args"] += (tc.get("function") or {}).get("arguments") or ""
                        if delta.get("content"):
                            text += delta["content"]
                            self.wrap({"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": delta["content"]}})
                            if "[[crash]]" in text_in:
                                os._exit(1)
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = exc.reason
            text = f"[API Error: {exc.code} {message}]"
            self.wrap({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "text_delta", "text": text}})
        self.wrap({"type": "content_block_stop", "index": 0})
        turn_usage = {"input_tokens": usage.get("prompt_tokens", 0),
                      "output_tokens": usage.get("completion_tokens", 0),
                      "cache_read_input_tokens": 0}
        for key, value in turn_usage.items():
            self.totals[key] += value
        tool_calls = [{"id": c["id"], "name": c["name"], "input": json.loads(c["args"] or "{}")}
                      for _, c in sorted(calls.items())]
        blocks = ([{"type": "text", "text": text}] if text or not tool_calls else []) + [
            {"type": "tool_use", **c} for c in tool_calls]
        emit({"type": "assistant", "uuid": mid, "session_id": self.id, "parent_tool_use_id": None,
              "message": {"id": mid, "type": "message", "role": "assistant", "model": self.model,
                          "content": blocks, "stop_reason": None,
                          "usage": {**turn_usage, "total_tokens": sum(turn_usage.values())}}})
        self.wrap({"type": "message_stop"})
        entry: dict = {"role": "assistant", "content": text}
        if tool_calls:
            entry["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["name"], "arguments": json.dumps(c["input"])}} for c in tool_calls]
        self.history.append(entry)
        self.record("assistant", text, turn_usage)
        return text, tool_calls

    def mcp_tools(self) -> list[str]:
        return [f"mcp__{server}__{tool['name']}" for server, tools in self.mcp.servers.items()
                for tool in tools]

    def run_tool(self, call: dict) -> tuple[str, bool]:
        """An SDK MCP tool goes to the controlling process; nothing else exists here."""
        _, server, name = (call["name"].split("__", 2) + ["", ""])[:3]
        if call["name"].startswith("mcp__") and server in self.mcp.servers:
            result = self.mcp.request(server, "tools/call", {"name": name, "arguments": call["input"]})
            text = "".join(c.get("text", "") for c in result.get("content") or [])
            return text, bool(result.get("isError"))
        return (f'Tool "{call["name"]}" not found in registry. Tools must use the exact names '
                "that are registered."), True


class SdkMcp:
    """Qwen's side of in-band SDK MCP servers: requests go out as ``mcp_message``
    control requests; each waits for its ``control_response`` (30 s, then the
    same request again, as Qwen 0.15.10 does)."""

    def __init__(self) -> None:
        self.servers: dict[str, list[dict]] = {}
        self.responses: dict[str, dict] = {}
        self.arrived = threading.Condition()
        self.timeout = float(os.environ.get("FAKE_QWEN_MCP_TIMEOUT", "30"))
        self.ids = 0

    def connect(self, servers: dict) -> None:
        for key, config in servers.items():
            name = (config or {}).get("name") or key
            self.request(name, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                              "clientInfo": {"name": f"qwen-cli-mcp-client-{name}"}})
            self.request(name, "notifications/initialized", None)
            self.servers[name] = self.request(name, "tools/list", {}).get("tools") or []

    def request(self, server: str, method: str, params: dict | None) -> dict:
        message: dict = {"method": method, "jsonrpc": "2.0"}
        if params is not None:
            message["params"] = params
            message["id"] = self.ids
            self.ids += 1
        for _ in range(3):
            rid = str(uuid.uuid4())
            emit({"type": "control_request", "request_id": rid, "request": {
                "subtype": "mcp_message", "server_name": server, "message": message}})
            with self.arrived:
                if self.arrived.wait_for(lambda: rid in self.responses, self.timeout):
                    response = self.responses.pop(rid)
                    return ((response.get("response") or {}).get("mcp_response") or {}).get(
                        "result") or {}
        return {"isError": True, "content": [{"type": "text", "text": "MCP request timed out"}]}

    def answered(self, response: dict) -> None:
        with self.arrived:
            self.responses[str(response.get("request_id"))] = response
            self.arrived.notify_all()


def main() -> None:
    log({"argv": sys.argv[1:]})
    args = parse_args(sys.argv[1:])
    home = Path(os.environ.get("HOME", "."))
    session = Session(args, home, Path.cwd())
    if os.environ.get("QWEN_WRITE_SYSTEM_MD"):  # Qwen writes its own base prompt at startup
        with open(os.environ["QWEN_WRITE_SYSTEM_MD"], "w", encoding="utf-8") as fh:
            fh.write(BASE_PROMPT)
    if not session.key:
        emit({"type": "result", "subtype": "error_during_execution", "session_id": session.id,
              "is_error": True, "num_turns": 0, "usage": {"input_tokens": 0, "output_tokens": 0},
              "permission_denials": [], "error": {"message": (
                  "Missing API key for OpenAI-compatible auth. Set settings.security.auth.apiKey,"
                  " or set the 'OPENAI_API_KEY' environment variable.")}})
        sys.exit(1)
    turns: list = []
    ready = threading.Condition()

    def read_stdin() -> None:
        for line in sys.stdin:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            log({"stdin": message})
            request = message.get("request") or {}
            if message.get("type") == "control_request":
                rid = message.get("request_id")
                if request.get("subtype") == "interrupt":
                    emit({"type": "control_response", "response": {
                        "subtype": "success", "request_id": rid,
                        "response": {"subtype": "interrupt"}}})
                    sys.stderr.write("Operation cancelled.\n")
                    sys.stderr.flush()
                    os._exit(130)
                if request.get("subtype") == "continue_last_turn" and \
                        os.environ.get("FAKE_QWEN_NO_CONTINUE"):  # as a CLI that lacks it
                    emit({"type": "control_response", "response": {
                        "subtype": "error", "request_id": rid,
                        "error": "Unknown control request subtype: continue_last_turn"}})
                    continue
                if request.get("subtype") == "continue_last_turn":
                    # 0.24.4: accepted when the session ends in the model's calls, their
                    # results or a prompt (a dangling call gets a made-up error result)
                    last = session.history[-1] if session.history else {}
                    accepted = last.get("role") in ("tool", "user") or bool(last.get("tool_calls"))
                    if last.get("tool_calls"):
                        session.history += [{"role": "tool", "tool_call_id": c["id"], "content": [
                            {"type": "text", "text": NOT_RECORDED}]} for c in last["tool_calls"]]
                    emit({"type": "control_response", "response": {
                        "subtype": "success", "request_id": rid, "response": {
                            "subtype": "continue_last_turn", "accepted": accepted,
                            "interruption": "interrupted_prompt" if accepted else "none"}}})
                    if accepted:
                        with ready:
                            turns.append(("continue",))
                            ready.notify()
                    continue
                emit({"type": "control_response", "response": {
                    "subtype": "success", "request_id": rid, "response": {
                        "subtype": request.get("subtype"), "session_id": session.id,
                        "capabilities": {"can_handle_can_use_tool": True,
                                         "can_handle_mcp_message": True}}}})
                if request.get("subtype") == "initialize" and request.get("sdkMcpServers"):
                    with ready:  # connected from the main loop: this thread reads the answers
                        turns.append(("connect", request["sdkMcpServers"]))
                        ready.notify()
            elif message.get("type") == "control_response":
                session.mcp.answered(message.get("response") or {})
            elif message.get("type") == "user":
                with ready:
                    turns.append(message["message"]["content"])
                    ready.notify()
        with ready:
            turns.append(None)
            ready.notify()

    threading.Thread(target=read_stdin, daemon=True).start()
    while True:
        with ready:
            while not turns:
                ready.wait()
            content = turns.pop(0)
        if content is None:
            return
        if content == ("continue",):
            session.turn(None)
        elif isinstance(content, tuple):
            session.mcp.connect(content[1])
        else:
            session.turn(content)


if __name__ == "__main__":
    main()
