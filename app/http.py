"""Small HTTP helpers shared by the routes: body reading, JSON and error responses."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from pool.errors import BadRequest, GatewayError, PayloadTooLarge

from .errors import error_body, error_headers, error_status

__all__ = ["read_json", "json_response", "error_response", "new_id", "random_hex", "now",
           "dialect_of_path"]


_JSON_TYPE = (b"content-type", b"application/json")


class JSONBytesResponse(Response):
    """Starlette's response with the headers it would make (the given ones,
    then content-length and content-type), built without its general path."""

    media_type = "application/json"

    def __init__(self, content: Any, status_code: int = 200,
                 headers: dict[str, str] | None = None) -> None:
        self.status_code = status_code
        self.background = None
        self.body = body = orjson.dumps(content)
        length = (b"content-length", str(len(body)).encode())
        if not headers:
            self.raw_headers = [length, _JSON_TYPE]
            return
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        names = {name for name, _ in raw}
        if b"content-length" not in names:
            raw.append(length)
        if b"content-type" not in names:
            raw.append(_JSON_TYPE)
        self.raw_headers = raw


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return JSONBytesResponse(content, status_code=status, headers=headers)


def error_response(exc: GatewayError, dialect: str, headers: dict[str, str] | None = None) -> Response:
    extra = error_headers(exc)
    if headers:
        extra.update(headers)
    return JSONBytesResponse(error_body(exc, dialect), status_code=error_status(exc, dialect),
                             headers=extra)


async def read_json(request: Request, limit: int) -> Any:
    """The parsed JSON body, or a :class:`BadRequest` / :class:`PayloadTooLarge`.

    Reads the ASGI messages itself rather than through ``request.stream()``
    (an async generator per request, on the hot path); it consumes the body,
    so call it once, instead of ``request.body()``.
    """
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            continue
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(
                    f"The request body is larger than the limit of {limit} bytes.")
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if not chunks:
        raise BadRequest("The request body is empty; send a JSON object.")
    raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}.") from None


class _Entropy(threading.local):
    """Hex digits from the OS's CSPRNG, fetched 4 KiB at a time: one ``getrandom``
    call per ~128 ids (one per id cost ~7 us of CPU per request in bench.inproc).
    Per thread (servers of tests share a process), and dropped in a forked child
    so two processes never hand out the same digits."""

    digits = ""
    at = 0


_entropy = _Entropy()
os.register_at_fork(after_in_child=lambda: _entropy.__dict__.clear())


def random_hex(chars: int) -> str:
    """``chars`` hex digits no earlier output tells (``random``'s Mersenne Twister would,
    from 624 outputs, and ``random.seed`` anywhere would repeat them)."""
    entropy = _entropy
    at = entropy.at
    end = at + chars
    if end > len(entropy.digits):
        entropy.digits, at, end = os.urandom(4096).hex(), 0, chars
    entropy.at = end
    return entropy.digits[at:end]


def new_id(prefix: str) -> str:
    """A response id: 96 bits from the CSPRNG."""
    return prefix + random_hex(24)


def now() -> int:
    return int(time.time())


def dialect_of_path(path: str, headers_have_anthropic_version: bool = False) -> str:
    """The error dialect for a path: Anthropic for ``/v1/messages*`` (and for
    ``/v1/models`` asked with ``anthropic-version``), OpenAI otherwise."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if headers_have_anthropic_version and path.startswith("/v1/models"):
        return "anthropic"
    return "openai"
