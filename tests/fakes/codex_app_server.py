"""A fake ``codex app-server`` (Codex CLI 0.169.0 and 0.171.0: one protocol) for the fast test tier.

Standard library only; run as ``python -m tests.fakes.codex_app_server
app-server [-c key=value]... [--disable FEATURE]...``. It speaks the same
newline-delimited JSON-RPC (no ``"jsonrpc"`` field) the real binary speaks on
stdio, as recorded against it:

* ``initialize`` → ``{userAgent, codexHome, platformFamily, platformOs}``,
  then the client's ``initialized`` notification;
* ``account/read`` → ``{"account": {"type": "apiKey"} | null,
  "requiresOpenaiAuth": …}`` from ``$CODEX_HOME/auth.json`` and the provider's
  ``requires_openai_auth`` (default: true for ``openai`` only, as Codex does);
* ``account/login/start`` (``chatgpt``): see codex_fake_login.py;
* ``thread/start`` / ``thread/resume`` (threads are kept in
  ``$CODEX_HOME/sessions/<id>.json``; an unknown id is the real
  ``-32600 no rollout found for thread id …``);
* ``turn/start`` → the result, then ``turn/started``,
  ``item/agentMessage/delta``…, ``thread/tokenUsage/updated`` (``last`` and
  ``total``), ``turn/completed``; several threads run at once;
* a ``function_call`` to one of the thread's ``dynamicTools`` becomes the
  server request ``item/tool/call``, held until the client answers it
  (dynamic tools named ``exec_command``, ``shell_command`` or
  ``request_user_input`` are dropped, as the real one does);
* with ``experimentalRawEvents``: ``rawResponseItem/completed`` per output
  item and ``rawResponse/completed`` per model response, before the tool
  calls are asked for (the real order);
* agent mode (a thread started without ``environments: []``): a
  ``shell_command`` call is Codex's own tool, run by the server itself as
  ``item/started`` / ``item/completed`` of a ``commandExecution`` item (only
  ``echo …`` and ``cat FILE`` relative to the thread's ``cwd`` are simulated;
  anything else exits 127);
* ``turn/interrupt`` → ``{}`` and ``turn/completed`` ``interrupted`` (a held
  tool call is cancelled the real way);
* upstream errors: each retryable failure is an ``error`` notification with
  ``willRetry: true`` (``model_providers.<p>.stream_max_retries`` of them,
  default 5), then ``willRetry: false`` and ``turn/completed`` ``failed``;
  401 → ``httpConnectionFailed``, a 429 ``usage_limit_reached`` →
  ``usageLimitExceeded`` (not retried);
* quota: after every upstream answer with ``x-codex-primary-*`` headers, the
  notification ``account/rateLimits/updated`` (no thread; ``primary`` /
  ``secondary`` with ``usedPercent``, ``windowDurationMins``, ``resetsAt``);
  ``account/rateLimits/read`` asks ``{chatgpt_base_url}/wham/usage`` for a
  ChatGPT login (``auth_mode: chatgpt``, whose ``account/read`` is
  ``{"type": "chatgpt", …}``) and is the real −32600 for an API key.

Replies come from the Responses upstream named by ``-c
model_providers.<p>.base_url=…`` (``POST <base_url>/responses``, streamed), with
the key from ``auth.json``, so they are whatever the fake upstream scripts.

For tests it also writes ``$CODEX_HOME/app-server.pid`` and appends every
``turn/start`` input to ``$CODEX_HOME/turns.jsonl``.

Fault switches, read from ``$CODEX_HOME/fault`` at every turn so a test can
flip them on a running process: ``401`` (the upstream call fails as
unauthorized), ``usage`` (a 429 ``usage_limit_reached``, reset in an hour),
``crash`` (exit 1 after the first text delta), ``hang`` (stop
answering anything, as a wedged process would), ``inject-fails`` (an
error answers ``thread/inject_items``), ``inject-slow`` (it answers after
3 s). Loaded threads are logged to ``$CODEX_HOME/threads.jsonl``
(``{"op": "start" | "unsubscribe", "thread": id}``), so a test sees which
ones were closed.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from .codex_fake_state import (
    Thread, Turn, Upstream, dynamic_tools, parse_config, rate_limits, text_item, turn_info,
    wham_limits,
)

VERSION = "0.171.0"  # the pinned real Codex; its protocol is that of 0.169.0 (verified on both)
_out_lock = threading.Lock()


def send(message: dict[str, Any]) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def notify(method: str, params: dict[str, Any]) -> None:
    send({"method": method, "params": params, "emittedAtMs": int(time.time() * 1000)})


class Server:
    def __init__(self, argv: list[str]) -> None:
        self.home = Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")
        self.upstream = Upstream(parse_config(argv), self.home)
        self.threads: dict[str, Thread] = {}
        self.turns: dict[str, Turn] = {}  # thread id -> running turn
        self.pending: dict[int, tuple[Turn, str, dict[str, Any]]] = {}  # request id -> call
        self.next_request = 0
        self.after: list[Any] = []
        self.lock = threading.Lock()

    # --- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "app-server.pid").write_text(str(os.getpid()))
        for line in sys.stdin:
            if not line.strip():
                continue
            if self.fault() == "hang":
                while True:
                    time.sleep(3600)
            message = json.loads(line)
            if "method" not in message:
                self.on_response(message)
            elif "id" in message:
                self.on_request(message["id"], message["method"], message.get("params") or {})

    def fault(self) -> str:
        try:
            return (self.home / "fault").read_text().strip()
        except OSError:
            return ""

    def on_request(self, rid: Any, method: str, params: dict[str, Any]) -> None:
        handler = getattr(self, "rpc_" + method.replace("/", "_"), None)
        if handler is None:
            send({"id": rid, "error": {"code": -32601, "message": f"unknown method {method}"}})
            return
        try:
            result = handler(params)
        except LookupError as exc:
            send({"id": rid, "error": {"code": -32600, "message": str(exc.args[0])}})
            return
        send({"id": rid, "result": result})
        while self.after:  # what the real server does after answering (a turn's events)
            self.after.pop(0)()

    def on_response(self, message: dict[str, Any]) -> None:
        with self.lock:
            entry = self.pending.pop(message.get("id"), None)
        if entry is not None:
            turn, call_id, slot = entry
            slot["result"] = message.get("result") or {}
            turn.held[call_id].set()

    # --- methods -------------------------------------------------------------------------

    def rpc_initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        client = params.get("clientInfo", {}).get("name", "client")
        return {"userAgent": f"{client}/{VERSION} (fake)", "codexHome": str(self.home),
                "platformFamily": "unix", "platformOs": "linux"}

    def rpc_account_read(self, params: dict[str, Any]) -> dict[str, Any]:
        account = {"type": "apiKey"} if self.upstream.key() else None
        if account is not None and self.upstream.chatgpt():
            account = {"type": "chatgpt", "email": "user@example.com", "planType": "pro"}
        return {"account": account, "userId": None,
                "requiresOpenaiAuth": self.upstream.requires_openai_auth,
                "workspaceRouting": None}

    def rpc_account_rateLimits_read(self, params: dict[str, Any]) -> dict[str, Any]:
        if not self.upstream.chatgpt():
            raise LookupError("chatgpt authentication required to read rate limits")
        try:
            limits = wham_limits(self.upstream.wham_usage())
        except (OSError, ValueError, KeyError) as exc:
            raise LookupError(f"failed to fetch codex rate limits: {exc}") from None
        return {"rateLimits": limits, "rateLimitsByLimitId": {"codex": limits},
                "rateLimitResetCredits": None}

    def rpc_account_login_start(self, params: dict[str, Any]) -> dict[str, Any]:
        from .codex_fake_login import start_login  # see there

        return start_login(self.home, params, notify)

    def rpc_thread_start(self, params: dict[str, Any]) -> dict[str, Any]:
        thread = Thread(str(uuid.uuid4()), params, self.home)
        if params.get("baseInstructions"):
            thread.input.append(text_item("developer", params["baseInstructions"]))
        thread.save()
        self.threads[thread.id] = thread
        self.log_thread("start", thread.id)
        info = thread.info(params.get("cwd") or "")
        notify("thread/started", {"thread": info})
        return {"thread": info, "model": params.get("model"), "cwd": params.get("cwd")}

    def rpc_thread_resume(self, params: dict[str, Any]) -> dict[str, Any]:
        tid = params["threadId"]
        thread = self.threads.get(tid)
        if thread is None:
            path = self.home / "sessions" / f"{tid}.json"
            if not path.exists():
                raise LookupError(f"no rollout found for thread id {tid}")
            saved = json.loads(path.read_text())
            thread = Thread(tid, {**saved["params"], **params}, self.home)
            thread.input = saved["input"]
            self.threads[tid] = thread
        return {"thread": thread.info(params.get("cwd") or ""), "model": params.get("model")}

    def log_thread(self, op: str, thread_id: str) -> None:
        with open(self.home / "threads.jsonl", "a") as fh:
            fh.write(json.dumps({"op": op, "thread": thread_id}) + "\n")

    def rpc_thread_inject_items(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.fault() == "inject-fails":
            raise LookupError("cannot inject these items")
        if self.fault() == "inject-slow":
            time.sleep(3)
        thread = self.threads.get(params["threadId"])
        if thread is None:
            raise LookupError(f"thread not found: {params['threadId']}")
        thread.input.extend(params.get("items") or [])
        thread.save()
        return {}

    def rpc_thread_unsubscribe(self, params: dict[str, Any]) -> dict[str, Any]:
        thread = self.threads.pop(params.get("threadId", ""), None)
        self.log_thread("unsubscribe", params.get("threadId", ""))
        return {"status": "unsubscribed" if thread else "notSubscribed"}

    def rpc_turn_start(self, params: dict[str, Any]) -> dict[str, Any]:
        thread = self.threads.get(params["threadId"])
        if thread is None:
            raise LookupError(f"thread not found: {params['threadId']}")
        turn = Turn(thread)
        turn.effort = params.get("effort")
        self.turns[thread.id] = turn
        texts = [i.get("text", "") for i in params.get("input", []) if i.get("type") == "text"]
        with open(self.home / "turns.jsonl", "a") as log:  # what the client sent, for tests
            log.write(json.dumps({"threadId": thread.id, "input": params.get("input")}) + "\n")
        if texts:  # an empty input continues from injected items (a tool output)
            thread.input.append(text_item("user", "\n".join(texts)))
        self.after.append(threading.Thread(target=self.play, args=(turn,), daemon=True).start)
        return {"turn": turn_info(turn, "inProgress")}

    def rpc_turn_interrupt(self, params: dict[str, Any]) -> dict[str, Any]:
        turn = self.turns.get(params.get("threadId", ""))
        if turn is not None and turn.id == params.get("turnId"):
            turn.interrupted.set()
            for event in list(turn.held.values()):
                event.set()
            if turn.conn is not None and turn.conn.sock is not None:
                try:  # wakes the reader blocked in recv (close() would not)
                    turn.conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        return {}

    # --- a turn --------------------------------------------------------------------------

    def play(self, turn: Turn) -> None:
        thread = turn.thread
        notify("turn/started", {"threadId": thread.id, "turn": turn_info(turn, "inProgress")})
        try:
            status, error = self.steps(turn)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            status, error = ("interrupted", None) if turn.interrupted.is_set() else (
                "failed", {"message": f"stream error: {exc}", "codexErrorInfo": "other"})
        if status == "interrupted":
            thread.input.append(text_item("user", "<turn_aborted>\nThe user interrupted the turn."))
        thread.save()
        self.turns.pop(thread.id, None)
        notify("turn/completed", {"threadId": thread.id, "turn": turn_info(turn, status, error)})

    def steps(self, turn: Turn) -> tuple[str, dict[str, Any] | None]:
        """Upstream requests until the model stops calling tools."""
        thread = turn.thread
        tools = dynamic_tools(thread.params)
        while True:
            outcome = self.request(turn, tools)
            if isinstance(outcome, tuple):
                return outcome
            if not outcome:
                return "completed", None
            # every call of the step is asked for before any answer is awaited, as
            # the real server does with parallel calls
            own = [item for item in outcome if self.runs_itself(turn, item)]
            for item in own:
                thread.input.append({"type": "function_call_output", "call_id": item["call_id"],
                                     "output": self.run_command(turn, item)})
            asked = [(item, self.ask_tool(turn, item)) for item in outcome if item not in own]
            for item, slot in asked:
                result = self.await_tool(turn, item, slot)
                thread.input.append({"type": "function_call_output", "call_id": item["call_id"],
                                     "output": result})
            if turn.interrupted.is_set():
                return "interrupted", None

    def request(self, turn: Turn, tools: dict[str, Any]) -> Any:
        """One upstream call; the tool calls it made, or a (status, error) end."""
        thread = turn.thread
        body = {"model": thread.params.get("model"), "stream": True, "store": False,
                "input": thread.input, "prompt_cache_key": thread.id,
                "reasoning": {"effort": turn.effort, "summary": "auto"} if turn.effort else None,
                "tools": [{"type": "function", "name": t["name"], "description": t["description"],
                           "parameters": t["inputSchema"]} for t in tools.values()]}
        for attempt in range(self.upstream.retries + 1):
            if self.fault() == "401":
                status, answer = 401, {"error": {"message": "Incorrect API key provided"}}
            elif self.fault() == "usage":
                status, answer = 429, {"error": {"type": "usage_limit_reached",
                                                 "resets_in_seconds": 3600}}
            else:
                status, answer = self.upstream.stream(body, turn)
                limits = rate_limits(turn.rate_headers)
                if limits is not None:  # every answer that carried them, as the real one
                    notify("account/rateLimits/updated", {"rateLimits": limits})
            if status == 200:
                return self.relay(turn, answer)
            message = (answer.get("error") or {}).get("message", "")
            error = answer.get("error") or {}
            if status == 429 and error.get("type") == "usage_limit_reached":
                # the real text (0.169.0), the reset in the process's local time
                reset = error.get("resets_at") or time.time() + int(
                    error.get("resets_in_seconds", 3600))
                at = time.localtime(reset)
                clock = time.strftime("%I:%M %p", at).lstrip("0")
                return self.fail(turn, "You\u2019ve hit your usage limit. Upgrade to Pro "
                                 "(https://chatgpt.com/explore/pro), visit https://chatgpt.com/"
                                 "settings/usage to purchase more credits or try again at "
                                 f"{clock}.", "usageLimitExceeded")
            if status in (400, 404) or attempt == self.upstream.retries:
                info = {"httpConnectionFailed": {"httpStatusCode": status}}
                return self.fail(turn, f"unexpected status {status}: {message}", info)
            self.error(turn, f"Reconnecting... {attempt + 1}/{self.upstream.retries}",
                       {"responseStreamDisconnected": {"httpStatusCode": status}}, True,
                       f"unexpected status {status}: {message}")
            if turn.interrupted.wait(0.05 * (attempt + 1)):
                return "interrupted", None
        raise AssertionError("unreachable")

    def fail(self, turn: Turn, message: str, info: Any) -> tuple[str, dict[str, Any]]:
        self.error(turn, message, info, False)
        return "failed", {"message": message, "codexErrorInfo": info}

    def error(self, turn: Turn, message: str, info: Any, retry: bool,
              details: str | None = None) -> None:
        notify("error", {"error": {"message": message, "codexErrorInfo": info,
                                   "additionalDetails": details},
                         "willRetry": retry, "threadId": turn.thread.id, "turnId": turn.id})

    def relay(self, turn: Turn, events: Any) -> Any:
        thread, ids = turn.thread, {"threadId": turn.thread.id, "turnId": turn.id}
        raw = bool(thread.params.get("experimentalRawEvents"))
        calls: list[dict[str, Any]] = []
        for event in events:
            if turn.interrupted.is_set():
                return "interrupted", None
            kind = event.get("type")
            if kind == "response.output_text.delta":
                notify("item/agentMessage/delta", {**ids, "itemId": event["item_id"],
                                                    "delta": event["delta"]})
                if self.fault() == "crash":
                    os._exit(1)
            elif kind == "response.reasoning_summary_text.delta":
                notify("item/reasoning/summaryTextDelta", {
                    **ids, "itemId": event["item_id"], "delta": event["delta"],
                    "summaryIndex": event.get("summary_index", 0)})
            elif kind == "response.output_item.done":
                item = event["item"]
                thread.input.append(item)
                if raw:
                    notify("rawResponseItem/completed", {**ids, "item": item})
                if item["type"] == "message":
                    text = "".join(p.get("text", "") for p in item["content"])
                    notify("item/completed", {**ids, "item": {
                        "type": "agentMessage", "id": item["id"], "text": text}})
                elif item["type"] == "function_call":
                    calls.append(item)
            elif kind in ("response.completed", "response.incomplete"):
                if raw:
                    notify("rawResponse/completed", {**ids, "responseId": event["response"]["id"]})
                self.usage(turn, event["response"].get("usage") or {})
        return calls

    def usage(self, turn: Turn, usage: dict[str, Any]) -> None:
        last = {"inputTokens": usage.get("input_tokens", 0),
                "cachedInputTokens": (usage.get("input_tokens_details") or {}).get(
                    "cached_tokens", 0),
                "outputTokens": usage.get("output_tokens", 0),
                "reasoningOutputTokens": (usage.get("output_tokens_details") or {}).get(
                    "reasoning_tokens", 0),
                "totalTokens": usage.get("total_tokens", 0)}
        total = turn.thread.total
        for key, value in last.items():
            total[key] += value
        notify("thread/tokenUsage/updated", {"threadId": turn.thread.id, "turnId": turn.id,
                                             "tokenUsage": {"last": last, "total": dict(total),
                                                            "modelContextWindow": None}})

    @staticmethod
    def runs_itself(turn: Turn, item: dict[str, Any]) -> bool:
        return item["name"] == "shell_command" and turn.thread.params.get("environments") != []

    def run_command(self, turn: Turn, item: dict[str, Any]) -> str:
        """Codex's own shell tool, simulated, reported as a ``commandExecution`` item."""
        ids = {"threadId": turn.thread.id, "turnId": turn.id}
        command = str(json.loads(item.get("arguments") or "{}").get("command", ""))
        cwd = turn.thread.params.get("cwd") or os.getcwd()
        base = {"type": "commandExecution", "id": item["call_id"], "command": command,
                "cwd": cwd, "processId": None, "commandActions": []}
        notify("item/started", {**ids, "item": {**base, "status": "inProgress",
                                                "aggregatedOutput": None, "exitCode": None}})
        words = command.split()
        code, output = 127, f"{words[0] if words else ''}: command not found\n"
        if words[:1] == ["echo"]:
            code, output = 0, " ".join(words[1:]) + "\n"
        elif words[:1] == ["cat"] and len(words) == 2:
            try:
                code, output = 0, Path(cwd, words[1]).read_text()
            except OSError:
                code, output = 1, f"cat: {words[1]}: No such file or directory\n"
        notify("item/completed", {**ids, "item": {
            **base, "status": "completed" if code == 0 else "failed",
            "aggregatedOutput": output, "exitCode": code, "durationMs": 1}})
        return output

    def ask_tool(self, turn: Turn, item: dict[str, Any]) -> dict[str, Any] | None:
        """Send ``item/tool/call`` for a dynamic tool; the slot its answer fills."""
        call_id, name = item["call_id"], item["name"]
        if name not in dynamic_tools(turn.thread.params):
            return None
        slot: dict[str, Any] = {}
        turn.held[call_id] = threading.Event()
        with self.lock:
            rid = self.next_request
            self.next_request += 1
            self.pending[rid] = (turn, call_id, slot)
        send({"method": "item/tool/call", "id": rid, "params": {
            "threadId": turn.thread.id, "turnId": turn.id, "callId": call_id, "namespace": None,
            "tool": name, "arguments": json.loads(item.get("arguments") or "{}")}})
        return slot

    def await_tool(self, turn: Turn, item: dict[str, Any], slot: dict[str, Any] | None) -> str:
        if slot is None:
            return f"unsupported call: {item['name']}"
        turn.held[item["call_id"]].wait()
        if "result" not in slot:
            return "dynamic tool call was cancelled before receiving a response"
        items = slot["result"].get("contentItems") or []
        return "".join(i.get("text", "") for i in items if i.get("type") == "inputText")


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "app-server":
        sys.stderr.write("usage: codex_app_server app-server [-c key=value]...\n")
        return 2
    if "--version" in argv:
        print(f"codex-cli {VERSION}")
        return 0
    Server(argv[1:]).run()
    # stdin closed: leave at once, as the real server does (turn threads are daemons)
    with _out_lock:
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--version"]:
        print(f"codex-cli {VERSION}")
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
