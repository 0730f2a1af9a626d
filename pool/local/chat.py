"""The engine-independent half of a local worker: a :class:`ChatRequest` in,
canonical events out, over any :class:`~pool.local.engine.Engine`.

One path for every engine, so they all behave alike:

* the prompt: token ids as given, raw text tokenised, or the conversation
  rendered with the model's own chat template (tools included);
* sampling parameters checked against the context before anything runs;
* the text: token bytes through an incremental UTF-8 decoder, so a character
  split across tokens comes out whole, and bytes that never form one come
  out as U+FFFD instead of breaking the stream;
* stop strings end generation at once (the engine's iterator is closed),
  with the text up to the stop string sent and the stop string not;
* tool calls in the model's native ``<tool_call>`` format parsed as the text
  streams (:mod:`pool.local.toolcalls`); a forced tool choice prefills the
  opening of the call so the model has to write one;
* logprobs and token ids per token, for OpenAI ``logprobs`` and ``/generate``.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import math
from typing import Any, AsyncIterator, Sequence

from ..errors import BadRequest
from ..model import (
    ChatRequest, Event, ExecutedToolPart, Finish, FinishReason, ImagePart, Logprobs, Message, ReasoningPart, Start,
    TextDelta, TextPart, TokenLogprob, ToolCallDelta, ToolCallEnd, ToolCallPart, ToolCallStart,
    ToolResultPart, Usage, executed_text,
)
from .engine import Engine, EngineError, GenParams, Step
from .health import EngineWatch
from .sampling import SamplingDefaults
from .shield import SpecialShield
from .template import TemplateError
from .toolcalls import OPEN, CallOut, HermesParser, TextOut, new_call_id

__all__ = ["LocalChat", "StopMatcher", "template_messages", "template_tools"]

# where each dialect asks for an answer format (named when it is refused)
_FORMAT_PARAM = {"openai_responses": "text.format", "anthropic": "output_config.format",
                 "gemini": "generationConfig.responseMimeType"}


# --- the conversation as a chat template wants it -------------------------------------------

def _text(parts: Sequence[object], where: str) -> str:
    out = []
    for part in parts:
        if isinstance(part, TextPart):
            out.append(part.text)
        elif isinstance(part, ExecutedToolPart):  # a tool a cli worker ran
            out.append(executed_text(part))
        elif isinstance(part, ImagePart):
            raise BadRequest(f"This model takes text only; {where} holds an image.", param="messages")
    return "".join(out)


def template_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Canonical messages as the OpenAI-shaped dicts chat templates are written for."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = "system" if message.role == "developer" else message.role
        if role == "assistant":
            calls = [{"id": p.id, "type": "function",
                      "function": {"name": p.name, "arguments": p.arguments}}
                     for p in message.parts if isinstance(p, ToolCallPart)]
            text = _text([p for p in message.parts if not isinstance(p, (ReasoningPart, ToolCallPart))],
                         where)
            entry: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
            continue
        text_parts: list[object] = []
        for part in message.parts:
            if isinstance(part, ToolResultPart):
                out.append({"role": "tool", "tool_call_id": part.call_id,
                            "content": _text(part.content, where)})
            else:
                text_parts.append(part)
        if text_parts or not any(isinstance(p, ToolResultPart) for p in message.parts):
            out.append({"role": role, "content": _text(text_parts, where)})
    return out


def template_tools(request: ChatRequest) -> list[dict[str, Any]] | None:
    if not request.tools or (request.tool_choice is not None and request.tool_choice.mode == "none"):
        return None
    tools = []
    for tool in request.tools:
        function: dict[str, Any] = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        function["parameters"] = (dict(tool.parameters) if tool.parameters is not None
                                  else {"type": "object", "properties": {}})
        tools.append({"type": "function", "function": function})
    return tools


# --- stop strings ------------------------------------------------------------------------------

class StopMatcher:
    """Finds the first stop string in streamed text. Holds back a tail that could
    still become one, so no part of a stop string is ever sent."""

    __slots__ = ("_stops", "_hold", "_buf")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._buf = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """(text safe to send, the stop string hit or None). After a hit, stop feeding."""
        if not self._stops:
            return text, None
        buf = self._buf + text
        hit_at, hit = len(buf) + 1, None
        for stop in self._stops:
            at = buf.find(stop)
            if 0 <= at < hit_at:
                hit_at, hit = at, stop
        if hit is not None:
            self._buf = ""
            return buf[:hit_at], hit
        keep = 0
        for stop in self._stops:  # the longest tail that is a prefix of some stop string
            for n in range(min(len(stop) - 1, len(buf)), keep, -1):
                if stop.startswith(buf[-n:]):
                    keep = n
                    break
        self._buf = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], None

    def flush(self) -> str:
        buf, self._buf = self._buf, ""
        return buf


# --- the worker's answer ---------------------------------------------------------------------------

def _first(*values: Any) -> Any:
    """The first value that is set (the client's, then the worker's defaults)."""
    return next(v for v in values if v is not None)


class LocalChat:
    """Serves canonical requests from one loaded engine."""

    def __init__(self, engine: Engine, model_name: str, watch: EngineWatch | None = None,
                 defaults: SamplingDefaults = SamplingDefaults()) -> None:
        self.engine = engine
        self.model_name = model_name
        # the engine's progress: a stalled engine fails its waiting sequences (504)
        self._next_step = watch.next_step if watch is not None else _next_step
        self.defaults = defaults

    # --- the prompt ------------------------------------------------------------------------

    def prompt_ids(self, request: ChatRequest) -> tuple[list[int], str | None]:
        """The prompt's token ids, and the forced opening of a tool call (or None)."""
        tok = self.engine.tokenizer
        if request.prompt_ids is not None:
            param = "input_ids" if request.dialect == "native" else "prompt"
            ids = list(request.prompt_ids)
            if not ids:
                raise BadRequest("The prompt has no tokens.", param=param)
            vocab = getattr(tok, "vocab_size", None)
            bad = next((t for t in ids if t < 0 or (vocab is not None and t >= vocab)), None)
            if bad is not None:
                raise BadRequest(f"Token id {bad} is not in this model's vocabulary"
                                 + (f" (0..{vocab - 1})." if vocab else "."), param=param)
            return ids, None
        if request.prompt is not None:
            ids = tok.encode(request.prompt)
            if not ids:
                raise BadRequest("The prompt has no tokens.",
                                 param="text" if request.dialect == "native" else "prompt")
            return ids, None
        # client strings may not produce special tokens: only the template's markup does
        shield = SpecialShield(getattr(tok, "special_texts", ()))
        tools = shield.shield(template_tools(request))
        try:
            text = tok.render_chat(shield.shield(template_messages(request.messages)), tools, True)
        except TemplateError as exc:
            raise BadRequest(f"The model's chat template refused the conversation: {exc}",
                             param="messages") from None
        except ValueError as exc:
            raise BadRequest(str(exc), param="messages") from None
        forced = self._forced_opening(request, text) if tools else None
        if forced is not None:  # the tool name in it is the client's
            text += OPEN + shield.shield(forced[len(OPEN):])
        return shield.encode(tok, text), forced

    def _forced_opening(self, request: ChatRequest, rendered: str) -> str | None:
        choice = request.tool_choice
        if choice is None or choice.mode not in ("required", "named"):
            return None
        if OPEN not in rendered:  # the template does not speak the Hermes format
            raise BadRequest("This model's chat template has no tool-call format to force; "
                             "use tool_choice 'auto'.", param="tool_choice")
        if choice.mode == "named":
            return OPEN + '\n{"name": "' + str(choice.name) + '", "arguments":'
        return OPEN + '\n{"name": "'

    def count_tokens(self, request: ChatRequest) -> int:
        """Blocking: call it in a thread (see :meth:`stream`)."""
        return len(self.prompt_ids(request)[0])

    def params(self, request: ChatRequest, prompt_len: int) -> GenParams:
        fmt = request.response_format
        if fmt is not None and fmt.type != "text":
            # no constrained decoding here: refuse rather than answer unconstrained
            param = _FORMAT_PARAM.get(request.dialect, "response_format")
            raise BadRequest(f"response_format {fmt.type!r} is not available from local model "
                             "workers (no constrained decoding); ask for JSON in the prompt instead.",
                             param=param)
        context = self.engine.context_length
        s = request.sampling
        prompt_param = _prompt_param(request)
        if prompt_len >= context:
            raise BadRequest(f"The prompt is {prompt_len} tokens; this model's context is {context} "
                             "tokens.", param=prompt_param)
        room = context - prompt_len
        max_param = "max_new_tokens" if request.dialect == "native" else "max_tokens"
        if s.max_tokens is not None and s.max_tokens > room:
            raise BadRequest(f"max_tokens {s.max_tokens} and the prompt's {prompt_len} tokens exceed "
                             f"this model's context of {context} tokens (at most {room} here).",
                             param=max_param)
        stop_ids = frozenset(s.stop_token_ids) | (frozenset() if s.ignore_eos
                                                  else self.engine.tokenizer.eos_ids)
        want_logprobs = request.logprobs or request.dialect == "native"
        d = self.defaults
        max_tokens = s.max_tokens
        if max_tokens is None:
            max_tokens = room if d.max_tokens is None else min(d.max_tokens, room)
        return GenParams(
            max_tokens=max_tokens,
            temperature=_first(s.temperature, d.temperature, 1.0),
            top_p=_first(s.top_p, d.top_p, 1.0),
            top_k=_first(s.top_k, d.top_k, 0),
            seed=s.seed,
            logprobs=want_logprobs,
            top_logprobs=request.top_logprobs or 0 if want_logprobs else 0,
            stop_ids=stop_ids,
        )

    # --- the answer --------------------------------------------------------------------------

    async def stream(self, request: ChatRequest) -> AsyncIterator[Event]:
        try:
            # off the loop: rendering the template and tokenizing (an HTTP call to
            # llama-server) take long on a long prompt, and the loop serves every
            # other request of this worker and its health ping meanwhile
            ids, forced = await asyncio.to_thread(self.prompt_ids, request)
            params = self.params(request, len(ids))
        except EngineError as exc:
            raise exc.gateway_error(_prompt_param(request)) from None
        tok = self.engine.tokenizer
        special = getattr(tok, "special_ids", frozenset())
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        stops = StopMatcher(request.sampling.stop)
        # /generate wants the model's raw text: tool calls stay text there
        parser = HermesParser(inside=forced[len(OPEN):] if forced else None) \
            if template_tools(request) and request.dialect != "native" else None
        state = _Calls()
        n = 0
        reason: FinishReason = "length"
        stop_sequence: str | None = None
        steps = self.engine.generate(ids, params)
        try:
            async with contextlib.aclosing(steps):
                # the first step before the first event: an engine that cannot serve
                # fails the request while the gateway may still retry it elsewhere
                step = await self._next_step(steps)
                yield Start(model=self.model_name)
                yield Usage(input_tokens=len(ids),
                            cached_tokens=step.cached_prompt if step is not None else None)
                while step is not None:
                    n += 1
                    token = step.token_id
                    piece = step.piece if step.piece is not None else tok.token_bytes(token)
                    # the token's logprob follows its text, so a consumer holding
                    # both (``/generate`` streams) has them together
                    logprob = Logprobs((self._logprob(step, piece),)) if params.logprobs else None
                    if token in params.stop_ids:
                        reason = "stop"
                        if logprob is not None:
                            yield logprob
                        break
                    hit = None
                    if token not in special:
                        text = decoder.decode(piece)
                        if text:
                            text, hit = stops.feed(text)
                            if text:
                                for event in state.emit(parser, text):
                                    yield event
                    if logprob is not None:
                        yield logprob
                    if hit is not None:
                        reason, stop_sequence = "stop_sequence", hit
                        break
                    step = await self._next_step(steps)
        except EngineError as exc:
            raise exc.gateway_error(_prompt_param(request)) from None
        if reason != "stop_sequence":
            tail, hit = stops.feed(decoder.decode(b"", final=True))
            tail += stops.flush() if hit is None else ""
            if tail:
                for event in state.emit(parser, tail):
                    yield event
        if parser is not None:
            for event in state.close(parser):
                yield event
        if state.calls and reason == "stop":
            reason = "tool_calls"
        yield Usage(output_tokens=n)
        yield Finish(reason, stop_sequence)

    def _logprob(self, step: Any, piece: bytes) -> TokenLogprob:
        tok = self.engine.tokenizer
        logprob = step.logprob if step.logprob is not None else math.nan
        top = tuple((tok.token_bytes(i).decode("utf-8", "replace"), lp) for i, lp in step.top)
        return TokenLogprob(token=piece.decode("utf-8", "replace"), logprob=logprob, id=step.token_id,
                            bytes=tuple(piece), top=top, top_ids=tuple(i for i, _ in step.top))


async def _next_step(steps: AsyncIterator[Step]) -> Step | None:
    return await anext(steps, None)


def _prompt_param(request: ChatRequest) -> str:
    """The client's name for the prompt in its dialect."""
    if request.prompt_ids is not None and request.dialect == "native":
        return "input_ids"
    return "prompt" if request.prompt is not None or request.prompt_ids is not None else "messages"


class _Calls:
    """Turns parser output into events, numbering the tool calls."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls = 0

    def emit(self, parser: HermesParser | None, text: str) -> list[Event]:
        if parser is None:
            return [TextDelta(text)]
        return self._events(parser.feed(text))

    def close(self, parser: HermesParser) -> list[Event]:
        return self._events(parser.close())

    def _events(self, outs: list[TextOut | CallOut]) -> list[Event]:
        events: list[Event] = []
        for out in outs:
            if isinstance(out, TextOut):
                if out.text:
                    events.append(TextDelta(out.text))
            else:
                index = self.calls
                self.calls += 1
                events += [ToolCallStart(index, new_call_id(), out.name),
                           ToolCallDelta(index, out.arguments), ToolCallEnd(index)]
        return events
