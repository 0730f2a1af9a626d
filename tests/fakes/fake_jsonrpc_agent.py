"""A fake stdio JSON-RPC 2.0 agent (stdlib only), Lingma/ACP style.

One process, several sessions; each prompt runs in a thread of its own, so
sessions stream concurrently, like ACP allows. Replies come from
``OPENAI_BASE_URL`` (a fake upstream) with the session's whole history, so a
test can see what the agent was sent. Two dialects, to prove the
``jsonrpc`` driver is configured by names and not built for one agent:

``acp`` (default; what ``qwen --acp`` speaks)
    ``initialize`` → ``{protocolVersion, agentInfo}``; ``session/new {cwd,
    mcpServers}`` → ``{sessionId}``; ``session/prompt {sessionId, prompt:
    [blocks]}`` streams ``session/update {sessionId, update: {sessionUpdate:
    "agent_message_chunk", content: {type: "text", text}}}`` and answers
    ``{stopReason: "end_turn", _meta: {usage: {inputTokens, outputTokens}}}``;
    ``session/cancel`` (notification) ends a prompt with ``"cancelled"``.
``lingma`` (``--dialect lingma``)
    ``chat/init``, ``chat/start`` → ``{conversation: {id}}``, ``chat/ask
    {conversationId, content}`` streams ``chat/delta {conversationId, delta:
    {kind: "text", text}}`` and answers ``{finishReason: "stop", usage:
    {input_tokens, output_tokens}}``; ``chat/stop``; ``chat/end``.

No ``OPENAI_API_KEY``: ``session/new`` fails with -32000 "Authentication
required" (as ACP agents do); an upstream 401 fails the prompt the same way.
``FAKE_AGENT_FAIL_INITIALIZE=1``: ``initialize`` fails (``FAKE_AGENT_LEAKY=1``:
its error prints the key, as a vendor may).
Test switches: a prompt containing ``[[crash]]`` exits 1 after the first chunk;
``FAKE_AGENT_LOG=<file>`` appends ``{"pid", "argv"}`` at start and ``{"pid",
"stdin"}`` for every message received.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import urllib.error
import urllib.request
import uuid

DIALECTS = {
    "acp": {"initialize": "initialize", "new": "session/new", "prompt": "session/prompt",
            "update": "session/update", "cancel": "session/cancel", "end": "session/end"},
    "lingma": {"initialize": "chat/init", "new": "chat/start", "prompt": "chat/ask",
               "update": "chat/delta", "cancel": "chat/stop", "end": "chat/end"},
}
AUTH_REQUIRED = -32000
_out = threading.Lock()


def log(entry: dict) -> None:
    path = os.environ.get("FAKE_AGENT_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")


def send(obj: dict) -> None:
    obj = {"jsonrpc": "2.0", **obj}
    with _out:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


class Agent:
    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.m = DIALECTS[dialect]
        self.sessions: dict[str, list[dict]] = {}
        self.cancelled: set[str] = set()
        self.active: dict[str, socket.socket] = {}
        self.key = os.environ.get("OPENAI_API_KEY")
        self.base = os.environ.get("OPENAI_BASE_URL", "").rstrip("/")
        self.model = os.environ.get("OPENAI_MODEL", "fake-model")

    def handle(self, msg: dict) -> None:
        method, params, mid = msg.get("method"), msg.get("params") or {}, msg.get("id")
        if method == self.m["initialize"] and os.environ.get("FAKE_AGENT_FAIL_INITIALIZE"):
            leaky = os.environ.get("FAKE_AGENT_LEAKY") == "1"
            send({"id": mid, "error": {"code": -32603, "message": "bad configuration"
                                       + (f" for key {self.key}" if leaky else "")}})
        elif method == self.m["initialize"]:
            send({"id": mid, "result": {"protocolVersion": 1, "agentCapabilities": {},
                                        "authMethods": [{"id": "openai-key", "name": "API key"}],
                                        "agentInfo": {"name": "fake-agent", "version": "1.2.3"}}})
        elif method == self.m["new"]:
            if not self.key:
                send({"id": mid, "error": {"code": AUTH_REQUIRED, "message": "Authentication required"}})
                return
            sid = str(uuid.uuid4())
            self.sessions[sid] = []
            send({"id": mid, "result": {"sessionId": sid} if self.dialect == "acp"
                  else {"conversation": {"id": sid}}})
        elif method == self.m["prompt"]:
            threading.Thread(target=self.prompt, args=(mid, params), daemon=True).start()
        elif method == self.m["cancel"]:
            sid = self.sid(params)
            self.cancelled.add(sid)
            sock = self.active.pop(sid, None)
            if sock is not None:  # unblock a read waiting on a hanging upstream
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        elif method == self.m["end"]:
            self.sessions.pop(self.sid(params), None)
            send({"id": mid, "result": {}})
        elif mid is not None:
            send({"id": mid, "error": {"code": -32601, "message": f"Method not found: {method}"}})

    def sid(self, params: dict) -> str:
        return str(params.get("sessionId") if self.dialect == "acp" else params.get("conversationId"))

    def chunk(self, sid: str, text: str) -> None:
        if self.dialect == "acp":
            send({"method": self.m["update"], "params": {"sessionId": sid, "update": {
                "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}})
        else:
            send({"method": self.m["update"], "params": {"conversationId": sid,
                                                         "delta": {"kind": "text", "text": text}}})

    def done(self, mid, stop: str, usage: dict) -> None:
        if self.dialect == "acp":
            send({"id": mid, "result": {"stopReason": stop, "_meta": {"usage": {
                "inputTokens": usage.get("prompt_tokens", 0),
                "outputTokens": usage.get("completion_tokens", 0)}}}})
        else:
            send({"id": mid, "result": {"finishReason": "stop" if stop == "end_turn" else stop,
                                        "usage": {"input_tokens": usage.get("prompt_tokens", 0),
                                                  "output_tokens": usage.get("completion_tokens", 0)}}})

    def prompt(self, mid, params: dict) -> None:
        sid = self.sid(params)
        history = self.sessions.get(sid)
        if history is None:
            send({"id": mid, "error": {"code": -32602, "message": f"Unknown session {sid}"}})
            return
        blocks = params.get("prompt" if self.dialect == "acp" else "content") or []
        text_in = "\n".join(b.get("text", "") for b in blocks if isinstance(b, dict))
        history.append({"role": "user", "content": text_in})
        self.cancelled.discard(sid)
        body = {"model": self.model, "stream": True, "messages": history,
                "stream_options": {"include_usage": True}}
        request = urllib.request.Request(
            self.base + "/chat/completions", data=json.dumps(body).encode(), method="POST",
            headers={"content-type": "application/json", "authorization": f"Bearer {self.key}"})
        text, usage = "", {}
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                self.active[sid] = response.fp.raw._sock
                for raw in response:
                    line = raw.decode().strip()
                    if sid in self.cancelled:
                        break
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    data = json.loads(line[5:])
                    usage = data.get("usage") or usage
                    for choice in data.get("choices") or []:
                        delta = (choice.get("delta") or {}).get("content")
                        if delta:
                            text += delta
                            self.chunk(sid, delta)
                            if "[[crash]]" in text_in:
                                os._exit(1)
        except (OSError, ValueError) as exc:
            if sid in self.cancelled:
                pass  # the read was cut by session/cancel
            elif not isinstance(exc, urllib.error.HTTPError):
                send({"id": mid, "error": {"code": -32603, "message": f"upstream failed: {exc}"}})
                history.pop()
                return
            else:
                code = AUTH_REQUIRED if exc.code in (401, 403) else -32603
                send({"id": mid, "error": {"code": code, "message": f"upstream said {exc.code}",
                                           "data": {"status": exc.code}}})
                history.pop()
                return
        finally:
            self.active.pop(sid, None)
        history.append({"role": "assistant", "content": text})
        self.done(mid, "cancelled" if sid in self.cancelled else "end_turn", usage)


def main() -> None:
    dialect = "acp"
    if "--dialect" in sys.argv:
        dialect = sys.argv[sys.argv.index("--dialect") + 1]
    agent = Agent(dialect)
    log({"argv": sys.argv[1:]})
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        log({"stdin": msg})
        if isinstance(msg, dict) and "method" in msg:
            agent.handle(msg)


if __name__ == "__main__":
    main()
