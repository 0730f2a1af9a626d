"""Every kind of error reaches each SDK as its own exception class, in its dialect,
and nothing leaks: no slot held, no upstream request left running."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import openai
import pytest

from .conftest import ANTHROPIC_MODEL, CLIENT_KEY, OPENAI_MODEL, SLOW_MODEL, UPSTREAM_KEY


@pytest.fixture
def oai(gateway):
    with openai.OpenAI(base_url=gateway.openai_base, api_key=CLIENT_KEY, max_retries=0) as c:
        yield c


@pytest.fixture
def ant(gateway):
    with anthropic.Anthropic(base_url=gateway.url, api_key=CLIENT_KEY, max_retries=0) as c:
        yield c


@pytest.fixture
def http(gateway):
    with httpx.Client(base_url=gateway.url, timeout=30) as c:
        yield c


@pytest.fixture(autouse=True)
def _no_slot_leaks(gateway):
    yield
    # every path releases its in-flight slot
    end = time.monotonic() + 5
    while any(gateway.state.pool.in_flight.values()) and time.monotonic() < end:
        time.sleep(0.01)
    assert not any(gateway.state.pool.in_flight.values()), gateway.state.pool.in_flight


USER = [{"role": "user", "content": "hi"}]


# --- auth ------------------------------------------------------------------------------

def test_missing_and_wrong_key(gateway):
    with openai.OpenAI(base_url=gateway.openai_base, api_key="sk-wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError) as err:
            c.chat.completions.create(model=OPENAI_MODEL, messages=USER)
    assert err.value.status_code == 401
    with anthropic.Anthropic(base_url=gateway.url, api_key="sk-wrong", max_retries=0) as c:
        with pytest.raises(anthropic.AuthenticationError) as aerr:
            c.messages.create(model=ANTHROPIC_MODEL, max_tokens=8, messages=USER)
    assert aerr.value.body["type"] == "error"
    assert aerr.value.body["error"]["type"] == "authentication_error"


def test_x_api_key_and_bearer_both_accepted(http):
    body = {"model": ANTHROPIC_MODEL, "max_tokens": 8, "messages": USER}
    assert http.post("/v1/messages", json=body, headers={"x-api-key": CLIENT_KEY}).status_code == 200
    assert http.post("/v1/messages?beta=true", json=body,
                     headers={"authorization": f"Bearer {CLIENT_KEY}"}).status_code == 200
    assert http.post("/v1/messages", json=body).status_code == 401


# --- bad input ---------------------------------------------------------------------------

def test_unknown_model_is_404_in_each_dialect(oai, ant):
    with pytest.raises(openai.NotFoundError) as err:
        oai.chat.completions.create(model="no-such-model", messages=USER)
    assert err.value.body["param"] == "model" and err.value.body["code"] == "model_not_found"
    with pytest.raises(anthropic.NotFoundError) as aerr:
        ant.messages.create(model="no-such-model", max_tokens=8, messages=USER)
    assert aerr.value.body["error"]["type"] == "not_found_error"


def test_wrong_types_name_the_parameter(oai, ant):
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=OPENAI_MODEL, messages=USER,
                                    extra_body={"temperature": "hot"})
    assert err.value.body["param"] == "temperature"
    with pytest.raises(anthropic.BadRequestError) as aerr:
        ant.messages.create(model=ANTHROPIC_MODEL, max_tokens=8, messages=USER,
                            extra_body={"max_tokens": "many"})
    assert "max_tokens" in aerr.value.body["error"]["message"]


def test_missing_fields(http):
    r = http.post("/v1/chat/completions", json={"model": OPENAI_MODEL},
                  headers={"authorization": f"Bearer {CLIENT_KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = http.post("/v1/messages", json={"model": ANTHROPIC_MODEL, "messages": USER},
                  headers={"x-api-key": CLIENT_KEY})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "max_tokens" in r.json()["error"]["message"]


def test_malformed_json(http):
    for path, check in (("/v1/chat/completions", lambda j: j["error"]["type"]),
                        ("/v1/messages", lambda j: j["error"]["type"])):
        r = http.post(path, content=b"{not json", headers={"authorization": f"Bearer {CLIENT_KEY}",
                                                           "content-type": "application/json"})
        assert r.status_code == 400
        assert check(r.json()) == "invalid_request_error"
        assert "JSON" in r.text


def test_body_over_limit_is_413(http):
    huge = "x" * (3 * 1024 * 1024)
    r = http.post("/v1/chat/completions", headers={"authorization": f"Bearer {CLIENT_KEY}"},
                  json={"model": OPENAI_MODEL, "messages": [{"role": "user", "content": huge}]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = http.post("/v1/messages", headers={"x-api-key": CLIENT_KEY},
                  json={"model": ANTHROPIC_MODEL, "max_tokens": 8,
                        "messages": [{"role": "user", "content": huge}]})
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"


def test_n_greater_than_one_is_refused_naming_n(oai):
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=OPENAI_MODEL, messages=USER, n=2)
    assert err.value.body["param"] == "n"


def test_unknown_route_and_method_in_dialect(http):
    r = http.get("/v1/nothing-here", headers={"authorization": f"Bearer {CLIENT_KEY}"})
    assert r.status_code == 404 and "error" in r.json()
    r = http.get("/v1/messages", headers={"x-api-key": CLIENT_KEY})
    assert r.status_code == 405 and r.json()["type"] == "error"


# --- upstream failures ------------------------------------------------------------------

@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
def test_upstream_4xx_is_translated(oai, ant, model):
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "[[error:400]]"}])
    with pytest.raises(anthropic.BadRequestError) as aerr:
        ant.messages.create(model=model, max_tokens=8,
                            messages=[{"role": "user", "content": "[[error:400]]"}])
    assert aerr.value.body["type"] == "error"
    with pytest.raises(openai.RateLimitError) as rl:
        oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "[[error:429]]"}])
    assert rl.value.response.headers["retry-after"] == "3"


@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
def test_upstream_5xx_is_502(oai, ant, model):
    with pytest.raises(openai.InternalServerError) as err:
        oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "[[error:500]]"}])
    assert err.value.status_code == 502
    with pytest.raises(anthropic.InternalServerError) as aerr:
        ant.messages.create(model=model, max_tokens=8,
                            messages=[{"role": "user", "content": "[[error:500]]"}])
    assert aerr.value.status_code == 502
    assert UPSTREAM_KEY not in str(aerr.value.body)


def test_anthropic_overload_from_upstream_is_529(ant):
    with pytest.raises(anthropic.APIStatusError) as err:
        ant.messages.create(model=ANTHROPIC_MODEL, max_tokens=8,
                            messages=[{"role": "user", "content": "[[error:529]]"}])
    assert err.value.status_code == 529
    assert err.value.body["error"]["type"] == "overloaded_error"


def test_upstream_timeout_is_504(oai, ant):
    with pytest.raises(openai.APIStatusError) as err:
        oai.chat.completions.create(model=SLOW_MODEL,
                                    messages=[{"role": "user", "content": "[[sleep:3]] hi"}])
    assert err.value.status_code == 504
    with pytest.raises(anthropic.APIStatusError) as aerr:
        ant.messages.create(model=SLOW_MODEL, max_tokens=8,
                            messages=[{"role": "user", "content": "[[sleep:3]] hi"}])
    assert aerr.value.status_code == 504


def test_upstream_unreachable_is_502(fake_upstream):
    from app.factory import create_app
    from app.settings import ServerSettings, Settings, WorkerSettings
    from tests.support.server import ServerThread
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    settings = Settings(server=ServerSettings(), workers=(WorkerSettings(
        name="dead", dialect="openai", url=f"http://127.0.0.1:{dead_port}/v1", models=("m",)),))
    with ServerThread(create_app(settings)) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as c:
        with pytest.raises(openai.InternalServerError) as err:
            c.chat.completions.create(model="m", messages=USER)
    assert err.value.status_code == 502


# --- failures after the first byte --------------------------------------------------------

@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
def test_openai_stream_dies_midway(oai, model):
    stream = oai.chat.completions.create(
        model=model, stream=True,
        messages=[{"role": "user", "content": "[[die-after:3]] one two three four five"}])
    got = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            got.append(chunk)
    assert got, "some chunks arrived before the failure"


@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
def test_anthropic_stream_dies_midway(ant, model):
    with pytest.raises(anthropic.APIStatusError) as err:
        with ant.messages.stream(model=model, max_tokens=64, messages=[
                {"role": "user", "content": "[[die-after:3]] one two three four five"}]) as s:
            for _ in s.text_stream:
                pass
    assert err.value.body["type"] == "error"


@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
def test_raw_stream_ends_with_terminal_frame_after_failure(http, model):
    r = http.post("/v1/chat/completions", headers={"authorization": f"Bearer {CLIENT_KEY}"},
                  json={"model": model, "stream": True,
                        "messages": [{"role": "user", "content": "[[truncate-after:2]] a b c d"}]})
    assert r.status_code == 200
    frames = [f for f in r.text.split("\n\n") if f]
    assert '"error"' in frames[-2] and frames[-1] == "data: [DONE]"
    r = http.post("/v1/messages", headers={"x-api-key": CLIENT_KEY},
                  json={"model": model, "stream": True, "max_tokens": 64,
                        "messages": [{"role": "user", "content": "[[truncate-after:2]] a b c d"}]})
    frames = [f for f in r.text.split("\n\n") if f]
    assert frames[-1].startswith("event: error")


@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL])
@pytest.mark.parametrize("stream", [True, False])
async def test_client_disconnect_cancels_upstream(gateway, fake_upstream, model, stream):
    before = fake_upstream.disconnects
    marker = "[[hang-after:2]]" if stream else "[[sleep:4]]"
    body = {"model": model, "stream": stream,
            "messages": [{"role": "user", "content": f"{marker} a b c d e f"}]}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
        if stream:
            async with client.stream("POST", "/v1/chat/completions", json=body,
                                     headers={"authorization": f"Bearer {CLIENT_KEY}"}) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    break  # the first bytes arrived: go away
        else:
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/v1/chat/completions", json=body, timeout=0.5,
                                  headers={"authorization": f"Bearer {CLIENT_KEY}"})
    assert await fake_upstream.wait_disconnects(before + 1, timeout=5)


# --- retry on another worker ------------------------------------------------------------

def _dead_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("stream", [False, True])
def test_failure_before_first_byte_is_retried_on_another_worker(fake_upstream, stream):
    from app.factory import create_app
    from app.settings import ServerSettings, Settings, WorkerSettings
    from tests.support.server import ServerThread

    dead = WorkerSettings(name="dead", dialect="openai", models=("m",),
                          url=f"http://127.0.0.1:{_dead_port()}/v1")
    alive = WorkerSettings(name="alive", dialect="anthropic", models=("m",), api_key=UPSTREAM_KEY,
                           url=fake_upstream.anthropic_url)
    with ServerThread(create_app(Settings(server=ServerSettings(), workers=(dead, alive)))) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="m", stream=stream, messages=[{"role": "user", "content": "retry me"}])
        assert raw.headers["x-poolgate-worker"] == "alive"
        parsed = raw.parse()
        text = ("".join(c.choices[0].delta.content or "" for c in parsed if c.choices) if stream
                else parsed.choices[0].message.content)
        assert text == "echo: retry me"


def test_no_retry_for_client_errors_and_one_retry_only(fake_upstream):
    from app.factory import create_app
    from app.settings import ServerSettings, Settings, WorkerSettings
    from tests.support.server import ServerThread

    workers = tuple(WorkerSettings(name=f"dead{i}", dialect="openai", models=("m",),
                                   url=f"http://127.0.0.1:{_dead_port()}/v1") for i in range(3))
    with ServerThread(create_app(Settings(server=ServerSettings(), workers=workers))) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 502
    assert err.value.response.headers["x-poolgate-worker"] == "dead1"  # tried twice, not thrice


def test_upstream_4xx_is_not_retried(fake_upstream):
    from app.factory import create_app
    from app.settings import ServerSettings, Settings, WorkerSettings
    from tests.support.server import ServerThread

    workers = tuple(WorkerSettings(name=f"w{i}", dialect="openai", models=("m",),
                                   api_key=UPSTREAM_KEY, url=fake_upstream.url) for i in range(2))
    with ServerThread(create_app(Settings(server=ServerSettings(), workers=workers))) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as client:
        def posts() -> int:  # health probes (GET) may land meanwhile
            return sum(r.body is not None for r in fake_upstream.requests)

        before = posts()
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="m",
                                           messages=[{"role": "user", "content": "[[error:400]]"}])
        # the client's own mistake: one upstream call, not two
        assert posts() == before + 1


# --- a slow first event: headers at once, pings while waiting ---------------------------

@pytest.fixture
def impatient(fake_upstream):
    from app.factory import create_app
    from app.settings import ServerSettings, Settings, WorkerSettings
    from tests.support.server import ServerThread

    settings = Settings(server=ServerSettings(stream_grace=0.3, ping_interval=0.3), workers=(
        WorkerSettings(name="a", dialect="anthropic", models=("claude-x",), api_key=UPSTREAM_KEY,
                       url=fake_upstream.anthropic_url),
        WorkerSettings(name="o", dialect="openai", models=("gpt-x",), api_key=UPSTREAM_KEY,
                       url=fake_upstream.url)))
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        yield http


@pytest.mark.parametrize("model", ["claude-x", "gpt-x"])
def test_anthropic_stream_pings_while_the_worker_is_slow(impatient, model):
    body = {"model": model, "max_tokens": 32, "stream": True,
            "messages": [{"role": "user", "content": "[[sleep:1.5]] slow start"}]}
    r = impatient.post("/v1/messages", json=body)
    events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    first_block = events.index("content_block_start")
    assert "ping" in events[:first_block]  # keep-alive before any content
    text = "".join(json.loads(line[6:])["delta"].get("text", "")
                   for line in r.text.splitlines()
                   if line.startswith("data: ") and '"content_block_delta"' in line)
    assert text == "echo: slow start"


def test_late_failure_after_headers_is_an_error_frame(impatient):
    body = {"model": "gpt-x", "stream": True,
            "messages": [{"role": "user", "content": "[[sleep:1]] [[error:500]]"}]}
    r = impatient.post("/v1/chat/completions", json=body)
    assert r.status_code == 200  # the headers had gone out: the error comes in-stream
    frames = [f for f in r.text.split("\n\n") if f]
    assert frames[0] == ": ping" or any(f == ": ping" for f in frames)
    assert '"error"' in frames[-2] and frames[-1] == "data: [DONE]"
    with openai.OpenAI(base_url=str(impatient.base_url) + "/v1", api_key="x", max_retries=0) as c:
        with pytest.raises(openai.APIError):
            for _ in c.chat.completions.create(model="gpt-x", stream=True, messages=[
                    {"role": "user", "content": "[[sleep:1]] [[error:500]]"}]):
                pass
