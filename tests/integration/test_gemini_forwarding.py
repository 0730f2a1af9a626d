"""A Gemini client on a ``dialect = "gemini"`` worker gets the upstream's own
bytes, with only ``modelVersion`` renamed to the name it asked for (an alias
included), as OpenAI→OpenAI and Anthropic→Anthropic do: a real gateway in front
of the fake Gemini upstream, read with httpx (bytes) and google-genai."""

from __future__ import annotations

import time
from typing import Iterator

import httpx
import orjson
import pytest
from google import genai
from google.genai import types

from app.factory import create_app
from app.key_settings import KeySettings
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.fakes.gemini_upstream import FakeGemini
from tests.support.server import ServerThread

UPSTREAM_KEY = "goog-upstream-secret"
MODEL, ALIAS = "gemini-fake-flash", "gemini-fast"
ADMIN_TOKEN = "admin-token-gemini-forwarding"
KEYS = ("body", "sse", "array", "err", "sdk", "u-body", "u-sse")


@pytest.fixture(scope="module")
def gw() -> Iterator[tuple[str, FakeGemini]]:
    with FakeGemini(api_key=UPSTREAM_KEY, models=(MODEL,)) as fake:
        settings = Settings(
            server=ServerSettings(keys={k: KeySettings(secret=f"sk-{k}") for k in KEYS},
                                  admin_token=ADMIN_TOKEN, ping_interval=0.2),
            workers=(WorkerSettings(name="gemini-up", dialect="gemini", url=fake.url,
                                    api_key=UPSTREAM_KEY, models=(MODEL,),
                                    aliases={ALIAS: MODEL}),))
        with ServerThread(create_app(settings)) as srv:
            yield srv.url, fake


def _post(url: str, key: str, model: str, method: str, text: str,
          query: str = "") -> httpx.Response:
    return httpx.post(f"{url}/v1beta/models/{model}:{method}{query}",
                      headers={"x-goog-api-key": f"sk-{key}"}, timeout=30,
                      json={"contents": [{"role": "user", "parts": [{"text": text}]}]})


def _renamed(raw: bytes, client: str) -> bytes:
    return raw.replace(b'"modelVersion":' + orjson.dumps(MODEL),
                       b'"modelVersion":' + orjson.dumps(client))


@pytest.mark.parametrize("model", [MODEL, ALIAS])
def test_a_body_is_the_upstreams(gw: tuple[str, FakeGemini], model: str) -> None:
    url, fake = gw
    r = _post(url, "body", model, "generateContent", "hello there")
    assert r.status_code == 200, r.text
    assert r.headers["x-poolgate-worker"] == "gemini-up"
    assert r.content == _renamed(fake.answers[-1], model)
    assert r.json()["modelVersion"] == model


@pytest.mark.parametrize("model", [MODEL, ALIAS])
def test_an_sse_stream_is_the_upstreams(gw: tuple[str, FakeGemini], model: str) -> None:
    url, fake = gw
    r = _post(url, "sse", model, "streamGenerateContent", "one two three", "?alt=sse")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    sent = fake.answers[-1]
    assert sent.count(b"\r\n\r\n") == 4  # the fake's frames, one per word
    # the same frames (line ends as \n: the same events to any SSE parser), renamed
    assert r.content == _renamed(sent.replace(b"\r\n", b"\n"), model)


def test_a_json_array_stream_stays_translated(gw: tuple[str, FakeGemini]) -> None:
    url, _ = gw
    r = _post(url, "array", ALIAS, "streamGenerateContent", "one two three")
    assert r.status_code == 200, r.text
    chunks = r.json()
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    text = "".join(p.get("text", "") for p in parts)
    assert text == "echo: one two three"
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert {c["modelVersion"] for c in chunks} == {ALIAS}


def test_an_error_mid_stream_is_googles_and_scrubbed(gw: tuple[str, FakeGemini]) -> None:
    url, fake = gw
    r = _post(url, "err", MODEL, "streamGenerateContent", "a b c d [[fail-after:2]]", "?alt=sse")
    assert r.status_code == 200
    frames = [f for f in r.content.split(b"\n\n") if f]
    upstream = [f for f in fake.answers[-1].replace(b"\r\n", b"\n").split(b"\n\n") if f]
    assert frames[:2] == upstream[:2]  # the content before it, as sent
    error = orjson.loads(frames[-1].removeprefix(b"data: "))["error"]
    assert error["status"] == "UNAVAILABLE" and error["code"] == 502  # the gateway's, as translated
    assert UPSTREAM_KEY not in r.text and len(frames) == 3


def test_the_sdk_reads_forwarded_answers(gw: tuple[str, FakeGemini]) -> None:
    url, _ = gw
    with genai.Client(api_key="sk-sdk", http_options=types.HttpOptions(
            base_url=url, api_version="v1beta")) as c:
        out = c.models.generate_content(model=ALIAS, contents="hi there")
        chunks = list(c.models.generate_content_stream(model=ALIAS, contents="one two"))
    assert out.text == "echo: hi there" and out.model_version == ALIAS
    assert out.usage_metadata.candidates_token_count > 0
    assert "".join(ch.text or "" for ch in chunks) == "echo: one two"
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.total_token_count > 0


def test_keep_alive_pings_are_blank_lines_the_sdk_skips(gw: tuple[str, FakeGemini]) -> None:
    """google-genai reads a line that is not ``data:`` as (error) JSON: a ``: ping``
    comment would break it, a blank line is skipped."""
    url, _ = gw
    r = _post(url, "sdk", MODEL, "streamGenerateContent", "one two [[sleep:0.7]]", "?alt=sse")
    assert r.status_code == 200 and b"\n\n\n" in r.content  # pinged while it waited
    assert b": ping" not in r.content
    with genai.Client(api_key="sk-sdk", http_options=types.HttpOptions(
            base_url=url, api_version="v1beta")) as c:
        chunks = list(c.models.generate_content_stream(model=MODEL,
                                                       contents="one two [[sleep:0.7]]"))
    assert "".join(ch.text or "" for ch in chunks) == "echo: one two"


@pytest.mark.parametrize("method", ["body", "sse"])
def test_usage_is_charged_as_the_upstream_reported(gw: tuple[str, FakeGemini],
                                                    method: str) -> None:
    url, fake = gw
    if method == "body":
        r = _post(url, "u-body", MODEL, "generateContent", "count these words please")
        usage = orjson.loads(fake.answers[-1])["usageMetadata"]
    else:
        r = _post(url, "u-sse", MODEL, "streamGenerateContent", "count these words please",
                  "?alt=sse")
        last = fake.answers[-1].rstrip(b"\r\n").split(b"\r\n\r\n")[-1]
        usage = orjson.loads(last.removeprefix(b"data: "))["usageMetadata"]
    assert r.status_code == 200
    assert _charged(url, f"u-{method}") == (usage["promptTokenCount"],
                                             usage["candidatesTokenCount"])


def _charged(url: str, key: str) -> tuple[int, int]:
    deadline = time.monotonic() + 10
    while True:  # a stream's record is written once it ended
        r = httpx.get(url + "/internal/usage", params={"key": key, "group_by": "key"},
                      headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
        rows = r.json()["rows"]
        if rows:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (row,) = rows
    return row["input_tokens"], row["output_tokens"]
