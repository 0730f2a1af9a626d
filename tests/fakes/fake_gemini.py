"""A fake Gemini CLI (stdlib only) speaking 0.61.0's ``--acp`` mode.

Run as ``python fake_gemini.py --acp --model M``. Replies come from the
Gemini API at ``GOOGLE_GEMINI_BASE_URL`` (tests/fakes/gemini_cli_upstream.py)
with ``GEMINI_API_KEY`` in ``x-goog-api-key``, so they are deterministic.
What it copies from the real CLI (each seen on 0.61.0 against the same fake):

* ``--version`` prints the version;
* ``initialize`` → ``{protocolVersion, authMethods, agentInfo: {name:
  "gemini-cli", version}}``; ``session/new {cwd, mcpServers}`` →
  ``{sessionId, modes, models}``;
* ``session/prompt`` posts ``models/M:streamGenerateContent?alt=sse`` with
  the session's whole history, a ``<session_context>`` part before the first
  prompt, ``systemInstruction`` from the file ``GEMINI_SYSTEM_MD`` names (else
  the CLI's long agent prompt), and its tools but those ``tools.exclude``
  in ``$HOME/.gemini/settings.json`` lists; streams
  ``agent_message_chunk`` updates and answers ``{stopReason: "end_turn",
  _meta: {quota: {token_count: {input_tokens, output_tokens}}}}``;
* agent mode: a ``functionCall`` of one of its tools is a ``tool_call``
  update, a ``session/request_permission`` request, then a
  ``tool_call_update`` (``completed``) and the next upstream call;
* ``mcpServers`` of ``type: "http"`` in ``session/new`` (only in a trusted
  folder: ``GEMINI_CLI_TRUST_WORKSPACE=true``): MCP ``initialize``,
  ``notifications/initialized`` and ``tools/list`` over HTTP with the given
  headers; their tools offered as ``mcp_<server>_<name>``; a call asks
  ``session/request_permission`` (tool call id ``mcp_<server>_<name>__…``),
  then posts ``tools/call`` and waits for its answer, then a
  ``tool_call_update``; the output goes back wrapped in ``<untrusted_context>``;
* ``session/cancel`` ends a prompt with ``cancelled``;
* a Google login (``oauth-personal`` and ``oauth_creds.json``): turns go to
  the Code Assist API at ``CODE_ASSIST_ENDPOINT`` with the access token;
  a login Google does not accept (here: the access token ``revoked``) makes
  ``--acp`` print its interactive login on stdout and read two lines of its
  stdin as codes, then exit 41, as 0.61.0 does with no network to Google
  (so also with its ``HTTPS_PROXY`` set and not listening);
* neither: ``session/new`` fails with -32000 "Gemini API key
  is missing or not configured."; an upstream error fails the prompt with a
  JSON-RPC error whose code is the HTTP status and whose message is the
  API's error body (a refused key: 400 ``API_KEY_INVALID``).

Interactive (no ``--acp``), with no ``oauth_creds.json`` and Google's login
selected, it logs in as 0.61.0 does with no browser: "Please visit the
following URL to authorize the application:", the authorize URL
(``FAKE_GEMINI_OAUTH_URL`` or Google's; with a fake IdP the redirect is its
``/authcode``), "Enter the authorization code: " read
from its terminal (no terminal: "Manual authorization is required ...", exit
41); a code starting ``bad`` is refused ("Failed to authenticate with
authorization code: invalid_grant", asked again, twice at most, then exit
41); another becomes ``~/.gemini/oauth_creds.json`` (0600) and the process
stays in its interactive screen.

Test switches (not in the real CLI): ``FAKE_GEMINI_LOG=<file>`` appends
``{"pid", "argv", "cwd", "env": {GEMINI_SYSTEM_MD}}`` at start and ``{"pid",
"stdin"}`` for every message; a prompt holding ``[[crash]]`` prints a line
with a token on stderr and exits 1.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

VERSION = "0.61.0"
TOOLS = ("list_directory", "read_file", "grep_search", "glob", "replace", "write_file",
         "run_shell_command", "web_fetch")
AGENT_PROMPT = "You are an interactive CLI agent specializing in software engineering tasks."
_out = threading.Lock()
_pending: dict[int, threading.Event] = {}
_answers: dict[int, dict] = {}


def log(entry: dict) -> None:
    path = os.environ.get("FAKE_GEMINI_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")


def send(obj: dict) -> None:
    with _out:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", **obj}) + "\n")
        sys.stdout.flush()


def settings() -> dict:
    try:
        return json.loads((Path(os.environ["HOME"]) / ".gemini" / "settings.json").read_text())
    except (OSError, ValueError, KeyError):
        return {}


def tools() -> list[str]:
    excluded = settings().get("tools", {}).get("exclude") or []
    return [t for t in TOOLS if t not in excluded]


def google_token() -> str | None:
    """The access token of a Google login (``oauth-personal`` selected)."""
    if settings().get("security", {}).get("auth", {}).get("selectedType") != "oauth-personal":
        return None
    try:
        creds = json.loads((Path(os.environ["HOME"]) / ".gemini" / "oauth_creds.json").read_text())
    except (OSError, ValueError):
        return None
    return creds.get("access_token")


def proxy_reachable() -> bool:
    """The egress proxy in ``HTTPS_PROXY`` (if any) takes connections."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    if not proxy:
        return True
    parts = urllib.parse.urlsplit(proxy)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), 2).close()
    except OSError:
        return False
    return True


def system_prompt() -> str:
    path = os.environ.get("GEMINI_SYSTEM_MD")
    return Path(path).read_text() if path else AGENT_PROMPT


class Cli:
    def __init__(self, model: str) -> None:
        self.model = model
        self.sessions: dict[str, list[dict]] = {}
        self.mcp: dict[str, dict[str, dict]] = {}  # session -> tool name -> server
        self.cancelled: set[str] = set()
        self.ids = iter(range(1000, 10**9))

    def handle(self, msg: dict) -> None:
        method, params, mid = msg.get("method"), msg.get("params") or {}, msg.get("id")
        if method is None and mid in _pending:  # the answer to a permission request
            _answers[mid] = msg.get("result") or {}
            _pending.pop(mid).set()
        elif method == "initialize":
            send({"id": mid, "result": {"protocolVersion": 1, "authMethods": [
                {"id": "oauth-personal", "name": "Log in with Google"},
                {"id": "gemini-api-key", "name": "Gemini API key"}],
                "agentInfo": {"name": "gemini-cli", "title": "Gemini CLI", "version": VERSION},
                "agentCapabilities": {"loadSession": True}}})
        elif method == "session/new":
            if not os.environ.get("GEMINI_API_KEY") and google_token() is None:
                send({"id": mid, "error": {"code": -32000, "message":
                      "Gemini API key is missing or not configured."}})
                return
            sid = str(uuid.uuid4())
            self.sessions[sid] = []
            self.mcp[sid] = {}
            if os.environ.get("GEMINI_CLI_TRUST_WORKSPACE") == "true":
                for server in params.get("mcpServers") or []:
                    for tool in mcp_tools(server):
                        self.mcp[sid][f"mcp_{server['name']}_{tool['name']}"] = server
            send({"id": mid, "result": {"sessionId": sid, "modes": {"currentModeId": "default"}}})
        elif method == "session/prompt":
            threading.Thread(target=self.prompt, args=(mid, params), daemon=True).start()
        elif method == "session/cancel":
            self.cancelled.add(str(params.get("sessionId")))
        elif mid is not None:
            send({"id": mid, "error": {"code": -32601, "message": f"Method not found: {method}"}})

    def update(self, sid: str, update: dict) -> None:
        send({"method": "session/update", "params": {"sessionId": sid, "update": update}})

    def prompt(self, mid, params: dict) -> None:
        sid = str(params.get("sessionId"))
        history = self.sessions.get(sid)
        if history is None:
            send({"id": mid, "error": {"code": -32602, "message": f"Session not found: {sid}"}})
            return
        parts = [{"text": b["text"]} for b in params.get("prompt") or [] if b.get("type") == "text"]
        if not history:
            parts.insert(0, {"text": "<session_context>\nThis is the Gemini CLI.\n</session_context>"})
        if any("[[crash]]" in p["text"] for p in parts):
            print("fake-gemini-stderr: token ya29.secret", file=sys.stderr, flush=True)
            os._exit(1)
        history.append({"role": "user", "parts": parts})
        self.cancelled.discard(sid)
        usage = {"input_tokens": 0, "output_tokens": 0}
        while True:
            try:
                answer = self.generate(sid, history, usage)
            except urllib.error.HTTPError as exc:
                history.pop()  # the real CLI's error: the API's status and its body
                send({"id": mid, "error": {"code": exc.code, "message": exc.read().decode()}})
                return
            if sid in self.cancelled:
                send({"id": mid, "result": {"stopReason": "cancelled"}})
                return
            history.append({"role": "model", "parts": answer})
            calls = [p["functionCall"] for p in answer if "functionCall" in p]
            if not calls:
                break
            history.append({"role": "user", "parts": [
                self.run_mcp(sid, c) if c["name"] in self.mcp[sid] else self.run_tool(sid, c)
                for c in calls]})
        send({"id": mid, "result": {"stopReason": "end_turn",
                                    "_meta": {"quota": {"token_count": usage}}}})

    def ask(self, sid: str, call_id: str) -> bool:
        rid = next(self.ids)
        event = _pending[rid] = threading.Event()
        send({"id": rid, "method": "session/request_permission", "params": {
            "sessionId": sid, "toolCall": {"toolCallId": call_id, "status": "pending"},
            "options": [{"optionId": "proceed_once", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "cancel", "name": "Reject", "kind": "reject_once"}]}})
        event.wait(60)
        return _answers.pop(rid, {}).get("outcome", {}).get("optionId") == "proceed_once"

    def run_mcp(self, sid: str, call: dict) -> dict:
        server = self.mcp[sid][call["name"]]
        call_id = f"{call['name']}__{call['name']}_{uuid.uuid4().int % 10**13}_0"
        if not self.ask(sid, call_id):
            return {"functionResponse": {"name": call["name"], "response": {
                "error": "denied by the user"}}}
        tool = call["name"][len(f"mcp_{server['name']}_"):]
        result = mcp_post(server, "tools/call", {"name": tool, "arguments": call.get("args") or {}})
        text = "\n".join(c.get("text", "") for c in result.get("content") or [])
        self.update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                          "status": "completed", "title": f"{tool} ({server['name']} MCP Server)",
                          "content": [{"type": "content", "content": {"type": "text",
                                                                       "text": text}}]})
        return {"functionResponse": {"name": call["name"], "response": {
            "output": f"<untrusted_context>\n{text}\n</untrusted_context>"}}}

    def run_tool(self, sid: str, call: dict) -> dict:
        call_id = f"{call['name']}-{uuid.uuid4().hex[:8]}"
        self.update(sid, {"sessionUpdate": "tool_call", "toolCallId": call_id, "status": "pending",
                          "title": call["name"], "kind": "read", "rawInput": call.get("args")})
        allowed = self.ask(sid, call_id)
        output = f"ran {call['name']}" if allowed else "the user refused"
        self.update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                          "status": "completed" if allowed else "failed",
                          "content": [{"type": "content", "content": {"type": "text",
                                                                       "text": output}}]})
        return {"functionResponse": {"name": call["name"], "response": {"output": output}}}

    def generate(self, sid: str, history: list[dict], usage: dict) -> list[dict]:
        body: dict = {"contents": history, "systemInstruction": {
            "role": "user", "parts": [{"text": system_prompt()}]}}
        body["tools"] = [{"functionDeclarations": [{"name": n} for n in tools()]
                                                   + [{"name": n} for n in self.mcp[sid]]}]
        token = None if os.environ.get("GEMINI_API_KEY") else google_token()
        if token is not None:  # a Google login: the Code Assist API
            base = os.environ.get("CODE_ASSIST_ENDPOINT", "https://cloudcode-pa.googleapis.com")
            url = f"{base.rstrip('/')}/v1internal:streamGenerateContent?alt=sse"
            body = {"model": self.model, "project": "fake-project", "request": body}
            headers = {"authorization": f"Bearer {token}"}
        else:
            base = os.environ.get("GOOGLE_GEMINI_BASE_URL", "").rstrip("/")
            url = f"{base}/v1beta/models/{self.model}:streamGenerateContent?alt=sse"
            headers = {"x-goog-api-key": os.environ.get("GEMINI_API_KEY", "")}
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                         headers={"content-type": "application/json", **headers})
        parts: list[dict] = []
        with urllib.request.urlopen(request, timeout=120) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:") or sid in self.cancelled:
                    continue
                chunk = json.loads(line[5:])
                chunk = chunk.get("response", chunk)
                meta = chunk.get("usageMetadata") or {}
                usage["input_tokens"] += meta.get("promptTokenCount", 0)
                usage["output_tokens"] += meta.get("candidatesTokenCount", 0)
                for part in chunk["candidates"][0]["content"]["parts"]:
                    parts.append(part)
                    if "text" in part:
                        self.update(sid, {"sessionUpdate": "agent_message_chunk",
                                          "content": {"type": "text", "text": part["text"]}})
        return parts


def mcp_post(server: dict, method: str, params: dict | None = None) -> dict:
    """One MCP message over Streamable HTTP (a notification when ``params`` is None)."""
    message: dict = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message.update(id=next(_mcp_ids), params=params)
    headers = {h["name"]: h["value"] for h in server.get("headers") or []}
    request = urllib.request.Request(server["url"], data=json.dumps(message).encode(),
                                     method="POST", headers={
                                         "content-type": "application/json",
                                         "accept": "application/json, text/event-stream",
                                         **headers})
    with urllib.request.urlopen(request, timeout=600) as response:
        body = response.read()
    return json.loads(body).get("result") or {} if body else {}


def mcp_tools(server: dict) -> list[dict]:
    if server.get("type") != "http":
        return []
    mcp_post(server, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "gemini-cli-mcp-client"}})
    mcp_post(server, "notifications/initialized")
    return mcp_post(server, "tools/list", {}).get("tools") or []


_mcp_ids = iter(range(1, 10**9))


def interactive_login() -> int:
    if not sys.stdin.isatty():
        print("Manual authorization is required but the current session is non-interactive.",
              file=sys.stderr)
        return 41
    base = os.environ.get("FAKE_GEMINI_OAUTH_URL", "https://accounts.google.com/o/oauth2/v2/auth")
    redirect = "https://codeassist.google.com/authcode"
    if "FAKE_GEMINI_OAUTH_URL" in os.environ:  # a fake IdP shows the code page itself
        redirect = base.split("/o/oauth2")[0] + "/authcode"
    state = uuid.uuid4().hex
    print("Please visit the following URL to authorize the application:\n\n"
          f"{base}?{urllib.parse.urlencode({'redirect_uri': redirect})}"
          f"&access_type=offline&code_challenge_method=S256&state={state}\n", flush=True)
    for _ in range(2):
        code = input("Enter the authorization code: ").strip()
        if not code:
            print("Authorization code is required.", flush=True)
        elif code.startswith("bad"):
            print("Failed to authenticate with authorization code: invalid_grant", flush=True)
        else:
            creds = Path(os.environ["HOME"]) / ".gemini" / "oauth_creds.json"
            creds.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"access_token": "ya29.fake", "refresh_token": f"1//{code}",
                           "token_type": "Bearer", "expiry_date": 4102444800000}, f)
            print("Logged in with Google.", flush=True)
            threading.Event().wait()  # the interactive screen: it does not exit
    print("Failed to authenticate with user code.", flush=True)
    return 41


def main() -> None:
    argv = sys.argv[1:]
    if "--acp" not in argv and "--version" not in argv:
        sys.exit(interactive_login())
    token = google_token() if "--acp" in argv else None
    if token is not None and (token == "revoked" or not proxy_reachable()):
        # 0.61.0 with a login Google refuses, or no way to Google: its login, on the ACP stream
        for _ in range(2):
            print("Please visit the following URL to authorize the application:", flush=True)
            sys.stdin.readline()
            print("Failed to authenticate with authorization code: invalid_grant", file=sys.stderr)
        sys.exit(41)
    if "--version" in argv or "-v" in argv:
        print(VERSION)
        return
    model = argv[argv.index("--model") + 1] if "--model" in argv else "gemini-2.5-pro"
    log({"argv": argv, "cwd": os.getcwd(),
         "env": {"GEMINI_SYSTEM_MD": os.environ.get("GEMINI_SYSTEM_MD")}})
    cli = Cli(model)
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        log({"stdin": msg})
        if isinstance(msg, dict):
            cli.handle(msg)


if __name__ == "__main__":
    main()
