"""The legacy OpenAI Completions dialect (``POST /v1/completions``).

Pure and sans-IO, like :mod:`app.dialects.openai_chat`: :func:`decode` turns
the body into a :class:`ChatRequest`, :func:`encode_completion` and
:class:`StreamEncoder` render ``text_completion`` objects.

The canonical request is chat-shaped, so the prompt becomes one ``user``
message holding the prompt text. A remote chat worker therefore answers a
completion prompt *as a chat turn* (the model replies to the prompt rather
than continuing it): that is the documented behaviour for chat workers. Raw
continuation needs a worker that takes a prompt or token ids, which the
``local`` workers bring.

Not supported yet, refused with a 400 naming the parameter: token-id prompts
(``prompt`` as a list of integers or of lists), more than one prompt,
``echo``, ``suffix`` and ``best_of`` greater than 1. ``logprobs`` (0..5)
asks for that many top alternatives per token; ``text_offset`` counts
characters from the start of the completion text (as vLLM does; OpenAI counts
from the start of the prompt, which only matters with ``echo``).
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from app.errors import openai_error_frame
from pool.accumulate import merge_usage
from pool.errors import BadRequest, GatewayError
from pool.model import (
    ChatRequest, Completion, Event, Finish, Logprobs, Message, Sampling, TextDelta, TextPart,
    TokenLogprob, Usage,
)

from .openai_chat_encode import usage_json

__all__ = ["decode", "encode_completion", "StreamEncoder", "DEFAULT_MAX_TOKENS"]

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint
_NUMBER = (int, float)
_SESSION_HEADERS = ("x-session-id", "session_id", "session-id")
_FINISH = {"stop": "stop", "stop_sequence": "stop", "length": "length",
           "tool_calls": "stop", "content_filter": "content_filter"}
_DONE = b"data: [DONE]\n\n"
_PING = b": ping\n\n"


# --- decode --------------------------------------------------------------------------

def _bad_type(param: str, expected: str) -> BadRequest:
    return BadRequest(f"Invalid type for '{param}': expected {expected}.", param=param)


def _bad_value(param: str, why: str) -> BadRequest:
    return BadRequest(f"Invalid value for '{param}': {why}.", param=param)


def _unsupported(param: str, what: str) -> BadRequest:
    return BadRequest(f"'{param}' is not supported: {what}.", param=param)


def _opt_int(obj: Mapping[str, Any], key: str, low: int | None = None,
             high: int | None = None, param: str | None = None) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    param = param or key
    if type(value) is not int:
        if type(value) is float and value.is_integer():  # 5.0 for 5
            value = int(value)
        else:
            raise _bad_type(param, "an integer")
    if (low is not None and value < low) or (high is not None and value > high):
        raise _bad_value(param, f"must be at least {low}" if high is None
                         else f"must be between {low} and {high}")
    return value


def _opt_number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) not in _NUMBER:
        raise _bad_type(key, "a number")
    if not low <= value <= high:
        raise _bad_value(key, f"must be between {low:g} and {high:g}")
    return value


def _opt_bool(obj: Mapping[str, Any], key: str, param: str | None = None) -> bool | None:
    value = obj.get(key)
    if value is None or type(value) is bool:
        return value
    raise _bad_type(param or key, "a boolean")


def _opt_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or type(value) is str:
        return value
    raise _bad_type(key, "a string")


def _prompt(value: object) -> str:
    if type(value) is str:
        return value
    if value is None:
        raise BadRequest("Missing required parameter: 'prompt'.", param="prompt")
    if type(value) is not list:
        raise _bad_type("prompt", "a string or an array of strings")
    if not value:
        raise _bad_value("prompt", "must not be empty")
    if all(type(v) is str for v in value):
        if len(value) > 1:
            raise _unsupported("prompt", "only one prompt per request is supported for now; "
                               "send one request per prompt")
        return value[0]
    if all(type(v) is int or (type(v) is list and all(type(t) is int for t in v))
           for v in value):
        raise _unsupported("prompt", "token id prompts need a worker that accepts token ids")
    raise _bad_type("prompt", "a string or an array of strings")


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if type(value) is str:
        return (value,)
    if type(value) is list:
        for k, s in enumerate(value):
            if type(s) is not str:
                raise _bad_type(f"stop[{k}]", "a string")
        return tuple(value)
    raise _bad_type("stop", "a string or an array of strings")


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    if _opt_bool(body, "echo"):
        raise _unsupported("echo", "echoing the prompt is not supported")
    suffix = _opt_str(body, "suffix")
    if suffix:
        raise _unsupported("suffix", "insertion (a suffix after the completion) is not "
                           "supported")
    best_of = _opt_int(body, "best_of", 1, 20)
    if best_of is not None and best_of > 1:
        raise _unsupported("best_of", "server-side best-of sampling is not supported")


def decode(body: object, headers: Mapping[str, str] | None = None) -> ChatRequest:
    """Validate and translate a Completions body (``headers``: lower-case names)."""
    if type(body) is not dict:
        raise BadRequest("The request body must be a JSON object.")
    model = body.get("model")
    if type(model) is not str:
        if model is None:
            raise BadRequest("Missing required parameter: 'model'.", param="model")
        raise _bad_type("model", "a string")
    if not model:
        raise _bad_value("model", "must not be empty")
    prompt = _prompt(body.get("prompt"))
    _refuse_unsupported(body)
    top_logprobs = _opt_int(body, "logprobs", 0, 5)
    stream_options = body.get("stream_options")
    if stream_options is not None:  # validated here, read by the encoder
        if type(stream_options) is not dict:
            raise _bad_type("stream_options", "an object")
        _opt_bool(stream_options, "include_usage", "stream_options.include_usage")
    max_tokens = _opt_int(body, "max_tokens", 1)
    sampling = Sampling(
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        temperature=_opt_number(body, "temperature", 0, 2),
        top_p=_opt_number(body, "top_p", 0, 1),
        stop=_stop(body.get("stop")),
        seed=_opt_int(body, "seed"),
        n=_opt_int(body, "n", 1, 128) or 1,
    )
    session_id = None
    if headers:
        for name in _SESSION_HEADERS:
            session_id = headers.get(name)
            if session_id:
                break
    return ChatRequest(
        model=model,
        messages=(Message("user", (TextPart(prompt),)),),
        dialect="openai_completions",
        stream=bool(_opt_bool(body, "stream")),
        sampling=sampling,
        logprobs=top_logprobs is not None,
        top_logprobs=top_logprobs,
        user=_opt_str(body, "user"),
        session_id=session_id or None,
        raw=body,
    )


# --- encode --------------------------------------------------------------------------

def _finish_reason(finish: Finish | None) -> str:
    return _FINISH.get(finish.reason, "stop") if finish is not None else "stop"


def _logprobs_json(tokens: list[TokenLogprob] | tuple[TokenLogprob, ...],
                   offset: int = 0) -> dict[str, Any]:
    """The legacy shape: parallel lists, one top-alternatives dict per token."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return {"tokens": [t.token for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [dict(t.top) for t in tokens],
            "text_offset": offsets}


def encode_completion(completion: Completion, request: ChatRequest, *, response_id: str,
                      created: int, model: str) -> dict[str, Any]:
    """The non-streaming ``text_completion`` body."""
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{
            "text": completion.text,
            "index": 0,
            "logprobs": _logprobs_json(completion.logprobs) if request.logprobs else None,
            "finish_reason": _finish_reason(completion.finish),
        }],
        "usage": usage_json(completion.usage),
    }


class StreamEncoder:
    """Sans-IO: canonical events in, ``text_completion`` SSE chunks out, then
    ``data: [DONE]``."""

    __slots__ = ("_head", "_usage_head", "_include_usage", "_logprobs", "_offset", "_finished",
                 "_done", "_usage")

    def __init__(self, request: ChatRequest, *, response_id: str, created: int,
                 model: str) -> None:
        common = (b'data: {"id":' + orjson.dumps(response_id)
                  + b',"object":"text_completion","created":' + orjson.dumps(created)
                  + b',"model":' + orjson.dumps(model))
        self._head = common + b',"choices":[{"text":'
        self._usage_head = common + b',"choices":[],"usage":'
        options = request.raw.get("stream_options")
        self._include_usage = type(options) is dict and options.get("include_usage") is True
        self._logprobs = request.logprobs
        self._offset = 0  # characters of completion text covered by logprobs so far
        self._finished = False
        self._done = False
        self._usage = Usage()

    def feed(self, event: Event) -> bytes:
        if self._done:
            return b""
        t = type(event)
        if t is TextDelta:
            return (self._head + orjson.dumps(event.text)
                    + b',"index":0,"logprobs":null,"finish_reason":null}]}\n\n')
        if t is Usage:
            self._usage = merge_usage(self._usage, event)
            return b""
        if t is Logprobs:
            if not self._logprobs or not event.tokens:
                return b""
            logprobs = _logprobs_json(event.tokens, self._offset)
            self._offset += sum(len(tok.token) for tok in event.tokens)
            return (self._head + b'"","index":0,"logprobs":' + orjson.dumps(logprobs)
                    + b',"finish_reason":null}]}\n\n')
        if t is Finish:
            return self._finish(event)
        return b""  # Start, reasoning and tool calls have no place in this dialect

    def _finish(self, finish: Finish | None) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        return (self._head + b'"","index":0,"logprobs":null,"finish_reason":"'
                + _finish_reason(finish).encode() + b'"}]}\n\n')

    def ping(self) -> bytes:
        return _PING

    def close(self) -> bytes:
        if self._done:
            return b""
        out = self._finish(None)
        if self._include_usage:
            out += self._usage_head + orjson.dumps(usage_json(self._usage)) + b"}\n\n"
        self._done = True
        return out + _DONE

    def fail(self, exc: GatewayError) -> bytes:
        if self._done:
            return b""
        self._done = True
        return openai_error_frame(exc) + _DONE
