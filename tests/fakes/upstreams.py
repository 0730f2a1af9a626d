"""Fake OpenAI- and Anthropic-compatible upstreams: other people's servers,
on real HTTP, for tests.

One Starlette app serves both dialects (``/v1/chat/completions``,
``/v1/messages``, ``/v1/messages/count_tokens``, ``/v1/models``), run by
uvicorn in a background thread on ``127.0.0.1`` with an ephemeral port::

    with FakeUpstream() as fake:
        fake.url            # http://127.0.0.1:PORT/v1   (OpenAI base URL)
        fake.anthropic_url  # http://127.0.0.1:PORT      (Anthropic root)
        fake.requests       # [Received(path, headers, body), ...]
        fake.peers          # the client (host, port) of each request
        fake.disconnects    # clients that went away while the fake held a stream
        fake.check_thinking = True  # 400s for thinking the real API refuses
        fake.limit("sk-b", 30)      # that key's account is at its limit for 30 s

``FakeUpstream(api_keys=("sk-a", "sk-b"))`` takes either key, as one vendor
serving two accounts: each key's thinking signatures are its own
(:func:`signature_for` with the key), and with ``check_thinking`` a block
signed for another key is refused as the real API does ("Invalid
`signature` in `thinking` block"). A limited key gets 429
``rate_limit_error`` with ``retry-after`` and
``anthropic-ratelimit-unified-reset`` until its reset.

What it answers is scripted by the text of the last user message:

* plain text: ``echo: <text>`` (whitespace normalised), streamed word by
  word; ``max_tokens`` is a word limit (finish ``length``) and ``stop``
  sequences cut the answer (finish ``stop_sequence``; OpenAI ``stop`` with a
  vLLM-style ``stop_reason``);
* ``[[tool:NAME {json}]]`` (the JSON is optional): a call to NAME;
  ``[[tools:A {..} B {..}]]`` or several markers: parallel calls;
* a tool result as the last message: ``tool said: <result text>``;
* ``[[think]]``: reasoning before the answer (Anthropic: a thinking block with
  the signature :func:`signature_for` gives; OpenAI: ``reasoning_content``);
* ``[[error:STATUS]]``: that status with the dialect's error envelope (429 and
  529 carry ``retry-after: 3``; a 400 from the OpenAI side names ``param``);
* ``[[sleep:SECONDS]]``: wait before answering;
* ``[[die-after:N]]``: stream N frames, then drop the connection;
* ``[[truncate-after:N]]``: stream N frames, then end the body cleanly but
  without the terminal event;
* ``[[hang-after:N]]``: stream N frames, then hang until the client leaves
  (counted in ``disconnects``);
* ``[[fail-after:N]]``: stream N frames, then the dialect's in-stream error
  frame (an overload whose message quotes the upstream key) and the end;
* ``[[no-stream]]``: a stream request answered with the JSON body, as some
  servers do.

``fake.quota[credential] = FakeQuota(five_hour=97, seven_day=40)``
(tests/fakes/vendor_quota.py): the answers for that bearer token or API key
carry the subscription's ``anthropic-ratelimit-unified-*`` headers (the
Responses route: ``x-codex-*``), and a spent window is the vendor's 429.

``fake.answers`` holds the bytes of each answer's body as sent (for a stream,
its frames joined).

Usage is realistic: input tokens are a rough count of the request (a quarter
of its JSON length); Anthropic reports cache reads/writes when the body holds
``cache_control``, OpenAI reports cached tokens when it holds
``prompt_cache_key``.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from typing import Any, NamedTuple

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .vendor_quota import FakeQuota
from .scripted import (
    Script, anthropic_body, anthropic_frames, make_plan, openai_body, openai_frames,
    reasoning_for, rough_tokens, script_anthropic, script_openai, signature_for,
)

__all__ = ["FakeUpstream", "Received", "signature_for", "reasoning_for", "rough_tokens"]

RETRY_AFTER = "3"


class Received(NamedTuple):
    path: str
    headers: dict[str, str]
    body: Any


# --- errors ----------------------------------------------------------------------

_OPENAI_ERROR = {400: "invalid_request_error", 401: "invalid_request_error",
                 403: "permission_error", 404: "invalid_request_error",
                 429: "rate_limit_error"}
_ANTHROPIC_ERROR = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def error_response(status: int, dialect: str, message: str | None = None) -> JSONResponse:
    message = message or f"fake upstream says {status}"
    headers = {"retry-after": RETRY_AFTER} if status in (429, 503, 529) else {}
    if dialect == "anthropic":
        body: dict[str, Any] = {"type": "error", "error": {
            "type": _ANTHROPIC_ERROR.get(status, "api_error"), "message": message}}
    else:
        body = {"error": {"message": message,
                          "type": _OPENAI_ERROR.get(status, "server_error"),
                          "param": "messages" if status == 400 else None,
                          "code": "invalid_api_key" if status == 401 else None}}
    return JSONResponse(body, status_code=status, headers=headers)


def _masked(key: str) -> str:
    """A key partly masked, as vendors quote the key they refused."""
    return key[:7] + "*" * 12 + key[-4:] if len(key) > 11 else "****"


def _wrong_key_message(request: Request) -> str:
    presented = (request.headers.get("authorization") or "").removeprefix("Bearer ")
    return (f"Incorrect API key provided: {_masked(presented)}. You can find your API key "
            "at https://platform.openai.com/account/api-keys.")


def _error_frame(dialect: str, key: str | None) -> bytes:
    message = f"overloaded right now (key {key or 'none'})"
    if dialect == "anthropic":
        return b"event: error\ndata: " + orjson.dumps(
            {"type": "error", "error": {"type": "overloaded_error", "message": message}}) + b"\n\n"
    return b"data: " + orjson.dumps({"error": {"message": message, "type": "rate_limit_error",
                                               "code": 429}}) + b"\n\n"


# --- HTTP ------------------------------------------------------------------------

class _Frames(Response):
    """SSE frames sent one ASGI message each, with the scripted failures."""

    def __init__(self, fake: FakeUpstream, frames: list[bytes], script: Script,
                 dialect: str = "openai", headers: dict[str, str] | None = None) -> None:
        self.fake, self.frames, self.script, self.dialect = fake, frames, script, dialect
        self.extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        self.background = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        s = self.script
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-cache"), *self.extra]})
        sent: list[bytes] = []
        self.fake.answers.append(b"")
        slot = len(self.fake.answers) - 1
        for n, frame in enumerate(self.frames):
            if s.fail_after is not None and n >= s.fail_after:
                frame = _error_frame(self.dialect, self.fake.api_key)
                sent.append(frame)
                self.fake.answers[slot] = b"".join(sent)
                await send({"type": "http.response.body", "body": frame, "more_body": True})
                break
            if s.hang_after is not None and n >= s.hang_after:
                while (await receive())["type"] != "http.disconnect":
                    pass
                self.fake.disconnects += 1
                return
            if s.die_after is not None and n >= s.die_after:
                raise ConnectionAbortedError("fake upstream drops the connection")
            if s.truncate_after is not None and n >= s.truncate_after:
                break
            sent.append(frame)
            self.fake.answers[slot] = b"".join(sent)
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _thinking_refused(body: dict[str, Any], key: str | None = None) -> str | None:
    """What the real API says of the thinking in ``body``, or ``None`` when
    it takes it: a thinking block whose signature is not the one this fake
    gave its text for ``key`` (:func:`signature_for`) is refused; with thinking on, so is
    ``top_k``, a ``temperature`` but 1 or a ``top_p`` under 0.95, and a last
    assistant message that uses a tool without starting with thinking."""
    messages = body["messages"]
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "thinking" and (
                    block.get("signature") != signature_for(str(block.get("thinking")), key)):
                return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    if "top_k" in body or body.get("temperature", 1) != 1 or body.get("top_p", 1) < 0.95:
        return ("thinking is not compatible with top_k or temperature modifications; "
                "top_p must be between 0.95 and 1")
    last = next((i for i in range(len(messages) - 1, -1, -1)
                 if isinstance(messages[i], dict) and messages[i].get("role") == "assistant"),
                None)
    content = messages[last].get("content") if last is not None else None
    if isinstance(content, list) and content and any(
            isinstance(b, dict) and b.get("type") == "tool_use" for b in content):
        first = content[0].get("type") if isinstance(content[0], dict) else None
        if first not in ("thinking", "redacted_thinking"):
            return (f"messages.{last}.content.0.type: Expected `thinking` or "
                    f"`redacted_thinking`, but found `{first}`. When `thinking` is enabled, a "
                    "final `assistant` message must start with a thinking block.")
    return None


class FakeUpstream:
    """See the module docstring. ``api_key``: when set, requests must carry it
    (OpenAI ``Authorization: Bearer``; Anthropic ``x-api-key`` or Bearer)."""

    def __init__(self, *, api_key: str | None = None, api_keys: tuple[str, ...] = (),
                 models: tuple[str, ...] = ("fake-model",)) -> None:
        self.api_key = api_key or (api_keys[0] if api_keys else None)
        # several accounts: each key signs its own thinking (signature_for(text, key))
        self.api_keys = api_keys
        self.limited: dict[str, float] = {}  # key -> Unix time its rate limit resets
        self.models = models
        self.requests: list[Received] = []
        self.peers: list[tuple[str, int] | None] = []  # client address of each request
        self.disconnects = 0
        self.answers: list[bytes] = []  # each answer's body bytes as sent
        self.models_delay = 0.0  # seconds /v1/models (the health probe) takes to answer
        self.always_stream = False  # answer with SSE even when the request did not ask
        # refuse thinking as the real API does (_thinking_refused); off by default:
        # recorded fixtures carry other servers' signatures
        self.check_thinking = False
        # per credential (bearer token or API key): the subscription's quota headers
        self.quota: dict[str, FakeQuota] = {}
        self.port = 0
        self._ids = itertools.count(1)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def last(self) -> Received:
        """The last POST received: a gateway's health probes (``GET
        /v1/models``) may land at any time and are not what a test asks about."""
        for received in reversed(self.requests):
            if received.body is not None:
                return received
        return self.requests[-1]

    # --- lifecycle ---

    def start(self) -> FakeUpstream:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="off",
                                ws="none", timeout_graceful_shutdown=1, log_level="critical")
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name=f"fake-upstream-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("fake upstream did not start")
            time.sleep(0.005)
        self._socket = sock
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if getattr(self, "_socket", None) is not None:
            self._socket.close()
        self._server = self._thread = None

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def limit(self, key: str, seconds: float) -> None:
        """Put ``key``'s account at its rate limit for ``seconds`` (0: lift it)."""
        if seconds > 0:
            self.limited[key] = time.time() + seconds
        else:
            self.limited.pop(key, None)

    def _key(self, request: Request) -> str | None:
        return request.headers.get("x-api-key") or (
            request.headers.get("authorization") or "").removeprefix("Bearer ") or None

    def _sign(self, key: str | None) -> Any:
        """How thinking is signed for a request with ``key``."""
        if not self.api_keys:
            return signature_for
        return lambda text: signature_for(text, key)

    async def wait_disconnects(self, count: int, timeout: float = 5.0) -> bool:
        """True once ``disconnects`` reached ``count`` (polled: the server runs
        in another thread)."""
        deadline = time.monotonic() + timeout
        while self.disconnects < count:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    # --- routes ---

    async def _receive(self, request: Request) -> Any:
        body = await request.json()
        self.requests.append(Received(request.url.path, dict(request.headers), body))
        self.peers.append(tuple(request.client) if request.client else None)
        return body

    def _authorised(self, request: Request, dialect: str) -> bool:
        if self.api_key is None:
            return True
        if self.api_keys:
            return self._key(request) in self.api_keys
        if request.headers.get("authorization") == f"Bearer {self.api_key}":
            return True
        return dialect == "anthropic" and request.headers.get("x-api-key") == self.api_key

    def quota_of(self, request: Request) -> FakeQuota | None:
        """The quota of the credential ``request`` carries, if the test set one."""
        bearer = (request.headers.get("authorization") or "").removeprefix("Bearer ")
        return self.quota.get(bearer) or self.quota.get(request.headers.get("x-api-key") or "")

    async def _chat(self, request: Request) -> Response:
        body = await self._receive(request)
        if not self._authorised(request, "openai"):
            return error_response(401, "openai", _wrong_key_message(request))
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return error_response(400, "openai", "'messages' is a required property")
        script = script_openai(body)
        return await self._answer(script, body, "openai", request)

    async def _messages(self, request: Request) -> Response:
        body = await self._receive(request)
        if not self._authorised(request, "anthropic"):
            return error_response(401, "anthropic", "invalid x-api-key " + _masked(
                request.headers.get("x-api-key") or ""))
        if not request.headers.get("anthropic-version"):
            return error_response(400, "anthropic", "anthropic-version: header is required")
        if not isinstance(body.get("max_tokens"), int):
            return error_response(400, "anthropic", "max_tokens: Field required")
        if not isinstance(body.get("messages"), list):
            return error_response(400, "anthropic", "messages: Field required")
        key = self._key(request)
        reset = self.limited.get(key or "")
        if reset is not None and reset > time.time():
            response = error_response(429, "anthropic", "This request would exceed your "
                                      "account's rate limit. Please try again later.")
            response.headers["retry-after"] = str(max(1, round(reset - time.time())))
            response.headers["anthropic-ratelimit-unified-status"] = "rejected"
            response.headers["anthropic-ratelimit-unified-reset"] = str(int(reset))
            return response
        refused = (_thinking_refused(body, key if self.api_keys else None)
                   if self.check_thinking else None)
        if refused is not None:
            return error_response(400, "anthropic", refused)
        quota = self.quota_of(request)
        headers = quota.anthropic_headers() if quota is not None else {}
        if quota is not None and quota.spent:  # the subscription's limit: the real 429
            return JSONResponse({"type": "error", "error": {
                "type": "rate_limit_error", "message": "Number of request tokens has exceeded "
                "your rate limit"}}, status_code=429, headers=headers)
        return await self._answer(script_anthropic(body), body, "anthropic", request, headers,
                                  key)

    async def _answer(self, script: Script, body: dict[str, Any], dialect: str,
                      request: Request, headers: dict[str, str] | None = None,
                      key: str | None = None) -> Response:
        if script.sleep:
            # sleep, but notice a client that leaves meanwhile (counted in disconnects)
            deadline = time.monotonic() + script.sleep
            while time.monotonic() < deadline:
                if await request.is_disconnected():
                    self.disconnects += 1
                    return Response(status_code=499)
                await asyncio.sleep(0.01)
        if script.error is not None:
            return error_response(script.error, dialect)
        n = next(self._ids)
        if dialect == "openai":
            plan = make_plan(script, body, id_prefix="call_")
            rid = f"chatcmpl-fake{n}"
            if (body.get("stream") and not script.no_stream) or self.always_stream:
                return _Frames(self, openai_frames(plan, body, rid), script, dialect)
            return self._body(openai_body(plan, body, rid))
        plan = make_plan(script, body, id_prefix="toolu_")
        rid = f"msg_fake{n}"
        if (body.get("stream") and not script.no_stream) or self.always_stream:
            return _Frames(self, anthropic_frames(plan, body, rid, self._sign(key)), script,
                           dialect, headers)
        return self._body(anthropic_body(plan, body, rid, self._sign(key)), headers)

    def _body(self, content: Any, headers: dict[str, str] | None = None) -> Response:
        response = JSONResponse(content, headers=headers)
        self.answers.append(bytes(response.body))
        return response

    async def _count_tokens(self, request: Request) -> Response:
        body = await self._receive(request)
        if not self._authorised(request, "anthropic"):
            return error_response(401, "anthropic", "invalid x-api-key")
        size = {k: body.get(k) for k in ("system", "messages", "tools")}
        return JSONResponse({"input_tokens": rough_tokens(size)})

    async def _models(self, request: Request) -> Response:
        self.requests.append(Received(request.url.path, dict(request.headers), None))
        self.peers.append(tuple(request.client) if request.client else None)
        if self.models_delay:
            await asyncio.sleep(self.models_delay)
        if not self._authorised(request, "anthropic"):
            return error_response(401, "openai", "Incorrect API key provided")
        # one listing both SDKs accept: OpenAI's and Anthropic's fields together
        data = [{"id": m, "object": "model", "created": 1700000000, "owned_by": "fake",
                 "type": "model", "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                for m in self.models]
        return JSONResponse({"object": "list", "data": data, "has_more": False,
                             "first_id": self.models[0] if self.models else None,
                             "last_id": self.models[-1] if self.models else None})
