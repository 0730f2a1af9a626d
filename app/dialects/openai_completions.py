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

Token-id prompts (``prompt`` as a list of integers, or a list of such lists)
are served by workers that take token ids (``local``); a chat worker refuses
them with a 400 naming ``prompt``. The request also carries the prompt as
``ChatRequest.prompt`` so a local worker continues the text as it is, with no
chat template.

Not supported yet, refused with a 400 naming the parameter: ``echo``, ``suffix`` and ``best_of`` greater than 1. ``logprobs`` (0..5)
asks for that many top alternatives per token; ``text_offset`` counts
characters from the start of the completion text (as vLLM does; OpenAI counts
from the start of the prompt, which only matters with ``echo``).
"""

from __future__ import annotations

from dataclasses import replace

from typing import Any, Mapping

import orjson

from pool.accumulate import merge_usage
from pool.errors import BadRequest
from pool.model import (
    ChatRequest, Completion, Event, Finish, Logprobs, Message, Sampling, TextDelta, TextPart,
    TokenLogprob, Usage,
)

from .openai_chat_decode import token_ids
from .openai_chat_encode import ChunkStream, usage_json
from .validate import (
    bad_type, bad_value, first_header, missing, opt_bool, opt_dict, opt_int, opt_number, opt_str, req_str,
    string_list,
)

__all__ = ["decode", "decode_all", "encode_completion", "encode_completions", "StreamEncoder",
           "DEFAULT_MAX_TOKENS"]

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint
_SESSION_HEADERS = ("x-session-id", "session_id", "session-id")
_FINISH = {"stop": "stop", "stop_sequence": "stop", "length": "length",
           "tool_calls": "stop", "content_filter": "content_filter"}


# --- decode --------------------------------------------------------------------------

def _unsupported(param: str, what: str) -> BadRequest:
    return BadRequest(f"'{param}' is not supported: {what}.", param=param)


Prompt = str | tuple[int, ...]

#: prompts per request: each becomes a request of its own, run concurrently, so a
#: list is a fan-out the client controls; beyond this, send several requests
MAX_PROMPTS = 128


def _prompts(value: object) -> list[Prompt]:
    if type(value) is str:
        return [value]
    if value is None:
        raise missing("prompt")
    if type(value) is not list:
        raise bad_type("prompt", "a string or an array of strings")
    if not value:
        raise bad_value("prompt", "must not be empty")
    if len(value) > MAX_PROMPTS and type(value[0]) is not int:
        raise bad_value("prompt", f"must hold at most {MAX_PROMPTS} prompts "
                        f"(got {len(value)}); send several requests")
    if all(type(v) is str for v in value):
        return list(value)
    if all(type(v) is int for v in value):
        return [tuple(value)]
    if all(type(v) is list and v and all(type(t) is int for t in v) for v in value):
        return [tuple(v) for v in value]
    raise bad_type("prompt", "a string, an array of strings, an array of token ids or an array "
                   "of arrays of token ids")


def _with_prompt(request: ChatRequest, prompt: Prompt) -> ChatRequest:
    if type(prompt) is str:
        return replace(request, messages=(Message("user", (TextPart(prompt),)),), prompt=prompt,
                       prompt_ids=None)
    return replace(request, messages=(), prompt=None, prompt_ids=prompt)


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    if opt_bool(body, "echo"):
        raise _unsupported("echo", "echoing the prompt is not supported")
    suffix = opt_str(body, "suffix")
    if suffix:
        raise _unsupported("suffix", "insertion (a suffix after the completion) is not "
                           "supported")
    best_of = opt_int(body, "best_of", 1, 20)
    if best_of is not None and best_of > 1:
        raise _unsupported("best_of", "server-side best-of sampling is not supported")


def decode(body: object, headers: Mapping[str, str] | None = None) -> ChatRequest:
    """Validate and translate a Completions body with one prompt
    (``headers``: lower-case names)."""
    requests = decode_all(body, headers)
    if len(requests) > 1:
        raise _unsupported("prompt", "only one prompt per request is supported here; "
                           "send one request per prompt")
    return requests[0]


def decode_all(body: object, headers: Mapping[str, str] | None = None) -> list[ChatRequest]:
    """One request per prompt of a body whose ``prompt`` is a list of strings
    (the answer's choices then come in prompt order, as OpenAI's do)."""
    if type(body) is not dict:
        raise BadRequest("The request body must be a JSON object.")
    model = req_str(body, "model")
    if not model:
        raise bad_value("model", "must not be empty")
    prompts = _prompts(body.get("prompt"))
    if len(prompts) > 1 and opt_bool(body, "stream"):
        raise _unsupported("prompt", "streaming several prompts in one request is not "
                           "supported; stream one request per prompt")
    first = _decode_one(body, headers, model)
    return [_with_prompt(first, p) for p in prompts]


def _decode_one(body: dict[str, Any], headers: Mapping[str, str] | None, model: str) -> ChatRequest:
    _refuse_unsupported(body)
    top_logprobs = opt_int(body, "logprobs", 0, 5)
    stream_options = opt_dict(body, "stream_options")
    if stream_options is not None:  # validated here, read by the encoder
        opt_bool(stream_options, "include_usage", "stream_options.include_usage")
    max_tokens = opt_int(body, "max_tokens", 1)
    top_k = opt_int(body, "top_k", -1)
    sampling = Sampling(
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        temperature=opt_number(body, "temperature", 0, 2),
        top_p=opt_number(body, "top_p", 0, 1),
        stop=string_list(body.get("stop"), "stop"),
        seed=opt_int(body, "seed"),
        n=opt_int(body, "n", 1, 128) or 1,
        top_k=top_k if top_k is not None and top_k > 0 else None,  # vLLM's extensions
        stop_token_ids=token_ids(body, "stop_token_ids"),
        ignore_eos=bool(opt_bool(body, "ignore_eos")),
    )
    return ChatRequest(
        model=model,
        messages=(),
        dialect="openai_completions",
        stream=bool(opt_bool(body, "stream")),
        sampling=sampling,
        logprobs=top_logprobs is not None,
        top_logprobs=top_logprobs,
        user=opt_str(body, "user"),
        session_id=first_header(headers, _SESSION_HEADERS),
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
    return encode_completions([completion], request, response_id=response_id, created=created,
                              model=model)


def encode_completions(completions: list[Completion], request: ChatRequest, *,
                       response_id: str, created: int, model: str) -> dict[str, Any]:
    """One body for several prompts: a choice per prompt, in order; usage summed."""
    usage = Usage(*(sum(getattr(c.usage, f) or 0 for c in completions)
                    for f in ("input_tokens", "output_tokens", "cached_tokens",
                              "cache_creation_tokens", "reasoning_tokens")))
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{
            "text": completion.text,
            "index": index,
            "logprobs": _logprobs_json(completion.logprobs) if request.logprobs else None,
            "finish_reason": _finish_reason(completion.finish),
        } for index, completion in enumerate(completions)],
        "usage": usage_json(usage),
    }


class StreamEncoder(ChunkStream):
    """Sans-IO: canonical events in, ``text_completion`` SSE chunks out, then
    ``data: [DONE]``."""

    __slots__ = ("_offset",)

    def __init__(self, request: ChatRequest, *, response_id: str, created: int,
                 model: str) -> None:
        super().__init__(request, response_id=response_id, created=created, model=model,
                         object_name=b"text_completion", choice_head=b',"choices":[{"text":')
        self._offset = 0  # characters of completion text covered by logprobs so far

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
