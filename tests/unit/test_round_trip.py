"""Property: a request survives wire → canonical → wire, in each dialect.

The client-side decoder (``app/dialects``) and the upstream-side encoder
(``pool/remote``) are inverse halves; here the upstream body is built from the
canonical form (not the pass-through), and must say what the client said.
"""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from app.dialects import anthropic_messages, openai_chat
from pool.remote import anthropic_messages as remote_anthropic
from pool.remote import openai_chat as remote_openai

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
ident = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
# bodies come from orjson, whose integers fit in 64 bits
args = st.dictionaries(ident, st.one_of(st.integers(-2**63, 2**63 - 1), text, st.booleans()),
                       max_size=3)


@st.composite
def anthropic_conversation(draw):
    turns = draw(st.integers(min_value=0, max_value=3))
    messages = [{"role": "user", "content": draw(text)}]
    for i in range(turns):
        calls = [{"type": "tool_use", "id": f"toolu_{i}_{j}", "name": draw(ident),
                  "input": draw(args)} for j in range(draw(st.integers(1, 2)))]
        messages.append({"role": "assistant", "content": [{"type": "text", "text": draw(text)},
                                                          *calls]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": c["id"], "content": draw(text),
             "is_error": draw(st.booleans())} for c in calls]})
    return {"model": "m", "max_tokens": draw(st.integers(1, 4096)), "system": draw(text),
            "messages": messages, "temperature": draw(st.floats(0, 1)),
            "stop_sequences": draw(st.lists(text, max_size=2))}


@st.composite
def openai_conversation(draw):
    turns = draw(st.integers(min_value=0, max_value=3))
    messages = [{"role": "system", "content": draw(text)}, {"role": "user", "content": draw(text)}]
    for i in range(turns):
        calls = [{"id": f"call_{i}_{j}", "type": "function",
                  "function": {"name": draw(ident), "arguments": json.dumps(draw(args))}}
                 for j in range(draw(st.integers(1, 2)))]
        messages.append({"role": "assistant", "content": draw(st.one_of(st.none(), text)),
                         "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": draw(text)} for c in calls]
    return {"model": "m", "messages": messages, "max_tokens": draw(st.integers(1, 4096)),
            "temperature": draw(st.floats(0, 2)), "stop": draw(st.lists(text, max_size=2)),
            "seed": draw(st.integers(0, 2**31))}


def _translated(request, foreign_dialect):
    # not the same dialect: the upstream body is built from the canonical form
    return replace(request, dialect=foreign_dialect, raw={})


@settings(max_examples=150, deadline=None)
@given(anthropic_conversation())
def test_anthropic_survives_canonical(body):
    request = _translated(anthropic_messages.decode(body), "openai_chat")
    out = remote_anthropic.build_body(request)
    assert out["max_tokens"] == body["max_tokens"]
    assert out["temperature"] == body["temperature"]
    assert out.get("stop_sequences", []) == body["stop_sequences"]
    system = out["system"]
    assert body["system"] in (system if isinstance(system, str) else "".join(b["text"] for b in system))
    assert len(out["messages"]) == len(body["messages"])
    for sent, original in zip(out["messages"], body["messages"]):
        assert sent["role"] == original["role"]
        blocks = sent["content"] if isinstance(sent["content"], list) else [
            {"type": "text", "text": sent["content"]}]
        originals = original["content"] if isinstance(original["content"], list) else [
            {"type": "text", "text": original["content"]}]
        assert [b["type"] for b in blocks] == [b["type"] for b in originals]
        for b, o in zip(blocks, originals):
            if o["type"] == "text":
                assert b["text"] == o["text"]
            elif o["type"] == "tool_use":
                assert (b["id"], b["name"], b["input"]) == (o["id"], o["name"], o["input"])
            else:
                assert b["tool_use_id"] == o["tool_use_id"]
                assert bool(b.get("is_error")) == o["is_error"]
                content = b["content"] if isinstance(b["content"], str) else "".join(
                    x["text"] for x in b["content"])
                assert content == o["content"]


@settings(max_examples=150, deadline=None)
@given(openai_conversation())
def test_openai_survives_canonical(body):
    request = _translated(openai_chat.decode(body), "anthropic")
    out = remote_openai.build_body(request)
    assert out["temperature"] == body["temperature"] and out["seed"] == body["seed"]
    assert body["max_tokens"] in (out.get("max_tokens"), out.get("max_completion_tokens"))
    assert out.get("stop", []) == body["stop"]
    assert len(out["messages"]) == len(body["messages"])
    for sent, original in zip(out["messages"], body["messages"]):
        assert sent["role"] == original["role"]
        if original["role"] == "tool":
            assert sent["tool_call_id"] == original["tool_call_id"]
        content = sent.get("content")
        if isinstance(content, list):
            content = "".join(p["text"] for p in content)
        assert (content or None) == (original.get("content") or None)
        calls = [(c["id"], c["function"]["name"], c["function"]["arguments"])
                 for c in sent.get("tool_calls") or []]
        assert calls == [(c["id"], c["function"]["name"], c["function"]["arguments"])
                         for c in original.get("tool_calls") or []]
