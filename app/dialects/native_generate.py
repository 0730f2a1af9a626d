"""The native ``POST /generate`` dialect: token ids in, token ids and logprobs out.

The request and answer follow SGLang's native ``/generate`` so RL code written
for it (multi-turn loss masks built from ``output_ids`` and
``meta_info.output_token_logprobs``) can point at poolgate:

request: one of ``text``, ``input_ids`` or ``messages`` (OpenAI chat messages,
rendered with the model's chat template, with optional ``tools``);
``sampling_params`` {``max_new_tokens`` (128), ``temperature`` (1.0; 0 is
greedy), ``top_p``, ``top_k``, ``stop``, ``stop_token_ids``, ``ignore_eos``,
``sampling_seed`` (also ``seed``)}; ``return_logprob``; ``top_logprobs_num``;
``return_text_in_logprobs``; ``stream``. poolgate adds ``model`` (default:
the first model whose worker takes token ids) and ``session_id`` (affinity).

answer: ``{"text", "output_ids", "meta_info": {"id", "finish_reason",
"prompt_tokens", "completion_tokens", "cached_tokens", "output_token_logprobs":
[[logprob, token_id, text|null], ...], "output_top_logprobs": [[[...], ...], ...]}}``.
``output_ids`` include the token that ended generation (an end-of-turn id),
as SGLang's do; ``text`` leaves special tokens out. A stream sends the same
object after each token, its ``text``, ``output_ids`` and logprobs
cumulative (SGLang's default stream), then ``data: [DONE]``.

Not supported (400 naming the parameter): a batch (a list of prompts),
prompt logprobs (``logprob_start_len`` >= 0), ``n`` > 1, constrained decoding
(``json_schema``, ``regex``, ``ebnf``).
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from pool.errors import BadRequest, GatewayError
from pool.model import (
    ChatRequest, Completion, Event, Finish, Logprobs, Message, Sampling, TextDelta, TextPart,
    TokenLogprob, Usage,
)
from pool.accumulate import merge_usage

from app.errors import openai_error_frame

from . import openai_chat
from .validate import bad_type, bad_value, first_header, opt_bool, opt_dict, opt_int, opt_number, opt_str

__all__ = ["decode", "encode_completion", "StreamEncoder", "DEFAULT_MAX_NEW_TOKENS"]

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default
_SESSION_HEADERS = ("x-session-id", "session_id", "session-id")
_UNSUPPORTED_SAMPLING = ("json_schema", "regex", "ebnf", "structural_tag")


def _unsupported(param: str, what: str) -> BadRequest:
    return BadRequest(f"'{param}' is not supported: {what}.", param=param)


def _stops(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if type(value) is str:
        return (value,) if value else ()
    if type(value) is list and all(type(v) is str for v in value):
        return tuple(v for v in value if v)
    raise bad_type("sampling_params.stop", "a string or an array of strings")


def _ids(value: object, param: str) -> tuple[int, ...]:
    if type(value) is not list or not all(type(v) is int for v in value):
        if type(value) is list and value and all(type(v) is list for v in value):
            raise _unsupported(param, "batches are not supported; send one request per prompt")
        raise bad_type(param, "an array of integers")
    return tuple(value)


def decode(body: object, headers: Mapping[str, str] | None = None,
           default_model: str | None = None) -> ChatRequest:
    """Validate a ``/generate`` body (``headers``: lower-case names)."""
    if type(body) is not dict:
        raise BadRequest("The request body must be a JSON object.")
    sources = [k for k in ("text", "input_ids", "messages") if body.get(k) is not None]
    if not sources:
        raise BadRequest("One of 'text', 'input_ids' or 'messages' is required.", param="text")
    if len(sources) > 1:
        raise BadRequest(f"Give only one of 'text', 'input_ids' and 'messages' (got "
                         f"{' and '.join(repr(s) for s in sources)}).", param=sources[1])
    model = opt_str(body, "model") or default_model
    if not model:
        raise BadRequest("No model serves /generate here: no worker takes token ids; "
                         "name one with 'model'.", param="model")
    params = opt_dict(body, "sampling_params") or {}
    for key in _UNSUPPORTED_SAMPLING:
        if params.get(key) is not None:
            raise _unsupported(f"sampling_params.{key}", "constrained decoding is not available")
    n = opt_int(params, "n", 1, None, "sampling_params.n")
    if n is not None and n > 1:
        raise _unsupported("sampling_params.n", "one sample per request; send n requests")
    start = opt_int(body, "logprob_start_len", None, None)
    if start is not None and start >= 0:
        raise _unsupported("logprob_start_len", "prompt logprobs are not available; use -1")
    max_new = opt_int(params, "max_new_tokens", 1, None, "sampling_params.max_new_tokens")
    seed = opt_int(params, "sampling_seed", None, None, "sampling_params.sampling_seed")
    if seed is None:
        seed = opt_int(params, "seed", None, None, "sampling_params.seed")
    top_k = opt_int(params, "top_k", -1, None, "sampling_params.top_k")
    stop_ids = params.get("stop_token_ids")
    sampling = Sampling(
        max_tokens=DEFAULT_MAX_NEW_TOKENS if max_new is None else max_new,
        temperature=opt_number(params, "temperature", 0, 100, "sampling_params.temperature"),
        top_p=opt_number(params, "top_p", 0, 1, "sampling_params.top_p"),
        top_k=None if top_k in (None, -1, 0) else top_k,
        stop=_stops(params.get("stop")),
        seed=seed,
        stop_token_ids=() if stop_ids is None else _ids(stop_ids, "sampling_params.stop_token_ids"),
        ignore_eos=bool(opt_bool(params, "ignore_eos", "sampling_params.ignore_eos")),
    )
    top = opt_int(body, "top_logprobs_num", 0, 20) or 0
    return_logprob = bool(opt_bool(body, "return_logprob"))
    opt_bool(body, "return_text_in_logprobs")  # validated here, read by the encoder
    messages: tuple[Message, ...] = ()
    tools: tuple[Any, ...] = ()
    prompt = prompt_ids = None
    if sources[0] == "messages":
        chat = openai_chat.decode({"model": model, "messages": body["messages"],
                                   **({"tools": body["tools"]} if body.get("tools") else {})})
        messages, tools = chat.messages, chat.tools
    elif sources[0] == "text":
        prompt = body["text"]
        if type(prompt) is not str:
            if type(prompt) is list:
                raise _unsupported("text", "batches are not supported; send one request per prompt")
            raise bad_type("text", "a string")
        if not prompt:
            raise bad_value("text", "must not be empty")
        messages = (Message("user", (TextPart(prompt),)),)
    else:
        prompt_ids = _ids(body["input_ids"], "input_ids")
        if not prompt_ids:
            raise bad_value("input_ids", "must not be empty")
    return ChatRequest(
        model=model, messages=messages, dialect="native", stream=bool(opt_bool(body, "stream")),
        tools=tools, sampling=sampling, logprobs=return_logprob,
        top_logprobs=top if return_logprob else None,
        session_id=opt_str(body, "session_id") or first_header(headers, _SESSION_HEADERS),
        raw=body, prompt=prompt, prompt_ids=prompt_ids,
    )


# --- encode ------------------------------------------------------------------------------

def _finish_json(finish: Finish | None, last_id: int | None, max_tokens: int | None) -> Any:
    if finish is None:
        return None
    if finish.reason == "length":
        return {"type": "length", "length": max_tokens}
    if finish.reason == "stop_sequence" and finish.stop_sequence is not None:
        return {"type": "stop", "matched": finish.stop_sequence}
    if finish.reason in ("stop", "tool_calls"):
        return {"type": "stop", "matched": last_id}
    return {"type": "abort", "message": finish.reason}


class _Body:
    """The answer object, built up token by token."""

    __slots__ = ("request", "response_id", "text", "ids", "logprobs", "top", "usage",
                 "with_text", "finish")

    def __init__(self, request: ChatRequest, response_id: str) -> None:
        self.request = request
        self.response_id = response_id
        self.text: list[str] = []
        self.ids: list[int] = []
        self.logprobs: list[list[Any]] = []
        self.top: list[list[list[Any]]] = []
        self.usage = Usage()
        self.with_text = bool(request.raw.get("return_text_in_logprobs"))
        self.finish: Finish | None = None

    def add_tokens(self, tokens: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> None:
        text = self.with_text
        for t in tokens:
            if t.id is None:
                continue
            self.ids.append(t.id)
            if self.request.logprobs:
                self.logprobs.append([t.logprob, t.id, t.token if text else None])
                if self.request.top_logprobs:
                    self.top.append([[lp, i, tok if text else None]
                                     for (tok, lp), i in zip(t.top, t.top_ids)])

    def json(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.response_id,
            "finish_reason": _finish_json(self.finish, self.ids[-1] if self.ids else None,
                                          self.request.sampling.max_tokens),
            "prompt_tokens": self.usage.input_tokens or 0,
            "completion_tokens": self.usage.output_tokens if self.usage.output_tokens is not None
            else len(self.ids),
            "cached_tokens": self.usage.cached_tokens or 0,
        }
        if self.request.logprobs:
            meta["output_token_logprobs"] = self.logprobs
            if self.request.top_logprobs:
                meta["output_top_logprobs"] = self.top
        return {"text": "".join(self.text), "output_ids": self.ids, "meta_info": meta}


def encode_completion(completion: Completion, request: ChatRequest, *, response_id: str,
                      created: int, model: str) -> dict[str, Any]:
    body = _Body(request, response_id)
    body.text.append(completion.text)
    body.add_tokens(completion.logprobs)
    body.usage = completion.usage
    body.finish = completion.finish
    return body.json()


class StreamEncoder:
    """Sans-IO: events in, one cumulative ``data:`` object per token, then ``[DONE]``."""

    __slots__ = ("_body", "_done", "_dirty")

    def __init__(self, request: ChatRequest, *, response_id: str, created: int, model: str) -> None:
        self._body = _Body(request, response_id)
        self._done = False
        self._dirty = False

    def feed(self, event: Event) -> bytes:
        if self._done:
            return b""
        t = type(event)
        body = self._body
        if t is TextDelta:
            body.text.append(event.text)
            self._dirty = True
        elif t is Logprobs:
            body.add_tokens(event.tokens)
            self._dirty = True
            return self._frame()  # one object per token, as the ids arrive
        elif t is Usage:
            body.usage = merge_usage(body.usage, event)
        elif t is Finish:
            body.finish = event
            self._dirty = True
        return b""

    def _frame(self) -> bytes:
        self._dirty = False
        return b"data: " + orjson.dumps(self._body.json()) + b"\n\n"

    def ping(self) -> bytes:
        return b": ping\n\n"

    def close(self) -> bytes:
        if self._done:
            return b""
        out = self._frame() if self._dirty else b""
        self._done = True
        return out + b"data: [DONE]\n\n"

    def fail(self, exc: GatewayError) -> bytes:
        if self._done:
            return b""
        self._done = True
        return openai_error_frame(exc) + b"data: [DONE]\n\n"

    def response(self) -> dict[str, Any]:
        return self._body.json()
