"""What the Gemini CLI talks to, faked: the Gemini API
(``generativelanguage.googleapis.com``) and Google's Code Assist API, on real
HTTP, for tests of the Gemini CLI driver (tests/fakes/gemini_upstream.py is
the Gemini API as the dialect's clients use it).

It speaks the REST shapes the Gemini CLI (through ``@google/genai``) uses:
``POST /v1beta/models/{model}:streamGenerateContent?alt=sse`` (SSE frames,
each a ``GenerateContentResponse``), ``:generateContent`` (one JSON body) and
``:countTokens``; ``GET /v1beta/models``. Keys come in ``x-goog-api-key``;
a wrong one is a 400 ``API_KEY_INVALID`` in Google's error shape, as the real
API answers. A Google login's turns go to the Code Assist API instead
(``CODE_ASSIST_ENDPOINT``): ``POST /v1internal:streamGenerateContent?alt=sse``
with ``{model, project, request}`` and ``Authorization: Bearer``, each frame
``{"response": ...}``; ``oauth_token`` is the access token it takes (401 else). Run by uvicorn in a thread on ``127.0.0.1``::

    with GeminiCliUpstream(api_key="k") as fake:
        fake.url        # http://127.0.0.1:PORT (GOOGLE_GEMINI_BASE_URL)
        fake.requests   # [Received(path, headers, body), ...]

Scripted by the text of the last user turn, as :mod:`tests.fakes.upstreams`:
plain text: ``echo: <text>`` streamed word by word; ``[[tool:NAME {json}]]``:
a ``functionCall`` of NAME; a ``functionResponse`` as the last part:
``tool said: <its output>``; ``[[error:STATUS]]``: that status.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from typing import Any, NamedTuple

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ["GeminiCliUpstream", "Received"]

_TOOL = re.compile(r"\[\[tool:(\w+)(?:\s+(\{.*?\}))?\]\]")
_ERROR = re.compile(r"\[\[error:(\d+)\]\]")
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
           404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


class Received(NamedTuple):
    path: str
    headers: dict[str, str]
    body: Any


def google_error(status: int, message: str, reason: str | None = None) -> JSONResponse:
    error: dict[str, Any] = {"code": status, "message": message,
                             "status": _STATUS.get(status, "UNKNOWN")}
    if reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                             "reason": reason, "domain": "googleapis.com"}]
    return JSONResponse({"error": error}, status_code=status)


def _last_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    contents = body.get("contents") or []
    return list(contents[-1].get("parts") or []) if contents else []


def _tokens(obj: Any) -> int:
    return max(1, len(orjson.dumps(obj)) // 4)


def answer_parts(body: dict[str, Any]) -> tuple[list[dict[str, Any]], int | None]:
    """The parts of the model's answer to ``body``, and an error status if scripted."""
    parts = _last_parts(body)
    for part in parts:
        if "functionResponse" in part:
            output = part["functionResponse"].get("response") or {}
            text = output.get("output", output.get("error", output))
            text = text if isinstance(text, str) else json.dumps(text)
            return [{"text": w} for w in _words(f"tool said: {text}")], None
    texts = [p["text"] for p in parts if isinstance(p.get("text"), str)]
    text = texts[-1] if texts else ""  # the turn, not the context part the CLI puts before it
    if m := _ERROR.search(text):
        return [], int(m.group(1))
    calls = [{"functionCall": {"name": m.group(1), "args": json.loads(m.group(2) or "{}")}}
             for m in _TOOL.finditer(text)]
    if calls:
        return calls, None
    return [{"text": w} for w in _words("echo: " + " ".join(text.split()))], None


def _words(text: str) -> list[str]:
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]


def _chunk(parts: list[dict[str, Any]], usage: dict[str, int] | None, model: str,
           finish: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = "STOP"
    chunk: dict[str, Any] = {"candidates": [candidate], "modelVersion": model,
                             "responseId": f"resp-{int(time.time() * 1000)}"}
    if usage:
        chunk["usageMetadata"] = usage
    return chunk


class GeminiCliUpstream:
    def __init__(self, *, api_key: str | None = None, oauth_token: str | None = None) -> None:
        self.api_key = api_key
        self.oauth_token = oauth_token
        self.requests: list[Received] = []
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.app = Starlette(routes=[
            Route("/{version}/models", self._models, methods=["GET"]),
            Route("/{version}/models/{call:path}", self._call, methods=["POST", "GET"]),
            Route("/v1internal:{method}", self._code_assist, methods=["POST"]),
        ])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def generations(self) -> list[Received]:
        """The requests that asked the model for an answer (not countTokens)."""
        return [r for r in self.requests if "enerateContent" in r.path]

    def turns(self) -> list[dict[str, Any]]:
        """The model requests' bodies, Gemini API or Code Assist (unwrapped)."""
        return [r.body.get("request", r.body) if "v1internal" in r.path else r.body
                for r in self.generations()]

    def start(self) -> GeminiCliUpstream:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        # log_config=None: a dictConfig here would re-handle uvicorn's loggers for the
        # whole test process (later tests read what those loggers print)
        config = uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="off",
                                ws="none", log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> GeminiCliUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _authorised(self, request: Request) -> bool:
        key = request.headers.get("x-goog-api-key") or request.query_params.get("key")
        return self.api_key is None or key == self.api_key

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"models": [{"name": "models/gemini-2.5-pro"}]})

    async def _call(self, request: Request) -> Response:
        body = orjson.loads(await request.body() or b"null")
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        self.requests.append(Received(path, dict(request.headers), body))
        if not self._authorised(request):
            return google_error(400, "API key not valid. Please pass a valid API key.",
                                "API_KEY_INVALID")
        model, _, method = request.path_params["call"].partition(":")
        if method == "countTokens":
            return JSONResponse({"totalTokens": _tokens(body)})
        parts, status = answer_parts(body or {})
        if status is not None:
            return google_error(status, f"scripted error {status}")
        usage = {"promptTokenCount": _tokens(body), "candidatesTokenCount": len(parts),
                 "totalTokenCount": _tokens(body) + len(parts)}
        if method == "generateContent":
            return JSONResponse(_chunk(parts, usage, model, True))
        if method != "streamGenerateContent":
            return google_error(404, f"unknown method {method}")
        return StreamingResponse(self._frames(parts, usage, model),
                                 media_type="text/event-stream")

    async def _code_assist(self, request: Request) -> Response:
        body = orjson.loads(await request.body() or b"null") or {}
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        self.requests.append(Received(path, dict(request.headers), body))
        if request.headers.get("authorization") != f"Bearer {self.oauth_token}":
            return google_error(401, "Request had invalid authentication credentials.")
        method = request.path_params["method"]
        if method == "loadCodeAssist":
            return JSONResponse({"currentTier": {"id": "free-tier"},
                                 "cloudaicompanionProject": "fake-project"})
        inner = body.get("request") or {}
        parts, status = answer_parts(inner)
        if status is not None:
            return google_error(status, f"scripted error {status}")
        usage = {"promptTokenCount": _tokens(inner), "candidatesTokenCount": len(parts)}
        model = str(body.get("model"))
        if method == "generateContent":
            return JSONResponse({"response": _chunk(parts, usage, model, True)})
        return StreamingResponse(self._frames(parts, usage, model, wrap=True),
                                 media_type="text/event-stream")

    async def _frames(self, parts: list[dict[str, Any]], usage: dict[str, int], model: str,
                      wrap: bool = False):
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            chunk = _chunk([part], usage if last else None, model, last)
            yield b"data: " + orjson.dumps({"response": chunk} if wrap else chunk) + b"\r\n\r\n"
            await asyncio.sleep(0)
