"""What the fake upstreams answer: the script language read from the last
user message (see :mod:`tests.fakes.upstreams`) and the answer rendered in
either dialect, as SSE frames or as one JSON body."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

__all__ = ["Script", "Plan", "script_openai", "script_anthropic", "make_plan", "openai_frames",
           "openai_body", "anthropic_frames", "anthropic_body", "signature_for", "reasoning_for",
           "rough_tokens"]


def signature_for(reasoning: str, key: str | None = None) -> str:
    """The (deterministic, opaque-looking) signature of a thinking block; with
    ``key``, valid only for that API key (as the real API's are per account)."""
    digest = hashlib.sha256(reasoning.encode() + (b"\x00" + key.encode() if key else b"")).digest()
    return base64.b64encode(b"\x12\x8a" + digest * 3).decode()


def reasoning_for(text: str) -> str:
    return f"Thinking about: {text}"


def rough_tokens(obj: Any) -> int:
    return max(1, len(orjson.dumps(obj)) // 4)


# --- the script ------------------------------------------------------------------

_MARK = re.compile(r"(tools|tool|think|error|sleep|die-after|hang-after|truncate-after|fail-after"
                   r"|no-stream)(:|\]\])")
_NAME = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*")
_JSON = json.JSONDecoder()


@dataclass
class Script:
    text: str = ""
    tool_result: str | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)
    think: bool = False
    error: int | None = None
    sleep: float = 0.0
    die_after: int | None = None
    hang_after: int | None = None
    truncate_after: int | None = None
    fail_after: int | None = None
    no_stream: bool = False


def parse_script(text: str, script: Script) -> str:
    """Apply the markers in ``text`` to ``script``; return the text without them."""
    kept: list[str] = []
    i = 0
    while (j := text.find("[[", i)) >= 0:
        kept.append(text[i:j])
        m = _MARK.match(text, j + 2)
        if m is None:
            kept.append("[[")
            i = j + 2
            continue
        name, k = m.group(1), m.end()
        if m.group(2) == "]]":
            if name == "think":
                script.think = True
            elif name == "no-stream":
                script.no_stream = True
            i = k
            continue
        if name in ("tool", "tools"):
            while (nm := _NAME.match(text, k)) and not text.startswith("]]", k):
                k = nm.end()
                args: Any = {}
                if k < len(text) and text[k] in "{[":
                    args, k = _JSON.raw_decode(text, k)
                script.calls.append((nm.group(1), args))
                while k < len(text) and text[k] in " \t\n,;":
                    k += 1
            i = text.find("]]", k) + 2 if "]]" in text[k:] else len(text)
            continue
        end = text.find("]]", k)
        end = len(text) if end < 0 else end
        arg, i = text[k:end].strip(), end + 2
        if name == "error":
            script.error = int(arg)
        elif name == "sleep":
            script.sleep = float(arg)
        elif name == "die-after":
            script.die_after = int(arg)
        elif name == "hang-after":
            script.hang_after = int(arg)
        elif name == "truncate-after":
            script.truncate_after = int(arg)
        elif name == "fail-after":
            script.fail_after = int(arg)
    kept.append(text[i:])
    return " ".join("".join(kept).split())


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [b.get("text", "") for b in content
                if isinstance(b, dict) and b.get("type") in ("text", "input_text")]
    return []


def script_openai(body: dict[str, Any]) -> Script:
    script = Script()
    for msg in reversed(body.get("messages") or []):
        if msg.get("role") == "tool":
            script.tool_result = "".join(_texts(msg.get("content"))).strip()
            return script
        if msg.get("role") == "user":
            texts = _texts(msg.get("content"))
            cleaned = [parse_script(t, script) for t in texts]
            script.text = next((c for c in reversed(cleaned) if c), "")
            return script
    return script


def script_anthropic(body: dict[str, Any]) -> Script:
    script = Script()
    for msg in reversed(body.get("messages") or []):
        if msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, list):
            results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
            if results:
                script.tool_result = "".join(_texts(results[-1].get("content"))).strip()
                return script
        cleaned = [parse_script(t, script) for t in _texts(content)]
        script.text = next((c for c in reversed(cleaned) if c), "")
        return script
    return script


# --- the answer ------------------------------------------------------------------

@dataclass
class Plan:
    reasoning: list[str]
    text: list[str]
    calls: list[tuple[str, str, str]]  # id, name, arguments JSON text
    finish: str                        # stop | length | tool_calls | stop_sequence
    stop_sequence: str | None
    input_tokens: int

    @property
    def output_tokens(self) -> int:
        return (len(self.reasoning) + len(self.text)
                + sum(len(args) // 4 + 1 for _, _, args in self.calls)) or 1


def _words(text: str) -> list[str]:
    return re.findall(r"\S+\s*", text)


def make_plan(script: Script, body: dict[str, Any], *, id_prefix: str) -> Plan:
    stops = body.get("stop_sequences") or body.get("stop") or []
    if isinstance(stops, str):
        stops = [stops]
    limit = body.get("max_tokens") or body.get("max_completion_tokens")
    reasoning = _words(reasoning_for(script.text)) if script.think else []
    finish, matched = "stop", None
    calls: list[tuple[str, str, str]] = []
    if script.tool_result is not None:
        answer = f"tool said: {script.tool_result}"
    elif script.calls:
        answer, finish = "", "tool_calls"
        for n, (name, args) in enumerate(script.calls):
            text = orjson.dumps(args).decode()
            digest = hashlib.sha256(f"{n}:{name}:{text}".encode()).hexdigest()[:24]
            calls.append((f"{id_prefix}{digest}", name, text))
    else:
        answer = f"echo: {script.text}"
    hits = [(answer.find(s), s) for s in stops if s and s in answer]
    if hits:
        at, matched = min(hits)
        answer, finish = answer[:at], "stop_sequence"
    words = _words(answer)
    if isinstance(limit, int) and len(words) > limit:
        words, finish, matched = words[:limit], "length", None
    request_size = {k: body.get(k) for k in ("system", "messages", "tools")}
    return Plan(reasoning, words, calls, finish, matched, rough_tokens(request_size))


# --- OpenAI rendering ------------------------------------------------------------

_OPENAI_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls",
                  "stop_sequence": "stop"}


def _openai_usage(plan: Plan, body: dict[str, Any]) -> dict[str, Any]:
    cached = plan.input_tokens // 2 if body.get("prompt_cache_key") else 0
    return {"prompt_tokens": plan.input_tokens, "completion_tokens": plan.output_tokens,
            "total_tokens": plan.input_tokens + plan.output_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": len(plan.reasoning)}}


def _openai_logprobs(words: list[str], body: dict[str, Any]) -> dict[str, Any] | None:
    if not body.get("logprobs"):
        return None
    top = body.get("top_logprobs") or 0

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    def alternatives(w: str) -> list[dict[str, Any]]:
        if not top:
            return []
        return [entry(w, -0.25)] + [entry(f"alt{k}", -2.0 - k) for k in range(1, top)]

    return {"content": [{**entry(w, -0.25), "top_logprobs": alternatives(w)} for w in words],
            "refusal": None}


def _openai_finish(plan: Plan) -> dict[str, Any]:
    choice: dict[str, Any] = {"finish_reason": _OPENAI_FINISH[plan.finish]}
    if plan.stop_sequence is not None:
        choice["stop_reason"] = plan.stop_sequence  # as vLLM reports it
    return choice


def openai_frames(plan: Plan, body: dict[str, Any], rid: str) -> list[bytes]:
    head = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": body.get("model")}

    def chunk(delta: dict[str, Any], **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
        return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"

    frames = [chunk({"role": "assistant", "content": ""})]
    frames += [chunk({"reasoning_content": w}) for w in plan.reasoning]
    logprobs = _openai_logprobs(plan.text, body)
    for n, w in enumerate(plan.text):
        extra = {"logprobs": {"content": [logprobs["content"][n]], "refusal": None}} if logprobs else {}
        frames.append(chunk({"content": w}, **extra))
    for n, (cid, name, args) in enumerate(plan.calls):
        frames.append(chunk({"tool_calls": [{"index": n, "id": cid, "type": "function",
                                             "function": {"name": name, "arguments": ""}}]}))
        half = len(args) // 2
        for piece in (args[:half], args[half:]):
            frames.append(chunk({"tool_calls": [{"index": n, "function": {"arguments": piece}}]}))
    frames.append(chunk({}, **_openai_finish(plan)))
    if (body.get("stream_options") or {}).get("include_usage"):
        frames.append(b"data: " + orjson.dumps({**head, "choices": [],
                                                "usage": _openai_usage(plan, body)}) + b"\n\n")
    frames.append(b"data: [DONE]\n\n")
    return frames


def openai_body(plan: Plan, body: dict[str, Any], rid: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant",
                               "content": "".join(plan.text) if not plan.calls else None}
    if plan.reasoning:
        message["reasoning_content"] = "".join(plan.reasoning)
    if plan.calls:
        message["tool_calls"] = [{"id": cid, "type": "function",
                                  "function": {"name": name, "arguments": args}}
                                 for cid, name, args in plan.calls]
    choice = {"index": 0, "message": message, "logprobs": _openai_logprobs(plan.text, body),
              **_openai_finish(plan)}
    return {"id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model"), "choices": [choice], "usage": _openai_usage(plan, body)}


# --- Anthropic rendering -----------------------------------------------------------

_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                   "stop_sequence": "stop_sequence"}


def _anthropic_usage(plan: Plan, body: dict[str, Any], output: int) -> dict[str, Any]:
    total = plan.input_tokens
    cached = b"cache_control" in orjson.dumps(body)
    read, created = (total // 2, total // 4) if cached else (0, 0)
    return {"input_tokens": total - read - created, "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read, "output_tokens": output}


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n"


def anthropic_frames(plan: Plan, body: dict[str, Any], rid: str,
                     sign: Callable[[str], str] = signature_for) -> list[bytes]:
    message = {"id": rid, "type": "message", "role": "assistant", "model": body.get("model"),
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": _anthropic_usage(plan, body, 1)}
    frames = [_event("message_start", {"message": message}), _event("ping", {})]
    index = 0
    if plan.reasoning:
        frames.append(_event("content_block_start", {
            "index": index, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}))
        frames += [_event("content_block_delta", {
            "index": index, "delta": {"type": "thinking_delta", "thinking": w}})
            for w in plan.reasoning]
        frames.append(_event("content_block_delta", {"index": index, "delta": {
            "type": "signature_delta", "signature": sign("".join(plan.reasoning))}}))
        frames.append(_event("content_block_stop", {"index": index}))
        index += 1
    if plan.text:
        frames.append(_event("content_block_start", {
            "index": index, "content_block": {"type": "text", "text": ""}}))
        frames += [_event("content_block_delta", {
            "index": index, "delta": {"type": "text_delta", "text": w}}) for w in plan.text]
        frames.append(_event("content_block_stop", {"index": index}))
        index += 1
    for cid, name, args in plan.calls:
        frames.append(_event("content_block_start", {
            "index": index, "content_block": {"type": "tool_use", "id": cid, "name": name,
                                              "input": {}}}))
        half = len(args) // 2
        for piece in ("", args[:half], args[half:]):
            frames.append(_event("content_block_delta", {
                "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}))
        frames.append(_event("content_block_stop", {"index": index}))
        index += 1
    frames.append(_event("message_delta", {
        "delta": {"stop_reason": _ANTHROPIC_STOP[plan.finish], "stop_sequence": plan.stop_sequence},
        "usage": {"output_tokens": plan.output_tokens}}))
    frames.append(_event("message_stop", {}))
    return frames


def anthropic_body(plan: Plan, body: dict[str, Any], rid: str,
                   sign: Callable[[str], str] = signature_for) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if plan.reasoning:
        thinking = "".join(plan.reasoning)
        content.append({"type": "thinking", "thinking": thinking,
                        "signature": sign(thinking)})
    if plan.text:
        content.append({"type": "text", "text": "".join(plan.text)})
    content += [{"type": "tool_use", "id": cid, "name": name, "input": orjson.loads(args)}
                for cid, name, args in plan.calls]
    return {"id": rid, "type": "message", "role": "assistant", "model": body.get("model"),
            "content": content, "stop_reason": _ANTHROPIC_STOP[plan.finish],
            "stop_sequence": plan.stop_sequence,
            "usage": _anthropic_usage(plan, body, plan.output_tokens)}
