"""What an open stream does not hold (issue 14: memory per open stream): the
decoded request (a whole conversation, with its parsed body) and the client's
request headers, once the stream has started; forwarded and translated
streams alike. A real gateway in this process (so its objects can be
looked for) in front of the fake upstreams; the stream hangs open upstream
while the test looks."""

from __future__ import annotations

import gc
import time
import types
import uuid
from typing import Any, Iterator

import httpx
import pytest

from app.factory import create_app
from pool.model import ChatRequest
from tests.support.server import ServerThread

from .conftest import ANTHROPIC_MODEL, CLIENT_KEY, OPENAI_MODEL, gateway_settings

HEADERS = {"authorization": f"Bearer {CLIENT_KEY}", "anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def served(fake_upstream) -> Iterator[ServerThread]:
    # a stream's headers wait 0.2 s for its first event: a slower upstream
    # begins the stream with the first event still pending
    with ServerThread(create_app(gateway_settings(fake_upstream, stream_grace=0.2)),
                      http="uvicorn") as srv:
        yield srv


def _holding(marker: str, *theirs: Any) -> list[str]:
    """The live objects that hold ``marker`` (decoded requests; parsed bodies:
    dicts whose messages quote it; dicts of the request's headers, which carry
    it in ``x-client-note``), but for ``theirs`` (the client's own, what the
    fake upstream received: it runs in this process too)."""
    gc.collect()
    skip = {id(o) for o in theirs}
    note = {f"note-{marker}", f"note-{marker}".encode()}
    found = []
    for obj in gc.get_objects():
        if type(obj) is ChatRequest and marker in repr(obj.messages):
            found.append("ChatRequest")
        # exact types: isinstance() would read __class__ of every live object, and
        # some (torch's deprecated module attributes) warn when touched
        kind = type(obj)
        frame = (obj.cr_frame if kind is types.CoroutineType
                 else obj.ag_frame if kind is types.AsyncGeneratorType else None)
        if frame is not None:  # a dict of bytes only is not tracked by gc: look in frames
            held = [v for v in frame.f_locals.values() if type(v) is dict and id(v) not in skip]
            if any(w in note for v in held for w in v.values() if type(w) in (str, bytes)):
                found.append(f"request headers in {obj.__qualname__}")
        if type(obj) is not dict or id(obj) in skip:
            continue
        if "messages" in obj and marker in repr(obj["messages"]):
            found.append("parsed body")
        elif any(type(v) in (str, bytes) and v in note for v in obj.values()):
            found.append("request headers")
    return found


def _request_headers(srv: ServerThread) -> list[Any]:
    """The request headers each open connection's protocol holds."""
    return [list(p.headers or ()) for p in list(srv.server.server_state.connections)]


@pytest.mark.parametrize(("path", "model", "slow"), [
    ("/v1/chat/completions", OPENAI_MODEL, False),
    ("/v1/messages", ANTHROPIC_MODEL, False),
    ("/v1/chat/completions", OPENAI_MODEL, True),   # the first frame after the headers
    ("/v1/messages", OPENAI_MODEL, False),
], ids=["forwarded", "forwarded-anthropic", "forwarded-slow-start", "translated"])
def test_an_open_stream_holds_neither_the_request_nor_its_headers(
        served: ServerThread, fake_upstream, path: str, model: str, slow: bool) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    # the frames up to the marker (Anthropic: message_start, ping, content_block_start,
    # "echo: ", the marker), then the upstream hangs until the gateway leaves
    frames = 5 if model == ANTHROPIC_MODEL else 3
    text = ("[[sleep:0.5]]" if slow else "") + f"[[hang-after:{frames}]] {marker} "
    text += "a long conversation " * 50
    body = {"model": model, "stream": True, "max_tokens": 100,
            "messages": [{"role": "user", "content": text},
                         {"role": "assistant", "content": "noted " + marker},
                         {"role": "user", "content": text}]}
    headers = {**HEADERS, "x-client-note": f"note-{marker}"}
    with httpx.Client(base_url=served.url, timeout=30) as client:
        with client.stream("POST", path, json=body, headers=headers) as r:
            assert r.status_code == 200
            got = b""
            chunks = r.iter_raw()  # not left (that would close the stream) until the end
            while b"marker-" not in got:
                got += next(chunks)
            # the stream is open and waiting upstream now
            received = [r.body for r in fake_upstream.requests]
            assert _holding(marker, body, headers, *received) == []
            held = _request_headers(served)
            assert held and all(h == [] for h in held)
    # the client left: the stream ends (its connection closes), nothing of it stays
    deadline = time.monotonic() + 10
    while served.server.server_state.connections:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert _holding(marker, body, headers, *[r.body for r in fake_upstream.requests]) == []
