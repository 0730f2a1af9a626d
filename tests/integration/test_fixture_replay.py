"""Every recorded client request for chat completions and messages is accepted
and reaches each upstream dialect with nothing lost that the target can carry."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from .conftest import ANTHROPIC_MODEL, CLIENT_KEY, OPENAI_MODEL
from tests.support.paths import FIXTURES as _FIXTURES

FIXTURES = _FIXTURES
CHAT = sorted(FIXTURES.glob("*POST-v1_chat_completions.json"))
MESSAGES = sorted(FIXTURES.glob("*POST-v1_messages.json"))
# hop-by-hop and transport headers the client sent to the recorder, not to us
# the recorder's own notes in a body (``_n_tools``: how many tools before it cut the
# list), not what the client sent; the default pass-through policy drops them
_RECORDER = "_"
_DROP = {"host", "content-length", "connection", "accept-encoding", "authorization", "x-api-key"}


def _replay(gateway, fixture: Path, model: str) -> tuple[httpx.Response, dict, dict]:
    record = json.loads(fixture.read_text())
    body = dict(record["body"], model=model)
    headers = {k: v for k, v in record["headers"].items() if k.lower() not in _DROP}
    headers["authorization"] = f"Bearer {CLIENT_KEY}"
    query = "&".join(f"{k}={v}" for k, vs in record["query"].items() for v in vs)
    path = record["path"] + (f"?{query}" if query else "")
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        before = len(gateway.fake.requests)
        resp = client.post(path, json=body, headers=headers)
    sent = [r for r in gateway.fake.requests[before:] if r.body is not None]  # no probes
    return resp, body, sent[-1].body if sent else {}


def test_fixtures_found():
    assert len(CHAT) >= 5 and len(MESSAGES) >= 10


@pytest.mark.parametrize("fixture", CHAT, ids=lambda p: p.stem)
@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL], ids=["to-openai", "to-anthropic"])
def test_chat_fixture_accepted(gateway, fixture, model):
    resp, body, upstream = _replay(gateway, fixture, model)
    assert resp.status_code == 200, resp.text[:500]
    if body.get("stream"):
        assert resp.text.rstrip().endswith("data: [DONE]")
    if model == OPENAI_MODEL:
        # same dialect: the body goes on untouched but for the model name
        for key, value in body.items():
            if key not in ("model", "stream_options") and not key.startswith(_RECORDER):
                assert upstream[key] == value, key
    else:
        assert len(upstream.get("tools", [])) == len([t for t in body.get("tools", [])
                                              if t.get("type", "function") == "function"])
        texts = json.dumps(upstream["messages"]) + json.dumps(upstream.get("system", ""))
        for message in body["messages"]:
            content = message.get("content")
            if isinstance(content, str) and content:
                assert content[:40] in texts or json.dumps(content)[1:41] in texts


@pytest.mark.parametrize("fixture", MESSAGES, ids=lambda p: p.stem)
@pytest.mark.parametrize("model", [ANTHROPIC_MODEL, OPENAI_MODEL], ids=["to-anthropic", "to-openai"])
def test_messages_fixture_accepted(gateway, fixture, model):
    resp, body, upstream = _replay(gateway, fixture, model)
    assert resp.status_code == 200, resp.text[:500]
    if body.get("stream"):
        events = [line for line in resp.text.splitlines() if line.startswith("event: ")]
        assert events[0] == "event: message_start" and events[-1] == "event: message_stop"
    else:
        assert resp.json()["type"] == "message"
    if model == ANTHROPIC_MODEL:
        for key, value in body.items():
            if key != "model" and not key.startswith(_RECORDER):
                assert upstream[key] == value, key
    else:
        sent = json.dumps(upstream)
        for message in body["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block.get("type") == "tool_use":
                    assert block["id"] in sent
                if block.get("type") == "tool_result":
                    assert block["tool_use_id"] in sent
        assert body["max_tokens"] in (upstream.get("max_tokens"), upstream.get("max_completion_tokens"))


def test_anthropic_beta_headers_pass_through(gateway):
    fixture = next(p for p in MESSAGES if "claude-code-tool-03" in p.name)
    resp, _, _ = _replay(gateway, fixture, ANTHROPIC_MODEL)
    assert resp.status_code == 200
    headers = gateway.fake.last.headers
    recorded = json.loads(fixture.read_text())["headers"]
    assert headers["anthropic-beta"] == recorded["anthropic-beta"]
    assert headers["anthropic-version"] == recorded["anthropic-version"]


RESPONSES = sorted(FIXTURES.glob("*POST-v1_responses.json"))


@pytest.mark.parametrize("fixture", RESPONSES, ids=lambda p: p.stem)
@pytest.mark.parametrize("model", [OPENAI_MODEL, ANTHROPIC_MODEL], ids=["to-openai", "to-anthropic"])
def test_responses_fixture_accepted(gateway, fixture, model):
    resp, body, upstream = _replay(gateway, fixture, model)
    assert resp.status_code == 200, resp.text[:500]
    if body.get("stream"):
        events = [line[7:] for line in resp.text.splitlines() if line.startswith("event: ")]
        assert events[0] == "response.created" and events[-1] == "response.completed"
    else:
        answer = resp.json()
        assert answer["object"] == "response" and answer["status"] == "completed"
    sent = json.dumps(upstream)
    # every function tool the client offered reaches the upstream (hosted ones cannot)
    offered = [t["name"] for t in body.get("tools", []) if t.get("type") in ("function", "custom")
               and "name" in t]
    for name in offered:
        assert f'"{name}"' in sent, name
    # every message text and tool call/result the client sent reaches it too
    items = body["input"] if isinstance(body["input"], list) else [
        {"type": "message", "content": [{"text": body["input"]}]}]
    for item in items:
        if item.get("type", "message") == "message":
            for part in item["content"] if isinstance(item["content"], list) else []:
                if part.get("text"):
                    assert json.dumps(part["text"])[1:60] in sent
        elif item.get("type") in ("function_call", "function_call_output"):
            assert item["call_id"] in sent
