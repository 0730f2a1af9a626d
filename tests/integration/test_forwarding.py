"""Same-dialect answers go to the client as the upstream's bytes, but for the
model name (the name the client asked for, an alias included): a real gateway
in front of the fake upstreams, read with httpx (bytes) and the real SDKs."""

from __future__ import annotations

import time
from typing import Any, Iterator

import anthropic
import httpx
import openai
import orjson
import pytest

from app.dialects import anthropic_messages as anthropic_dialect
from app.dialects import openai_chat as openai_dialect
from app.factory import create_app
from app.key_settings import KeySettings
from app.settings import ServerSettings, Settings, WorkerSettings
from pool.accumulate import Accumulator
from pool.remote import anthropic_messages, openai_chat
from pool.sse import SSEDecoder
from pool.tokens import estimate_tokens
from tests.fakes.upstreams import FakeUpstream
from tests.support.server import ServerThread

from .conftest import ADMIN_TOKEN, ANTHROPIC_MODEL, OPENAI_MODEL, UPSTREAM_KEY

KEYS = ("body", "stream", "astream", "abody", "sdk", "err",
        *(f"u-{d}-{s}" for d in ("openai", "anthropic") for s in (False, True)),
        *(f"{case}-{d}" for case in ("nostream", "cut") for d in ("openai", "anthropic")))
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
VERSION = {"anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def gw(fake_upstream: FakeUpstream) -> Iterator[tuple[str, FakeUpstream]]:
    settings = Settings(
        server=ServerSettings(keys={k: KeySettings(secret=f"sk-{k}") for k in KEYS},
                              admin_token=ADMIN_TOKEN),
        workers=(WorkerSettings(name="openai-up", dialect="openai", url=fake_upstream.url,
                                api_key=UPSTREAM_KEY, models=(OPENAI_MODEL,),
                                aliases={"fast": OPENAI_MODEL}),
                 WorkerSettings(name="anthropic-up", dialect="anthropic",
                                url=fake_upstream.anthropic_url, api_key=UPSTREAM_KEY,
                                models=(ANTHROPIC_MODEL,),
                                aliases={"claude-fast": ANTHROPIC_MODEL})))
    with ServerThread(create_app(settings)) as srv:
        yield srv.url, fake_upstream


def _renamed(raw: bytes, upstream: str, client: str) -> bytes:
    return raw.replace(b'"model":' + orjson.dumps(upstream), b'"model":' + orjson.dumps(client))


def _frames(raw: bytes) -> list[bytes]:
    return [f + b"\n\n" for f in raw.split(b"\n\n") if f]


def _post(url: str, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer sk-{key}", **VERSION}
    return httpx.post(url + path, json=body, headers=headers, timeout=30)


def _canonical_usage(raw: bytes, dialect: str, stream: bool) -> tuple[int, int, int]:
    """What the canonical (translating) path charges for these upstream bytes."""
    module = openai_chat if dialect == "openai" else anthropic_messages
    acc = Accumulator()
    if stream:
        parser = module.StreamParser()
        for frame in SSEDecoder().feed(raw):
            for event in parser.feed(frame.data):
                acc.feed(event)
    else:
        for event in module.body_events(orjson.loads(raw)):
            acc.feed(event)
    usage = acc.finish().usage
    return usage.input_tokens or 0, usage.output_tokens or 0, usage.cached_tokens or 0


@pytest.mark.parametrize("model", [OPENAI_MODEL, "fast"])
def test_openai_body_is_the_upstreams(gw: tuple[str, FakeUpstream], model: str) -> None:
    url, fake = gw
    r = _post(url, "/v1/chat/completions", "body", {
        "model": model, "messages": [{"role": "user", "content": "[[think]] one two three"}]})
    assert r.status_code == 200, r.text
    assert r.headers["x-poolgate-worker"] == "openai-up" and r.headers["x-request-id"]
    assert r.headers["content-type"] == "application/json"
    sent = fake.answers[-1]
    assert b'"model":"gpt-4o-mini"' in sent
    assert r.content == _renamed(sent, OPENAI_MODEL, model)


@pytest.mark.parametrize("model", [ANTHROPIC_MODEL, "claude-fast"])
def test_anthropic_body_is_the_upstreams(gw: tuple[str, FakeUpstream], model: str) -> None:
    url, fake = gw
    r = _post(url, "/v1/messages", "abody", {
        "model": model, "max_tokens": 50,
        "messages": [{"role": "user", "content": "[[tool:lookup {\"q\": 1}]] find it"}],
        "tools": [{"name": "lookup", "input_schema": {"type": "object"}}]})
    assert r.status_code == 200, r.text
    assert r.headers["x-poolgate-worker"] == "anthropic-up"
    sent = fake.answers[-1]
    assert r.content == _renamed(sent, ANTHROPIC_MODEL, model)
    assert r.json()["model"] == model


@pytest.mark.parametrize("usage", [True, False], ids=["usage-asked", "usage-not-asked"])
def test_openai_stream_is_the_upstreams(gw: tuple[str, FakeUpstream], usage: bool) -> None:
    url, fake = gw
    body: dict[str, Any] = {"model": "fast", "stream": True,
                            "messages": [{"role": "user", "content": "alpha beta gamma delta"}]}
    if usage:
        body["stream_options"] = {"include_usage": True}
    r = _post(url, "/v1/chat/completions", "stream", body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-poolgate-worker"] == "openai-up"
    sent = _renamed(fake.answers[-1], OPENAI_MODEL, "fast")
    usage_frames = [f for f in _frames(sent) if b'"choices":[]' in f]
    assert len(usage_frames) == 1  # poolgate asked for it either way
    if usage:
        assert r.content == sent
    else:  # asked for on the client's behalf: not forwarded
        assert r.content == sent.replace(usage_frames[0], b"")
        assert b'"choices":[]' not in r.content


@pytest.mark.parametrize("model", [ANTHROPIC_MODEL, "claude-fast"])
def test_anthropic_stream_is_the_upstreams(gw: tuple[str, FakeUpstream], model: str) -> None:
    url, fake = gw
    r = _post(url, "/v1/messages", "astream", {
        "model": model, "max_tokens": 50, "stream": True,
        "messages": [{"role": "user", "content": "[[think]] one two three four"}]})
    assert r.status_code == 200, r.text
    sent = fake.answers[-1]
    assert r.content == _renamed(sent, ANTHROPIC_MODEL, model)
    # the model is in message_start only, and rewritten there
    assert r.content.count(b'"model":') == 1


def test_sdks_see_the_alias_and_usage(gw: tuple[str, FakeUpstream]) -> None:
    url, _ = gw
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-sdk", max_retries=0) as client:
        chunks = list(client.chat.completions.create(
            model="fast", stream=True, messages=[{"role": "user", "content": "a b c"}]))
        assert {c.model for c in chunks} == {"fast"}
        assert all(c.usage is None for c in chunks)  # the client did not ask for it
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        with_usage = list(client.chat.completions.create(
            model="fast", stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "a b c"}]))
        assert with_usage[-1].choices == [] and with_usage[-1].usage.completion_tokens > 0
    with anthropic.Anthropic(base_url=url, api_key="sk-sdk", max_retries=0) as client:
        with client.messages.stream(model="claude-fast", max_tokens=50,
                                    messages=[{"role": "user", "content": "x y z"}]) as stream:
            final = stream.get_final_message()
        assert final.model == "claude-fast" and final.usage.output_tokens > 0
        assert final.content[0].text


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_charged_usage_equals_the_canonical_paths(gw: tuple[str, FakeUpstream], dialect: str,
                                                  stream: bool) -> None:
    url, fake = gw
    key = f"u-{dialect}-{stream}"  # each case charges its own key
    # cache_control: the Anthropic fake reports cache reads and writes
    text = [{"type": "text", "text": "count these words please",
             "cache_control": {"type": "ephemeral"}}]
    if dialect == "openai":
        r = _post(url, "/v1/chat/completions", key, {
            "model": OPENAI_MODEL, "stream": stream, "prompt_cache_key": "p1",
            "messages": [{"role": "user", "content": "count these words please"}]})
    else:
        r = _post(url, "/v1/messages", key, {
            "model": ANTHROPIC_MODEL, "stream": stream, "max_tokens": 50,
            "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    expected = _canonical_usage(fake.answers[-1], dialect, stream)
    assert expected[0] > 0 and expected[1] > 0 and expected[2] > 0
    assert _charged(url, key) == expected


def _charged(url: str, key: str) -> tuple[int, int, int]:
    deadline = time.monotonic() + 10
    while True:  # a stream's record is written once it ended
        r = httpx.get(url + "/internal/usage", params={"key": key, "group_by": "key"},
                      headers=ADMIN, timeout=30)
        rows = r.json()["rows"]
        if rows:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (row,) = rows
    return row["input_tokens"], row["output_tokens"], row["cached_tokens"]


def test_openai_error_mid_stream(gw: tuple[str, FakeUpstream]) -> None:
    url, fake = gw
    r = _post(url, "/v1/chat/completions", "err", {
        "model": "fast", "stream": True,
        "messages": [{"role": "user", "content": "[[fail-after:3]] one two three four five"}]})
    assert r.status_code == 200
    sent = _frames(_renamed(fake.answers[-1], OPENAI_MODEL, "fast"))
    assert UPSTREAM_KEY.encode() in sent[-1]  # the fake's error frame quotes the key
    head = b"".join(sent[:3])
    assert r.content.startswith(head)
    tail = _frames(r.content[len(head):])
    assert tail[-1] == b"data: [DONE]\n\n" and len(tail) == 2
    error = orjson.loads(tail[0].removeprefix(b"data: "))["error"]
    assert error["type"] == "rate_limit_error" and "overloaded right now" in error["message"]
    assert UPSTREAM_KEY not in r.text and "sk-" not in error["message"]
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-err", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="fast", stream=True,
            messages=[{"role": "user", "content": "[[fail-after:3]] one two three"}])
        with pytest.raises(openai.APIError):
            list(stream)


def test_anthropic_error_mid_stream(gw: tuple[str, FakeUpstream]) -> None:
    url, fake = gw
    r = _post(url, "/v1/messages", "err", {
        "model": "claude-fast", "max_tokens": 50, "stream": True,
        "messages": [{"role": "user", "content": "[[fail-after:4]] one two three four"}]})
    assert r.status_code == 200
    sent = _frames(_renamed(fake.answers[-1], ANTHROPIC_MODEL, "claude-fast"))
    head = b"".join(sent[:4])
    assert r.content.startswith(head)
    (tail,) = _frames(r.content[len(head):])
    assert tail.startswith(b"event: error\ndata: ")
    error = orjson.loads(tail.split(b"data: ", 1)[1])
    assert error["type"] == "error" and error["error"]["type"] == "overloaded_error"
    assert UPSTREAM_KEY not in r.text
    with anthropic.Anthropic(base_url=url, api_key="sk-err", max_retries=0) as client:
        with pytest.raises(anthropic.APIStatusError):
            with client.messages.stream(
                    model="claude-fast", max_tokens=50,
                    messages=[{"role": "user", "content": "[[fail-after:4]] one two"}]) as s:
                s.get_final_message()


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_stream_answered_with_a_body_is_encoded(gw: tuple[str, FakeUpstream],
                                                  dialect: str) -> None:
    """An upstream that answers a stream request with its JSON body (as some
    servers do): the forwarded path builds the dialect's encoder then, and the
    client gets the dialect's stream of that body, charged its usage."""
    url, fake = gw
    key = f"nostream-{dialect}"
    words = "[[no-stream]] one two three four"
    if dialect == "openai":
        with openai.OpenAI(base_url=url + "/v1", api_key=f"sk-{key}", max_retries=0) as client:
            chunks = list(client.chat.completions.create(
                model="fast", stream=True, stream_options={"include_usage": True},
                messages=[{"role": "user", "content": words}]))
        answer = orjson.loads(fake.answers[-1])
        assert answer["object"] == "chat.completion"  # a body, not frames
        assert {c.model for c in chunks} == {"fast"}
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == answer["choices"][0]["message"]["content"]
        assert chunks[-1].usage.completion_tokens == answer["usage"]["completion_tokens"]
    else:
        with anthropic.Anthropic(base_url=url, api_key=f"sk-{key}", max_retries=0) as client:
            with client.messages.stream(model="claude-fast", max_tokens=50,
                                        messages=[{"role": "user", "content": words}]) as s:
                events = [event.type for event in s]
                final = s.get_final_message()
        answer = orjson.loads(fake.answers[-1])
        assert answer["type"] == "message"  # a body, not frames
        assert events[0] == "message_start" and "content_block_delta" in events
        assert final.model == "claude-fast"
        assert final.content[0].text == answer["content"][0]["text"]
        assert final.usage.output_tokens == answer["usage"]["output_tokens"]
    assert fake.requests[-1].body["stream"] is True
    assert "four" in text if dialect == "openai" else "four" in final.content[0].text
    assert _charged(url, key) == _canonical_usage(fake.answers[-1], dialect, False)


@pytest.mark.parametrize("client", ["openai", "anthropic"],
                         ids=["forwarded", "translated"])
def test_a_cut_stream_is_charged_what_it_used(gw: tuple[str, FakeUpstream],
                                              client: str) -> None:
    """A stream the client leaves before the upstream reported usage (OpenAI
    reports it last) is charged the content it was sent, and the estimate of
    the request's input: forwarded (OpenAI client) and translated (Anthropic
    client) alike, though the gateway no longer holds the request by then."""
    url, fake = gw
    key = f"cut-{client}"
    words = "[[hang-after:4]] one two three four five six"
    if client == "openai":
        path, body = "/v1/chat/completions", {
            "model": "fast", "stream": True, "messages": [{"role": "user", "content": words}]}
        estimate = estimate_tokens(openai_dialect.decode(body, {}))
    else:
        path, body = "/v1/messages", {
            "model": "fast", "stream": True, "max_tokens": 50,
            "system": "Answer in words.", "messages": [{"role": "user", "content": words}]}
        estimate = estimate_tokens(anthropic_dialect.decode(body, VERSION))
    before = fake.disconnects
    headers = {"authorization": f"Bearer sk-{key}", **VERSION}
    got = b""
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():  # the upstream's four frames: a role, then three words
            got += chunk
            if b'"two ' in got and got.endswith(b"\n\n"):
                break
    deadline = time.monotonic() + 10
    while fake.disconnects == before:  # the gateway dropped the upstream when the client left
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert b'"one ' in got and b'"three' not in got
    # the content sent, forwarded or translated: "echo: ", "one ", "two " (not the Start)
    assert _charged(url, key) == (estimate, 3, 0)
