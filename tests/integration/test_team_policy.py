"""Per-key policy from ``[server.keys.<name>]`` over real uvicorn with the real
openai and anthropic SDKs: models, in-flight, rpm, tpm, token budgets."""

from __future__ import annotations

import calendar
import time

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.key_settings import BudgetSettings, KeySettings
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread

from .conftest import ADMIN_TOKEN, ANTHROPIC_MODEL, OPENAI_MODEL, UPSTREAM_KEY

KEYS = {
    "claude-only": KeySettings(secret="sk-claude-only", models=("claude-*",)),
    "rpm2": KeySettings(secret="sk-rpm2", rpm=2),
    "rpm2-anthropic": KeySettings(secret="sk-rpm2-anthropic", rpm=2),
    "tpm": KeySettings(secret="sk-tpm", tpm=40),
    "tpm-stream": KeySettings(secret="sk-tpm-stream", tpm=40),
    "budget": KeySettings(secret="sk-budget", budget_tokens=BudgetSettings(day=30)),
    "budget-month": KeySettings(secret="sk-budget-month",
                                budget_tokens=BudgetSettings(month=30)),
    "one-at-a-time": KeySettings(secret="sk-one", max_in_flight=1),
    "rpm2-list": KeySettings(secret="sk-rpm2-list", rpm=2),
    "list-budget": KeySettings(secret="sk-list-budget", budget_tokens=BudgetSettings(day=1)),
    "rpm1-count": KeySettings(secret="sk-rpm1-count", rpm=1),
    "rpm1-gemini": KeySettings(secret="sk-rpm1-gemini", rpm=1),
}
LONG = "please count these words " * 20  # well over 40 tokens of input


@pytest.fixture(scope="module")
def gateway(fake_upstream):
    settings = Settings(
        server=ServerSettings(api_keys={"plain": "sk-plain"}, keys=KEYS,
                              admin_token=ADMIN_TOKEN, queue_timeout=0.2),
        workers=(WorkerSettings(name="openai-up", dialect="openai", url=fake_upstream.url,
                                api_key=UPSTREAM_KEY, models=(OPENAI_MODEL,)),
                 WorkerSettings(name="anthropic-up", dialect="anthropic",
                                url=fake_upstream.anthropic_url, api_key=UPSTREAM_KEY,
                                models=(ANTHROPIC_MODEL,))))
    with ServerThread(create_app(settings)) as srv:
        yield srv.url


def oai(url: str, key: str) -> openai.OpenAI:
    return closed_at_end(openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0))


def claude(url: str, key: str) -> anthropic.Anthropic:
    return closed_at_end(anthropic.Anthropic(base_url=url, api_key=key, max_retries=0))


def ask(client: openai.OpenAI, text: str = "hi", model: str = OPENAI_MODEL) -> str:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content


def test_plain_api_keys_keep_working(gateway):
    assert ask(oai(gateway, "sk-plain")) == "echo: hi"


def test_model_outside_the_list_is_not_found_and_not_listed(gateway):
    limited, plain = oai(gateway, "sk-claude-only"), oai(gateway, "sk-plain")
    with pytest.raises(openai.NotFoundError) as refused:
        ask(limited, model=OPENAI_MODEL)
    with pytest.raises(openai.NotFoundError) as unknown:  # (the 404 lists the key's models)
        ask(limited, model="no-such-model")
    theirs, nobodys = refused.value.response.json(), unknown.value.response.json()
    assert theirs["error"]["message"].replace(OPENAI_MODEL, "X") == \
        nobodys["error"]["message"].replace("no-such-model", "X")
    assert theirs["error"]["code"] == nobodys["error"]["code"] == "model_not_found"
    assert [m.id for m in limited.models.list()] == [ANTHROPIC_MODEL]
    assert {m.id for m in plain.models.list()} == {OPENAI_MODEL, ANTHROPIC_MODEL}
    with pytest.raises(openai.NotFoundError):
        limited.models.retrieve(OPENAI_MODEL)
    # the allowed model answers in both dialects
    reply = claude(gateway, "sk-claude-only").messages.create(
        model=ANTHROPIC_MODEL, max_tokens=50, messages=[{"role": "user", "content": "yo"}])
    assert reply.content[0].text == "echo: yo"
    with pytest.raises(anthropic.NotFoundError) as anthropic_refused:
        claude(gateway, "sk-claude-only").messages.create(
            model=OPENAI_MODEL, max_tokens=50, messages=[{"role": "user", "content": "yo"}])
    assert anthropic_refused.value.body["error"]["type"] == "not_found_error"
    assert [m.id for m in claude(gateway, "sk-claude-only").models.list()] == [ANTHROPIC_MODEL]


def _retry_seconds(headers: httpx.Headers, window: float = 60) -> int:
    retry = int(headers["retry-after"])
    assert 1 <= retry <= window
    assert 0 < int(headers["retry-after-ms"]) <= window * 1000
    return retry


def test_rpm_refuses_with_openai_rate_limit_error_and_headers(gateway):
    client = oai(gateway, "sk-rpm2")
    ask(client)
    ask(client)
    with pytest.raises(openai.RateLimitError) as info:
        ask(client)
    headers = info.value.response.headers
    retry = _retry_seconds(headers)
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert info.value.code == "rate_limit_exceeded"
    assert "2 requests per minute" in info.value.message
    # the SDK's own retry logic reads a wait within the window
    waits = client._parse_retry_after_header(headers)
    assert 0 < waits <= retry and waits == int(headers["retry-after-ms"]) / 1000
    # another key is not affected
    assert ask(oai(gateway, "sk-plain")) == "echo: hi"


def test_rpm_in_the_anthropic_dialect(gateway):
    client = claude(gateway, "sk-rpm2-anthropic")
    for _ in range(2):
        client.messages.create(model=ANTHROPIC_MODEL, max_tokens=20,
                               messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.RateLimitError) as info:
        client.messages.create(model=ANTHROPIC_MODEL, max_tokens=20,
                               messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 429
    assert info.value.body["error"]["type"] == "rate_limit_error"
    headers = info.value.response.headers
    retry = _retry_seconds(headers)
    assert 0 < client._parse_retry_after_header(headers) <= retry
    assert headers["anthropic-ratelimit-requests-limit"] == "2"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    reset = calendar.timegm(time.strptime(headers["anthropic-ratelimit-requests-reset"],
                                          "%Y-%m-%dT%H:%M:%SZ"))
    assert time.time() - 2 <= reset <= time.time() + 61


def test_tpm_counts_input_and_output_when_the_answer_ends(gateway):
    client = oai(gateway, "sk-tpm")
    assert ask(client, LONG).startswith("echo: ")  # admitted: nothing used yet
    with pytest.raises(openai.RateLimitError) as info:
        ask(client)
    headers = info.value.response.headers
    _retry_seconds(headers)
    assert headers["x-ratelimit-limit-tokens"] == "40"
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    assert "40 tokens per minute" in info.value.message


def test_a_stream_is_charged_when_it_ends(gateway):
    client = oai(gateway, "sk-tpm-stream")
    chunks = list(client.chat.completions.create(
        model=OPENAI_MODEL, stream=True, messages=[{"role": "user", "content": LONG}]))
    assert chunks
    with pytest.raises(openai.RateLimitError):
        ask(client)


def test_daily_budget_names_itself_and_its_reset(gateway):
    client = oai(gateway, "sk-budget")
    ask(client, LONG)
    with pytest.raises(openai.RateLimitError) as info:
        ask(client)
    assert info.value.code == "budget_exceeded"
    message = info.value.message
    tomorrow = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + 86400))
    assert "daily token budget" in message and "30 tokens" in message and tomorrow in message
    retry = int(info.value.response.headers["retry-after"])
    midnight = (int(time.time()) // 86400 + 1) * 86400
    assert abs(time.time() + retry - midnight) <= 5
    with pytest.raises(anthropic.RateLimitError) as again:
        claude(gateway, "sk-budget").messages.create(
            model=ANTHROPIC_MODEL, max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    assert "daily token budget" in again.value.body["error"]["message"]


def test_monthly_budget(gateway):
    client = oai(gateway, "sk-budget-month")
    ask(client, LONG)
    with pytest.raises(openai.RateLimitError) as info:
        ask(client)
    assert "monthly token budget" in info.value.message
    t = time.gmtime()
    first = (t.tm_year + (t.tm_mon == 12), t.tm_mon % 12 + 1, 1, 0, 0, 0)
    assert time.strftime("%Y-%m-%dT%H:%M:%SZ", first + (0, 0, 0)) in info.value.message


def test_max_in_flight_per_key(gateway):
    client = oai(gateway, "sk-one")
    # a stream that sends two frames, then hangs until its client leaves
    stream = client.chat.completions.create(
        model=OPENAI_MODEL, stream=True,
        messages=[{"role": "user", "content": "[[hang-after:2]] one two three four"}])
    next(iter(stream))
    with pytest.raises(openai.RateLimitError) as info:
        ask(client)
    assert "1 requests in flight" in info.value.message
    assert ask(oai(gateway, "sk-plain")) == "echo: hi"  # others are not held up
    stream.close()
    deadline = time.monotonic() + 10
    while True:  # the gateway sees the client leave and frees the slot
        try:
            assert ask(client) == "echo: hi"
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_list_prompt_is_one_request_of_the_rpm(gateway):
    client = oai(gateway, "sk-rpm2-list")
    three = client.completions.create(model=OPENAI_MODEL, prompt=["one", "two", "three"])
    assert len(three.choices) == 3
    assert client.completions.create(model=OPENAI_MODEL, prompt="four").choices
    with pytest.raises(openai.RateLimitError) as info:
        client.completions.create(model=OPENAI_MODEL, prompt=["five", "six"])
    assert info.value.code == "rate_limit_exceeded"


def test_the_prompts_that_finished_are_charged_when_another_fails(gateway):
    client = oai(gateway, "sk-list-budget")
    with pytest.raises(openai.BadRequestError):  # the second fails after the first finished
        client.completions.create(model=OPENAI_MODEL,
                                  prompt=["spend it", "[[sleep:0.3]] [[error:400]]"])
    time.sleep(0.2)  # charged as the request ends, just after its answer was sent
    # the first prompt's tokens put the key over its 1-token budget
    with pytest.raises(openai.RateLimitError) as refused:
        client.completions.create(model=OPENAI_MODEL, prompt="again")
    assert refused.value.code == "budget_exceeded"


def test_count_tokens_counts_against_the_rpm(gateway):
    client = claude(gateway, "sk-rpm1-count")
    counted = client.messages.count_tokens(model=ANTHROPIC_MODEL,
                                           messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens > 0
    with pytest.raises(anthropic.RateLimitError):
        client.messages.count_tokens(model=ANTHROPIC_MODEL,
                                     messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(model=ANTHROPIC_MODEL, max_tokens=16,
                               messages=[{"role": "user", "content": "hi"}])


def test_gemini_count_tokens_counts_against_the_rpm(gateway):
    url = f"{gateway}/v1beta/models/{ANTHROPIC_MODEL}:countTokens"
    headers = {"x-goog-api-key": "sk-rpm1-gemini"}
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    first = httpx.post(url, headers=headers, json=body)
    assert first.status_code == 200 and first.json()["totalTokens"] > 0
    second = httpx.post(url, headers=headers, json=body)
    assert second.status_code == 429, second.text
    assert second.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
