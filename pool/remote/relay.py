"""Same-dialect answers forwarded as the upstream's bytes (sans-IO).

When a client speaks the dialect of the ``remote`` worker that serves it
(OpenAI chat to an OpenAI upstream, Anthropic messages to an Anthropic one,
Gemini to Gemini: :mod:`.gemini_relay`), the answer needs no canonical round
trip: the upstream's JSON body, or its SSE frames, go to the client as they
came, with only the model name (Gemini's ``modelVersion``) replaced by the
name the client asked for (an alias maps it to another upstream name). A
cheap side scan (one ``orjson.loads`` per body or frame) keeps what the
gateway must know: usage, finish reason, errors, and how many frames carried
content (what a stream cut before its usage is charged).

Stream rules:

* :meth:`Relay.feed` returns only COMPLETE frames (a partial one stays
  buffered), so a keep-alive ping written between two feeds never lands
  inside a frame. Lines may end in ``\\r\\n`` or ``\\r``: they are forwarded
  as ``\\n`` (the same events to any SSE parser).
* OpenAI: poolgate asks the upstream for ``stream_options.include_usage`` so
  it can charge; when the client did not ask for it the usage-only chunk
  (``"choices": []``) is not forwarded.
* An error frame is not forwarded: :attr:`Relay.error` is set and the frames
  before it are returned; the worker raises the (scrubbed) error and the
  gateway sends its own dialect error frame, as for a translated stream.
* The model is rewritten in every OpenAI chunk and in Anthropic's
  ``message_start``; other frames never carry it.
* Plain content frames (an OpenAI chunk with ``"finish_reason":null`` and no
  usage, error or empty content; an Anthropic ``content_block_delta``) are
  told by their bytes and not parsed: they are counted and passed on as they
  came (a broken one reaches the client as the upstream sent it).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import orjson

from pool.accumulate import merge_usage
from pool.errors import GatewayError, UpstreamUnavailable
from pool.model import ChatRequest, Usage
from pool.sse import MAX_LINE

from . import anthropic_messages, openai_chat
from .errors import error_from_object, loads_upstream

__all__ = ["Relay", "OpenAIRelay", "AnthropicRelay", "relay_for"]

_NO_USAGE = Usage()  # frozen: one instance serves every relay until usage comes
# the key naming the model in an answer -> its "key": "value" pairs
_MODEL_KEYS = {key: re.compile(rb'"' + key.encode() + rb'"\s*:\s*"(?:[^"\\]|\\.)*"')
               for key in ("model", "modelVersion")}
_EMPTY = b""


def _model_field(raw: bytes, found: Any, model: str,
                 key: str = "model") -> tuple[bytes, bytes] | None:
    """(the bytes of the upstream's ``"<key>": "<found>"`` pair in ``raw``, what
    replaces them), or ``None`` when nothing needs replacing or it is not there."""
    if found == model or not isinstance(found, str):
        return None
    for match in _MODEL_KEYS[key].finditer(raw):
        pair = match.group()
        value = pair[pair.index(b":") + 1:].strip()
        if orjson.loads(value) == found:
            return pair, b'"' + key.encode() + b'":' + orjson.dumps(model)
    return None


class Relay:
    """The state of one forwarded answer; a dialect subclass scans its frames.

    ``model``: the name the client asked for. ``stream``: whether the client
    asked for a stream (a body is scanned by :meth:`body`, frames by
    :meth:`feed`)."""

    __slots__ = ("model", "stream", "usage", "finish", "error", "done", "content_events",
                 "forwarded", "_buf", "_pending_cr", "_swap")

    usage_of: Callable[[dict[str, Any]], Usage]
    model_key = "model"  # the answer's field naming the model

    def __init__(self, model: str, stream: bool) -> None:
        self.model = model
        self.stream = stream
        self.usage = _NO_USAGE
        self.finish: str | None = None   # the canonical finish reason
        self.error: GatewayError | None = None
        self.done = False                # the terminal frame went through
        self.content_events = 0          # frames that carried content
        self.forwarded = False           # some bytes went to the client
        self._buf = bytearray()  # a partial frame
        self._pending_cr = False
        self._swap: tuple[bytes, bytes] | None = None  # model pair -> replacement

    # --- a whole body -------------------------------------------------------------

    def body(self, raw: bytes) -> bytes:
        """The body for the client; raises the error an error body reports."""
        obj = loads_upstream(raw)
        if not isinstance(obj, dict):
            raise UpstreamUnavailable("upstream sent an unexpected response body")
        self._scan_body(obj)
        key = self.model_key
        swap = _model_field(raw, obj.get(key), self.model, key)
        if swap is not None:
            pair, replacement = swap
            # one pair only: a tool input holding the same pair must stay as it is
            if raw.count(pair) == 1:
                raw = raw.replace(pair, replacement)
            else:
                obj[key] = self.model
                raw = orjson.dumps(obj)
        self.forwarded = True
        return raw

    def _scan_body(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def _add_usage(self, raw: Any) -> None:
        if raw:
            self.usage = merge_usage(self.usage, type(self).usage_of(raw))

    # --- a stream -----------------------------------------------------------------

    def feed(self, chunk: bytes) -> bytes:
        """The complete frames of what arrived so far, as the client gets them
        (``b""`` when none is complete yet, or after the terminal frame)."""
        if self.done or self.error is not None:
            return _EMPTY
        if b"\r" in chunk or self._pending_cr:
            chunk = self._normalise(chunk)
        buf = self._buf
        if not buf:  # the common case: reads end on a frame boundary
            end = chunk.rfind(b"\n\n")
            if end < 0:
                buf += chunk
                return self._partial()
            if end + 2 < len(chunk):
                buf += chunk[end + 2:]
                self._partial()
                chunk = chunk[:end + 2]
            block = chunk
        else:
            start = len(buf) - 1  # a blank line may straddle the two reads
            buf += chunk
            end = buf.find(b"\n\n", start)
            if end < 0:
                return self._partial()
            end = buf.rfind(b"\n\n", end)
            block = bytes(buf[:end + 2])
            del buf[:end + 2]
            self._partial()
        out = self._frames(block)
        if out:
            self.forwarded = True
        return out

    def _partial(self) -> bytes:
        """Hold the partial frame, within bounds: an endless line is an upstream
        fault, not a buffer that grows until memory runs out."""
        if len(self._buf) > MAX_LINE:
            self._buf = bytearray()
            raise UpstreamUnavailable(
                f"The upstream sent a server-sent event line longer than {MAX_LINE} bytes.")
        return _EMPTY

    def close(self) -> bytes:
        """The upstream's body ended: a last frame without its blank line is
        taken (lenient, as the SDKs are); no terminal frame is an error."""
        out = _EMPTY
        if self._buf.strip() and not self.done and self.error is None:
            rest = bytes(self._buf).rstrip(b"\n") + b"\n\n"
            self._buf = bytearray()
            out = self._frames(rest)
            if out:
                self.forwarded = True
        if not self.done and self.error is None:
            raise UpstreamUnavailable("upstream closed the stream early")
        return out

    def _normalise(self, chunk: bytes) -> bytes:
        if self._pending_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._pending_cr = chunk[-1:] == b"\r"
        return chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def _frames(self, block: bytes) -> bytes:
        """Scan the complete frames in ``block``; the bytes to forward (all of
        ``block`` when every frame goes on unchanged, the common case)."""
        frames = block.split(b"\n\n")
        frames.pop()  # what follows the last blank line: nothing
        out: list[bytes] = []
        changed = False
        for frame in frames:
            if not frame:  # a stray blank line
                changed = True
                continue
            try:
                verdict = self._frame(frame)
            except GatewayError as exc:  # a frame that makes no sense ends the stream
                self.error = exc
            if self.error is not None:
                changed = True
                break
            if verdict is True:
                out.append(frame)
            elif verdict is not False:
                out.append(verdict)
                changed = True
            else:
                changed = True
            if self.done:
                changed = changed or frame is not frames[-1]
                break
        if changed:
            block = b"\n\n".join(out) + b"\n\n" if out else _EMPTY
        swap = self._swap
        if swap is not None and self.swap_every_frame:
            block = block.replace(swap[0], swap[1])
        return block

    swap_every_frame = False

    def _frame(self, frame: bytes) -> bool | bytes:
        """Scan one frame: ``True`` to forward it as it is, ``False`` to drop it,
        or the bytes to forward instead."""
        raise NotImplementedError


class OpenAIRelay(Relay):
    """An OpenAI Chat Completions answer (``chat.completion`` or its chunks)."""

    __slots__ = ("_drop_usage", "_seen_model")

    usage_of = staticmethod(openai_chat.usage_of)
    swap_every_frame = True  # every chunk names the model

    def __init__(self, model: str, stream: bool, *, usage_wanted: bool) -> None:
        super().__init__(model, stream)
        self._drop_usage = not usage_wanted
        self._seen_model = False

    def _scan_body(self, obj: dict[str, Any]) -> None:
        if obj.get("error") is not None:
            raise error_from_object(obj)
        self._add_usage(obj.get("usage"))
        choices = obj.get("choices")
        if choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            if reason:
                self.finish = openai_chat.finish_of(choices[0], reason).reason

    def _frame(self, frame: bytes) -> bool | bytes:
        if (self._seen_model and b'"finish_reason":null' in frame
                and b'"usage":{' not in frame and b'"error"' not in frame
                and b'"content":""' not in frame):
            # a content chunk, told by its bytes (a quote inside a string is
            # escaped, so these pairs are the chunk's own keys): no parse needed
            self.content_events += 1
            return True
        _, data = _data(frame)
        if not data:
            return True  # a comment (keep-alive) or an empty event
        if data == b"[DONE]":
            self.done = True
            return True
        chunk = loads_upstream(data)
        if not isinstance(chunk, dict):
            raise UpstreamUnavailable("upstream sent an unexpected stream chunk")
        if chunk.get("error") is not None:
            raise error_from_object(chunk)
        if not self._seen_model:
            self._seen_model = True
            self._swap = _model_field(frame, chunk.get("model"), self.model)
        usage = chunk.get("usage")
        if usage:
            self._add_usage(usage)
        choices = chunk.get("choices")
        if not choices:
            # the usage-only chunk poolgate asked for on the client's behalf
            return not (usage and self._drop_usage)
        choice = choices[0]
        delta = choice.get("delta")
        if delta and (delta.get("content") or delta.get("tool_calls")
                      or delta.get("reasoning_content") or delta.get("reasoning")):
            self.content_events += 1
        reason = choice.get("finish_reason")
        if reason:
            self.finish = openai_chat.finish_of(choice, reason).reason
        return True


class AnthropicRelay(Relay):
    """An Anthropic Messages answer (a ``message`` or its events). It also
    keeps the signed reasoning it passes on (``signed``: each thinking block's
    signature, each redacted block's data), which the gateway notes against
    the worker's account (:mod:`pool.signatures`); only the frames of an open
    thinking block are searched for a signature."""

    __slots__ = ("signed", "_signature")

    usage_of = staticmethod(anthropic_messages.usage_of)

    def __init__(self, model: str, stream: bool) -> None:
        super().__init__(model, stream)
        self.signed: list[str] | None = None
        self._signature: str | None = None  # a thinking block is open: its signature so far

    def _sign(self, value: Any) -> None:
        if type(value) is str and value:
            if self.signed is None:
                self.signed = []
            self.signed.append(value)

    def _scan_body(self, obj: dict[str, Any]) -> None:
        if obj.get("type") == "error" or (obj.get("error") is not None and "content" not in obj):
            raise error_from_object(obj)
        self._add_usage(obj.get("usage"))
        finish = anthropic_messages.finish_of(obj)
        if finish is not None:
            self.finish = finish.reason
        content = obj.get("content")
        for block in content if type(content) is list else ():
            if type(block) is dict:
                kind = block.get("type")
                if kind == "thinking":
                    self._sign(block.get("signature"))
                elif kind == "redacted_thinking":
                    self._sign(block.get("data"))

    def _frame(self, frame: bytes) -> bool | bytes:
        if frame.startswith(b"event: content_block_delta\n"):  # the hot one: no parse needed
            self.content_events += 1
            if self._signature is not None and b'"signature_delta"' in frame:
                self._signature_delta(loads_upstream(_data(frame)[1] or b"{}"))
            return True
        _, data = _data(frame)
        if not data:
            return True
        obj = loads_upstream(data)
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == "content_block_delta":
            self.content_events += 1
            if self._signature is not None:
                self._signature_delta(obj)
            return True
        if kind == "content_block_start":
            block = obj.get("content_block") or {}
            btype = block.get("type")
            if btype not in ("text", "thinking") or block.get("text"):
                self.content_events += 1
            if btype == "thinking":
                self._signature = block.get("signature") or ""
            elif btype == "redacted_thinking":
                self._sign(block.get("data"))
            return True
        if kind == "content_block_stop":
            if self._signature is not None:
                self._sign(self._signature)
                self._signature = None
            return True
        if kind == "message_start":
            message = obj.get("message") or {}
            self._add_usage(message.get("usage"))
            swap = _model_field(frame, message.get("model"), self.model)
            return frame.replace(swap[0], swap[1], 1) if swap is not None else True
        if kind == "message_delta":
            finish = anthropic_messages.finish_of(obj.get("delta") or {})
            if finish is not None:
                self.finish = finish.reason
            self._add_usage(obj.get("usage"))
            return True
        if kind == "message_stop":
            self.done = True
            return True
        if kind == "error":
            raise error_from_object(obj)
        if kind is None:
            raise UpstreamUnavailable("upstream sent an unexpected stream event")
        return True  # ping and events this gateway does not model

    def _signature_delta(self, obj: Any) -> None:
        delta = obj.get("delta") if type(obj) is dict else None
        if type(delta) is dict and delta.get("type") == "signature_delta":
            piece = delta.get("signature")
            if type(piece) is str:
                self._signature = (self._signature or "") + piece


def relay_for(dialect: str, request: ChatRequest, model: str) -> Relay | None:
    """A relay when the answer of an upstream speaking ``dialect`` can go to the
    client of ``request`` as it comes: same dialect, and no custom (free-text)
    tools, whose calls come back wrapped and must be unwrapped for the client.
    ``model``: the name the client asked for."""
    if request.tools and any(t.kind == "custom" for t in request.tools):
        return None
    if dialect == "openai" and request.dialect == "openai_chat":
        options = request.raw.get("stream_options")
        wanted = type(options) is dict and options.get("include_usage") is True
        return OpenAIRelay(model, request.stream, usage_wanted=wanted)
    if dialect == "anthropic" and request.dialect == "anthropic":
        return AnthropicRelay(model, request.stream)
    if dialect == "gemini" and request.dialect == "gemini":
        from .gemini_relay import GeminiRelay  # it imports this module

        return GeminiRelay(model, request.stream)
    return None


def _data(frame: bytes) -> tuple[bytes | None, bytes | None]:
    """(event name, data) of one frame; ``None`` data for a comment-only frame."""
    if frame.startswith(b"data:") and b"\n" not in frame:  # the common one-line frame
        data = frame[5:]
        return None, data[1:] if data[:1] == b" " else data
    event = None
    parts: list[bytes] = []
    for line in frame.split(b"\n"):
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            parts.append(value)
        elif name == b"event":
            event = value
    return event, b"\n".join(parts) if parts else None
