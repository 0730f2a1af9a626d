"""The decoders' path for simple bodies (model, messages, the token limit,
stream: most requests) gives what the general path gives for the same body."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.dialects import anthropic_messages, openai_chat

HEADERS = [None, {}, {"x-session-id": "s-1", "anthropic-version": "2023-06-01",
                      "anthropic-beta": "tools-2024", "session_id": "s-2"}]
OPENAI = [
    {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    {"model": "m", "max_tokens": 16, "stream": True,
     "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
    {"model": "m", "max_completion_tokens": 7, "stream": False,
     "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
]
ANTHROPIC = [
    {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    {"model": "m", "max_tokens": 1, "stream": True,
     "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                  {"role": "assistant", "content": "hello"}, {"role": "user", "content": "go"}]},
]


def _general(decode, body, headers, extra):
    """The general path: the same body with one more field that changes nothing."""
    return replace(decode({**body, **extra}, headers), raw={})


@pytest.mark.parametrize("headers", HEADERS)
@pytest.mark.parametrize("body", OPENAI)
def test_openai_simple_bodies(body, headers):
    fast = openai_chat.decode(body, headers)
    assert fast.raw is body
    assert replace(fast, raw={}) == _general(openai_chat.decode, body, headers, {"user": None})


@pytest.mark.parametrize("headers", HEADERS)
@pytest.mark.parametrize("body", ANTHROPIC)
def test_anthropic_simple_bodies(body, headers):
    fast = anthropic_messages.decode(body, headers)
    assert fast.raw is body
    general = _general(anthropic_messages.decode, body, headers, {"metadata": None})
    assert replace(fast, raw={}) == general
    if headers and "anthropic-version" in headers:
        assert fast.passthrough_headers["anthropic-version"] == "2023-06-01"


def test_simple_bodies_are_still_validated():
    with pytest.raises(Exception) as info:
        openai_chat.decode({"model": "m", "messages": [], "stream": "yes"})
    assert getattr(info.value, "param", None) in ("messages", "stream")
    with pytest.raises(Exception) as info:
        anthropic_messages.decode({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                   "max_tokens": 5, "stream": "yes"})
    assert getattr(info.value, "param", None) == "stream"
