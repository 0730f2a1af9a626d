"""A fake OpenAI Responses upstream: other people's ``POST /v1/responses``.

:class:`ResponsesUpstream` is a :class:`~tests.fakes.upstreams.FakeUpstream`
(same lifecycle, ``url``, ``requests``, ``/v1/models``, chat and messages
routes) that also serves ``POST /v1/responses``, streamed as Codex CLI and
the OpenAI SDK read it: ``event:`` + ``data:`` frames, each event with its
``type`` and a ``sequence_number``, ending in ``response.completed``.

What it answers is scripted by the last ``input`` item that is a user
message or a tool output, in the language of :mod:`tests.fakes.upstreams`:

* plain text: ``echo: <text>`` (whitespace normalised), a word per delta;
* ``[[tool:NAME {json}]]``: a ``function_call`` to NAME with those arguments
  (a ``custom_tool_call`` whose ``input`` is ``json["input"]`` when the
  request declares NAME as a ``custom`` tool); several markers: several calls;
* a ``function_call_output``/``custom_tool_call_output`` as the last item:
  ``tool said: <output>``;
* ``[[think]]``: a reasoning item (summary + ``encrypted_content``) first;
* ``[[error:STATUS]]``, ``[[sleep:S]]``, ``[[die-after:N]]``,
  ``[[hang-after:N]]``, ``[[truncate-after:N]]``: as for the other dialects.

``max_output_tokens`` is a word limit (status ``incomplete``).

``fake.quota[key] = FakeQuota(...)``: that key's answers carry the ChatGPT
backend's ``x-codex-primary-*`` / ``x-codex-secondary-*`` headers, and a spent
window is the backend's 429 ``usage_limit_reached``; ``GET
/backend-api/wham/usage`` answers a ChatGPT login's quota (Codex's
``account/rateLimits/read``; point ``chatgpt_base_url`` at ``fake.chatgpt_url``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .scripted import Plan, Script, make_plan, parse_script, reasoning_for
from .upstreams import FakeUpstream, Received, _Frames, error_response

__all__ = ["ResponsesUpstream", "ENCRYPTED_REASONING", "script_responses", "responses_frames",
           "responses_body"]

ENCRYPTED_REASONING = "ZmFrZS1lbmNyeXB0ZWQtcmVhc29uaW5n"  # opaque to clients
_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):  # content parts
        return "".join(p.get("text", "") for p in output if isinstance(p, dict))
    return "" if output is None else str(output)


def script_responses(body: dict[str, Any]) -> Script:
    """The script held by the last user message or tool output in ``input``."""
    script = Script()
    items = body.get("input")
    if isinstance(items, str):
        script.text = parse_script(items, script)
        return script
    for item in reversed(items or []):
        if not isinstance(item, dict):
            continue
        if item.get("type") in _TOOL_OUTPUTS:
            script.tool_result = _output_text(item.get("output")).strip()
            return script
        if item.get("role") == "user" and item.get("type", "message") == "message":
            content = item.get("content")
            texts = [content] if isinstance(content, str) else [
                p.get("text", "") for p in content or ()
                if isinstance(p, dict) and p.get("type") in ("input_text", "text")]
            cleaned = [parse_script(t, script) for t in texts]
            script.text = next((c for c in reversed(cleaned) if c), "")
            return script
    return script


def _custom_tools(body: dict[str, Any]) -> set[str]:
    return {t.get("name") for t in body.get("tools") or () if t.get("type") == "custom"}


def _output_items(script: Script, body: dict[str, Any]) -> tuple[list[dict[str, Any]], Plan]:
    """The finished output items (ids are stable per answer) and the plan."""
    shim = {"max_tokens": body.get("max_output_tokens"), "messages": body.get("input"),
            "tools": body.get("tools"), "system": body.get("instructions")}
    plan = make_plan(script, shim, id_prefix="call_")
    custom = _custom_tools(body)
    seed = hashlib.sha256(orjson.dumps(body.get("input"))).hexdigest()[:20]
    items: list[dict[str, Any]] = []
    if script.think:
        items.append({"id": f"rs_{seed}", "type": "reasoning",
                      "summary": [{"type": "summary_text", "text": reasoning_for(script.text)}],
                      "encrypted_content": ENCRYPTED_REASONING})
    if plan.text:
        items.append({"id": f"msg_{seed}", "type": "message", "status": "completed",
                      "role": "assistant", "content": [
                          {"type": "output_text", "text": "".join(plan.text), "annotations": [],
                           "logprobs": []}]})
    for n, (call_id, name, args) in enumerate(plan.calls):
        if name in custom:
            value = script.calls[n][1]
            text = value.get("input", "") if isinstance(value, dict) else str(value)
            items.append({"id": f"ctc_{seed}{n}", "type": "custom_tool_call",
                          "status": "completed", "call_id": call_id, "name": name,
                          "input": text})
        else:
            items.append({"id": f"fc_{seed}{n}", "type": "function_call", "status": "completed",
                          "call_id": call_id, "name": name, "arguments": args})
    return items, plan


def _response(rid: str, body: dict[str, Any], status: str, output: list[dict[str, Any]],
              plan: Plan | None = None) -> dict[str, Any]:
    usage = None
    if plan is not None:
        cached = plan.input_tokens // 2 if body.get("prompt_cache_key") else 0
        usage = {"input_tokens": plan.input_tokens,
                 "input_tokens_details": {"cached_tokens": cached},
                 "output_tokens": plan.output_tokens,
                 "output_tokens_details": {"reasoning_tokens": len(plan.reasoning)},
                 "total_tokens": plan.input_tokens + plan.output_tokens}
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status,
            "error": None, "incomplete_details": incomplete, "model": body.get("model"),
            "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "store": body.get("store", True), "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "usage": usage}


def _status(plan: Plan) -> str:
    return "incomplete" if plan.finish == "length" else "completed"


def responses_body(script: Script, body: dict[str, Any], rid: str) -> dict[str, Any]:
    items, plan = _output_items(script, body)
    return _response(rid, body, _status(plan), items, plan)


def _in_progress(item: dict[str, Any]) -> dict[str, Any]:
    kind = item["type"]
    if kind == "message":
        return {**item, "status": "in_progress", "content": []}
    if kind == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    if kind == "custom_tool_call":
        return {**item, "status": "in_progress", "input": ""}
    return {**item, "summary": []}


def responses_frames(script: Script, body: dict[str, Any], rid: str) -> list[bytes]:
    """The SSE frames of a streamed answer, ``event:`` lines included."""
    items, plan = _output_items(script, body)
    frames: list[bytes] = []

    def emit(kind: str, **data: Any) -> None:
        payload = {"type": kind, "sequence_number": len(frames), **data}
        frames.append(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n")

    emit("response.created", response=_response(rid, body, "in_progress", []))
    emit("response.in_progress", response=_response(rid, body, "in_progress", []))
    for index, item in enumerate(items):
        at = {"item_id": item["id"], "output_index": index}
        emit("response.output_item.added", output_index=index, item=_in_progress(item))
        if item["type"] == "message":
            part = item["content"][0]
            emit("response.content_part.added", **at, content_index=0,
                 part={**part, "text": ""})
            for word in plan.text:
                emit("response.output_text.delta", **at, content_index=0, delta=word, logprobs=[])
            emit("response.output_text.done", **at, content_index=0, text=part["text"],
                 logprobs=[])
            emit("response.content_part.done", **at, content_index=0, part=part)
        elif item["type"] == "function_call":
            args = item["arguments"]
            half = len(args) // 2
            for piece in (args[:half], args[half:]):
                emit("response.function_call_arguments.delta", **at, delta=piece)
            emit("response.function_call_arguments.done", **at, arguments=args)
        elif item["type"] == "custom_tool_call":
            emit("response.custom_tool_call_input.delta", **at, delta=item["input"])
            emit("response.custom_tool_call_input.done", **at, input=item["input"])
        else:  # reasoning
            summary = item["summary"][0]
            emit("response.reasoning_summary_part.added", **at, summary_index=0,
                 part={"type": "summary_text", "text": ""})
            emit("response.reasoning_summary_text.delta", **at, summary_index=0,
                 delta=summary["text"])
            emit("response.reasoning_summary_text.done", **at, summary_index=0,
                 text=summary["text"])
            emit("response.reasoning_summary_part.done", **at, summary_index=0, part=summary)
        emit("response.output_item.done", output_index=index, item=item)
    status = _status(plan)
    emit(f"response.{status}", response=_response(rid, body, status, items, plan))
    return frames


class ResponsesUpstream(FakeUpstream):
    """A :class:`FakeUpstream` that also serves ``POST /v1/responses``."""

    def __init__(self, *, api_key: str | None = None,
                 models: tuple[str, ...] = ("fake-model",)) -> None:
        super().__init__(api_key=api_key, models=models)
        self.app.router.routes.append(Route("/v1/responses", self._responses, methods=["POST"]))
        self.app.router.routes.append(Route("/backend-api/wham/usage", self._wham_usage,
                                            methods=["GET"]))

    @property
    def chatgpt_url(self) -> str:
        """Codex's ``chatgpt_base_url`` pointed here."""
        return f"http://127.0.0.1:{self.port}/backend-api/"

    async def _wham_usage(self, request: Request) -> Response:
        self.requests.append(Received(request.url.path, dict(request.headers), None))
        quota = self.quota_of(request)
        if quota is None:
            return error_response(401, "openai", "Unknown account")
        return JSONResponse(quota.wham_usage())

    @property
    def responses(self) -> list[Received]:
        """The ``/v1/responses`` requests, oldest first."""
        return [r for r in self.requests if r.path == "/v1/responses"]

    async def _responses(self, request: Request) -> Response:
        body = await self._receive(request)
        if not self._authorised(request, "openai"):
            return error_response(401, "openai", "Incorrect API key provided")
        if body.get("input") in (None, [], ""):
            return error_response(400, "openai", "'input' is a required property")
        script = script_responses(body)
        if script.sleep:
            deadline = time.monotonic() + script.sleep
            while time.monotonic() < deadline:
                if await request.is_disconnected():
                    self.disconnects += 1
                    return Response(status_code=499)
                await asyncio.sleep(0.01)
        if script.error is not None:
            return error_response(script.error, "openai")
        quota = self.quota_of(request)
        headers = quota.codex_headers() if quota is not None else {}
        if quota is not None and quota.spent:
            return JSONResponse({"error": {"type": "usage_limit_reached", "message":
                                           "The usage limit has been reached",
                                           "resets_at": int(quota.reset_at())}},
                                status_code=429, headers=headers)
        rid = f"resp_fake{next(self._ids)}"
        if body.get("stream"):
            return _Frames(self, responses_frames(script, body, rid), script, headers=headers)
        return JSONResponse(responses_body(script, body, rid), headers=headers)

