"""A fake Gemini API upstream (``/v1beta/models/{model}:generateContent``,
``:streamGenerateContent?alt=sse``, ``GET /v1beta/models``) speaking the script
language of :mod:`tests.fakes.scripted` from the last user content: text is
echoed (``echo: ...``), ``[[tool:NAME {json}]]`` asks for function calls
(without ids, as Gemini often sends them), a ``functionResponse`` is answered
``tool said: <output>``, ``[[think]]`` adds a thought part whose signature is
:func:`gemini_signature` (on the first answer part, as Gemini 3 puts it).
``[[sleep:S]]`` pauses S seconds after the first chunk; ``[[fail-after:N]]`` streams N chunks, then Google's in-stream error frame (an
overload quoting the key). ``answers`` holds each answer's bytes as sent.
Requests need ``x-goog-api-key`` when ``api_key`` is set."""

from __future__ import annotations

import base64
import time
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.scripted import Script, parse_script, reasoning_for
from tests.support.server import ServerThread

__all__ = ["FakeGemini", "gemini_signature"]


def gemini_signature(text: str) -> str:
    """An opaque signature: base64 (the SDK decodes it to bytes), in the
    standard alphabet with ``+`` in it (the SDK sends it back in base64url)."""
    return base64.b64encode(b"\xfb\xef\xbe" + text.encode()).decode()


def _script(body: dict[str, Any]) -> Script:
    script = Script()
    contents = body.get("contents") or body.get("contents") or []
    last = next((c for c in reversed(contents) if c.get("role", "user") == "user"), {})
    for part in last.get("parts") or ():
        response = part.get("functionResponse") or part.get("function_response")
        if response is not None:
            payload = response.get("response") or {}
            script.tool_result = str(payload.get("output", payload.get("error", payload)))
            return script
    texts = [parse_script(p["text"], script) for p in last.get("parts") or () if "text" in p]
    script.text = next((t for t in reversed(texts) if t), "")
    return script


def _answer(script: Script, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    parts: list[dict[str, Any]] = []
    if script.think:
        thought = reasoning_for(script.text)
        parts.append({"text": thought, "thought": True,
                      "thoughtSignature": gemini_signature(thought)})
    if script.tool_result is not None:
        parts.append({"text": f"tool said: {script.tool_result}"})
    elif script.calls:
        parts += [{"functionCall": {"name": name, "args": args}} for name, args in script.calls]
    else:
        words = f"echo: {script.text}".split(" ")
        limit = (body.get("generationConfig") or {}).get("maxOutputTokens")
        if isinstance(limit, int) and len(words) > limit:
            return parts + [{"text": " ".join(words[:limit])}], "MAX_TOKENS"
        parts += [{"text": w + (" " if i < len(words) - 1 else "")} for i, w in enumerate(words)]
    return parts, "STOP"


def _usage(body: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, int]:
    prompt = max(1, len(orjson.dumps(body.get("contents"))) // 4)
    out = len(parts)
    return {"promptTokenCount": prompt, "candidatesTokenCount": out,
            "totalTokenCount": prompt + out}


class FakeGemini:
    def __init__(self, *, api_key: str | None = None, models: tuple[str, ...] = ()) -> None:
        self.api_key = api_key
        self.models = models
        self.requests: list[tuple[str, dict[str, Any]]] = []  # (path, body)
        self.answers: list[bytes] = []  # each answer's body as sent (a stream's frames joined)
        self.app = Starlette(routes=[
            Route("/v1beta/models", self._models, methods=["GET"]),
            Route("/v1beta/models/{rest:path}", self._generate, methods=["POST"]),
        ])
        self._server: ServerThread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return self._server.url

    @property
    def last(self) -> dict[str, Any]:
        return self.requests[-1][1]

    def __enter__(self) -> FakeGemini:
        self._server = ServerThread(self.app).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.__exit__(*exc)

    def _refused(self, request: Request) -> Response | None:
        if self.api_key is None or request.headers.get("x-goog-api-key") == self.api_key:
            return None
        return JSONResponse({"error": {"code": 400, "message": "API key not valid.",
                                       "status": "INVALID_ARGUMENT"}}, status_code=400)

    async def _models(self, request: Request) -> Response:
        return self._refused(request) or JSONResponse(
            {"models": [{"name": f"models/{m}"} for m in self.models]})

    async def _generate(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        body = orjson.loads(await request.body())
        model, _, method = request.path_params["rest"].rpartition(":")
        self.requests.append((request.url.path, body))
        if method == "countTokens":
            counted = body.get("generateContentRequest", body)
            return JSONResponse({"totalTokens": _usage(counted, [])["promptTokenCount"]})
        script = _script(body)
        parts, finish = _answer(script, body)
        usage = _usage(body, parts)
        meta = {"modelVersion": model, "responseId": f"resp-{len(self.requests)}"}
        if method == "generateContent":
            raw = orjson.dumps({"candidates": [{"content": {"role": "model", "parts": parts},
                                                "finishReason": finish, "index": 0}],
                                "usageMetadata": usage, **meta})
            self.answers.append(raw)
            return Response(raw, media_type="application/json")
        if method != "streamGenerateContent" or request.query_params.get("alt") != "sse":
            return JSONResponse({"error": {"code": 404, "message": "not here",
                                           "status": "NOT_FOUND"}}, status_code=404)

        answer = len(self.answers)
        self.answers.append(b"")

        def chunks() -> Any:
            for k, part in enumerate(parts):
                if k == 1 and script.sleep:  # a pause mid-stream (a sync generator: a thread)
                    time.sleep(script.sleep)
                if k == script.fail_after:  # Google's in-stream error, quoting the key
                    frame = b"data: " + orjson.dumps({"error": {
                        "code": 503, "status": "UNAVAILABLE",
                        "message": f"overloaded (key {self.api_key})"}}) + b"\r\n\r\n"
                    self.answers[answer] += frame
                    yield frame
                    return
                candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part]},
                                             "index": 0}
                last = k == len(parts) - 1
                if last:
                    candidate["finishReason"] = finish
                chunk: dict[str, Any] = {"candidates": [candidate], **meta}
                if last:
                    chunk["usageMetadata"] = usage
                frame = b"data: " + orjson.dumps(chunk) + b"\r\n\r\n"
                self.answers[answer] += frame
                yield frame

        return StreamingResponse(chunks(), media_type="text/event-stream")
