"""What the demo upstream answers, rendered to wire bytes (pure: no I/O, no clock
beyond a ``created`` stamp).

The demo model quotes the last user message in a short reply, one word per
content chunk; when tools are offered and that message holds
``[[tool:NAME {json}]]`` it calls that tool instead; after a tool result it
quotes the result. Model-name suffixes are bench knobs: ``-dN`` N ms between
chunks, ``-tN`` N ms before the first chunk (or the whole reply), ``-nN`` N
content chunks (the reply's words, repeated as needed). ``max_tokens`` caps the
chunk count in every case (finish ``length`` / stop reason ``max_tokens``).

:func:`render` turns one request body into a :class:`Canned` response or a
:class:`Stream` of SSE payloads; the server caches both per body.
"""

from __future__ import annotations

import re
import time
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from app.errors import error_body, error_status
from pool.errors import BadRequest, GatewayError, InternalError

__all__ = ["DEFAULT_MODELS", "Canned", "Stream", "render", "canned", "error_reply", "models_body"]

DEFAULT_MODELS = ("poolgate-demo",)
_QUOTE_WORDS = 80
_KNOB = re.compile(r"-([dnt])(\d+(?:\.\d+)?)(?=-|$)")
_TOOL_MARK = re.compile(r"\[\[tool:([\w.\-]+)\s*(\{.*?\})?\s*\]\]", re.S)
_FINGERPRINT = "fp_poolgate_demo"
_ADVICE = "Configure a worker in poolgate.toml to reach a real model."


# ------------------------------------------------------------------ what to answer
@dataclass(frozen=True, slots=True)
class _Turn:
    """The demo model's answer: content chunks, or one tool call (name, JSON arguments)."""

    chunks: tuple[str, ...]
    truncated: bool
    tool: tuple[str, str] | None
    input_tokens: int
    output_tokens: int


@lru_cache(maxsize=256)
def _knobs(model: str) -> tuple[int | None, float, float]:
    """(chunk count or None, seconds between chunks, seconds before the first)."""
    found = {k: float(v) for k, v in _KNOB.findall(model)}
    count = int(found["n"]) if "n" in found else None
    return count, found.get("d", 0.0) / 1000, found.get("t", 0.0) / 1000


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [b["text"] for b in content if isinstance(b, dict)
                and b.get("type") in ("text", "input_text") and isinstance(b.get("text"), str)]
    return []


def _last_turn(messages: list[Any]) -> tuple[str, str]:
    """('user' | 'tool' | 'none', text) of the last user or tool-result message."""
    for m in reversed(messages):
        if not isinstance(m, dict):
            continue
        role, content = m.get("role"), m.get("content")
        if role == "tool":
            return "tool", " ".join(_texts(content))
        if role != "user":
            continue
        if isinstance(content, list):
            results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
            if results:
                return "tool", " ".join(t for r in results for t in _texts(r.get("content")))
        texts = _texts(content)
        return "user", texts[-1] if texts else ""
    return "none", ""


def _tool_names(tools: Any) -> frozenset[str]:
    names = set()
    for t in tools if isinstance(tools, list) else ():
        if isinstance(t, dict):
            fn = t.get("function")
            name = fn.get("name") if isinstance(fn, dict) else t.get("name")
            if isinstance(name, str):
                names.add(name)
    return frozenset(names)


def _chars(obj: Any) -> int:
    if isinstance(obj, str):
        return len(obj)
    if isinstance(obj, dict):
        return sum(_chars(v) for v in obj.values())
    if isinstance(obj, list):
        return sum(_chars(v) for v in obj)
    return 0


def _input_tokens(req: dict[str, Any]) -> int:
    """About four characters a token, plus a few per message, as real tokenizers count."""
    messages = req.get("messages")
    n_msgs = len(messages) if isinstance(messages, list) else 0
    chars = _chars(messages) + _chars(req.get("system")) + _chars(req.get("tools"))
    return max(1, chars // 4 + 4 * n_msgs)


def _limit(req: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        v = req.get(name)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise BadRequest(f"{name}: must be a positive integer", param=name)
        return v
    return None


def _requested_tool(req: dict[str, Any], role: str, text: str) -> tuple[str, str] | None:
    choice = req.get("tool_choice")
    if role != "user" or choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none"):
        return None
    names = _tool_names(req.get("tools"))
    m = _TOOL_MARK.search(text) if names else None
    if m is None or m.group(1) not in names:
        return None
    try:
        args = orjson.loads(m.group(2) or "{}")
    except orjson.JSONDecodeError:
        return None
    return (m.group(1), orjson.dumps(args).decode()) if isinstance(args, dict) else None


def _reply_words(role: str, text: str) -> list[str]:
    quote = text.split()
    if len(quote) > _QUOTE_WORDS:
        quote = quote[:_QUOTE_WORDS] + ["…"]
    if not quote:
        return f"poolgate demo model: hello! {_ADVICE}".split()
    lead = "the tool returned" if role == "tool" else "you said"
    return f"poolgate demo model: {lead} “{' '.join(quote)}”. {_ADVICE}".split()


def _turn(req: dict[str, Any], limit_names: tuple[str, ...]) -> _Turn:
    messages = req.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("messages: must be an array of messages", param="messages")
    limit = _limit(req, limit_names)
    role, text = _last_turn(messages)
    input_tokens = _input_tokens(req)
    tool = _requested_tool(req, role, text)
    if tool is not None:
        return _Turn((), False, tool, input_tokens, 8 + len(tool[1]) // 4)
    words = _reply_words(role, text)
    count = _knobs(str(req.get("model", "")))[0]
    count = len(words) if count is None else count
    truncated = limit is not None and count > limit
    if truncated:
        count = limit
    chunks = [words[i % len(words)] + " " for i in range(count)]
    if chunks:
        chunks[-1] = chunks[-1].rstrip()
    return _Turn(tuple(chunks), truncated, None, input_tokens, count)


# ------------------------------------------------------------------ wire rendering
@dataclass(frozen=True, slots=True)
class Canned:
    """A complete HTTP response (keep-alive), sent after ``delay`` seconds."""

    data: bytes
    delay: float
    stat: str


@dataclass(frozen=True, slots=True)
class Stream:
    """SSE payloads: ``head`` at once, ``chunks`` paced, ``tail`` right after the last."""

    head: bytes
    chunks: tuple[bytes, ...]
    tail: bytes
    delay: float
    ttft: float
    stat: str


_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed",
            500: b"Internal Server Error"}


def canned(status: int, body: bytes, stat: str = "", delay: float = 0.0) -> Canned:
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        status, _REASONS.get(status, b"Error"), len(body))
    return Canned(head + b"connection: keep-alive\r\n\r\n" + body, delay, stat)


def error_reply(exc: GatewayError, dialect: str) -> Canned:
    return canned(error_status(exc, dialect), orjson.dumps(error_body(exc, dialect)), "errors")


def _split(text: str, pieces: int = 3) -> list[str]:
    step = max(1, -(-len(text) // pieces))
    return [text[i:i + step] for i in range(0, len(text), step)]


def _openai(req: dict[str, Any], body: bytes) -> Canned | Stream:
    turn = _turn(req, ("max_completion_tokens", "max_tokens"))
    model = str(req.get("model") or DEFAULT_MODELS[0])
    _, delay, ttft = _knobs(model)
    rid = "chatcmpl-demo%08x" % zlib.crc32(body)
    finish = "tool_calls" if turn.tool else "length" if turn.truncated else "stop"
    usage = {"prompt_tokens": turn.input_tokens, "completion_tokens": turn.output_tokens,
             "total_tokens": turn.input_tokens + turn.output_tokens,
             "prompt_tokens_details": {"cached_tokens": 0},
             "completion_tokens_details": {"reasoning_tokens": 0}}
    call_id = "call_demo%08x" % zlib.crc32(body, 1)
    created = int(time.time())
    if req.get("stream") is not True:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(turn.chunks),
                                   "refusal": None}
        if turn.tool:
            message["content"] = None
            message["tool_calls"] = [{"id": call_id, "type": "function", "function": {
                "name": turn.tool[0], "arguments": turn.tool[1]}}]
        return canned(200, orjson.dumps({
            "id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish}],
            "usage": usage, "system_fingerprint": _FINGERPRINT}), "chat", ttft)
    opts = req.get("stream_options")
    with_usage = isinstance(opts, dict) and opts.get("include_usage") is True
    chunk_base = {"id": rid, "object": "chat.completion.chunk", "created": created,
                  "model": model, "system_fingerprint": _FINGERPRINT}
    if with_usage:
        chunk_base["usage"] = None

    def frame(delta: dict[str, Any], reason: str | None = None) -> bytes:
        return b"data: " + orjson.dumps({**chunk_base, "choices": [{
            "index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}) + b"\n\n"

    if turn.tool:
        name, args = turn.tool
        head = frame({"role": "assistant", "content": None, "tool_calls": [{
            "index": 0, "id": call_id, "type": "function",
            "function": {"name": name, "arguments": ""}}]})
        chunks = [frame({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                  for piece in _split(args)]
    else:
        head = frame({"role": "assistant", "content": "", "refusal": None})
        chunks = [frame({"content": word}) for word in turn.chunks]
    tail = frame({}, finish)
    if with_usage:
        tail += b"data: " + orjson.dumps({**chunk_base, "choices": [], "usage": usage}) + b"\n\n"
    return Stream(head, tuple(chunks), tail + b"data: [DONE]\n\n", delay, ttft, "chat_stream")


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps(payload))


def _anthropic(req: dict[str, Any], body: bytes) -> Canned | Stream:
    turn = _turn(req, ("max_tokens",))
    model = str(req.get("model") or DEFAULT_MODELS[0])
    _, delay, ttft = _knobs(model)
    rid = "msg_demo%08x" % zlib.crc32(body)
    stop = "tool_use" if turn.tool else "max_tokens" if turn.truncated else "end_turn"
    usage = {"input_tokens": turn.input_tokens, "output_tokens": turn.output_tokens,
             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    tool_id = "toolu_demo%08x" % zlib.crc32(body, 1)
    message = {"id": rid, "type": "message", "role": "assistant", "model": model}
    if req.get("stream") is not True:
        block = ({"type": "tool_use", "id": tool_id, "name": turn.tool[0],
                  "input": orjson.loads(turn.tool[1])} if turn.tool
                 else {"type": "text", "text": "".join(turn.chunks)})
        return canned(200, orjson.dumps({
            **message, "content": [block], "stop_reason": stop, "stop_sequence": None,
            "usage": usage}), "messages", ttft)
    head = _event("message_start", {"type": "message_start", "message": {
        **message, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1}}})
    if turn.tool:
        head += _event("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "tool_use", "id": tool_id,
                                                                 "name": turn.tool[0], "input": {}}})
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in _split(turn.tool[1])]
    else:
        head += _event("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}})
        deltas = [{"type": "text_delta", "text": w} for w in turn.chunks]
    head += _event("ping", {"type": "ping"})
    chunks = tuple(_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                  "delta": d}) for d in deltas)
    tail = (_event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + _event("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": stop, "stop_sequence": None},
                                       "usage": {"output_tokens": turn.output_tokens}})
            + _event("message_stop", {"type": "message_stop"}))
    return Stream(head, chunks, tail, delay, ttft, "messages_stream")


def _count_tokens(req: dict[str, Any], body: bytes) -> Canned:
    if not isinstance(req.get("messages"), list):
        raise BadRequest("messages: must be an array of messages", param="messages")
    return canned(200, orjson.dumps({"input_tokens": _input_tokens(req)}), "count_tokens")


_RENDER = {"chat": (_openai, "openai"), "messages": (_anthropic, "anthropic"),
           "count_tokens": (_count_tokens, "anthropic")}


def render(route: str, body: bytes) -> Canned | Stream:
    """The reply to one request body on ``route`` ("chat", "messages" or "count_tokens");
    bad input becomes the dialect's error envelope, never an exception."""
    build, dialect = _RENDER[route]
    try:
        req = orjson.loads(body) if body else None
        if not isinstance(req, dict):
            raise BadRequest("the request body must be a JSON object")
        return build(req, body)
    except orjson.JSONDecodeError:
        return error_reply(BadRequest("the request body is not valid JSON"), dialect)
    except GatewayError as exc:
        return error_reply(exc, dialect)
    except Exception as exc:  # noqa: BLE001 - a demo server answers, whatever it was sent
        return error_reply(InternalError(f"demo upstream failed: {type(exc).__name__}"), dialect)


def models_body(models: tuple[str, ...]) -> bytes:
    # both SDKs' list shapes in one object: OpenAI reads id/object/created/owned_by,
    # Anthropic type/id/display_name/created_at and the paging fields
    data = [{"id": m, "object": "model", "created": 1735689600, "owned_by": "poolgate",
             "type": "model", "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
            for m in models]
    return orjson.dumps({"object": "list", "data": data, "has_more": False,
                         "first_id": models[0] if models else None,
                         "last_id": models[-1] if models else None})
