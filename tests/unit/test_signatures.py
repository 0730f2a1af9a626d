"""Signed reasoning stays with the account that signed it (pool/signatures.py),
and the memory book's bounds (sessions/signatures.py)."""

from __future__ import annotations

import pytest

from pool.model import ChatRequest, Message, ReasoningPart, TextPart, ToolCallPart
from pool.signatures import digest, keep_for, request_digests
from sessions.signatures import MemorySignatureBook

A, B = "acct-a", "acct-b"
SIG_A, SIG_B, SIG_NEW, REDACTED_A = "sig-by-a", "sig-by-b", "sig-never-seen", "redacted-by-a"


def _request(*parts, dialect="openai_responses", raw=None) -> ChatRequest:
    return ChatRequest(model="m", dialect=dialect, raw=raw or {}, messages=(
        Message("user", (TextPart("hi"),)),
        Message("assistant", (*parts, TextPart("answer"))),
        Message("user", (TextPart("more"),))))


def _signers(*pairs):
    return {digest(value): account for value, account in pairs}


def _kept(request: ChatRequest) -> list[str | None]:
    return [p.redacted_data or p.signature or p.encrypted_content for m in request.messages
            for p in m.parts if type(p) is ReasoningPart]


@pytest.mark.parametrize("parts, known, to, previous, kept", [
    # known: only what the target account signed goes
    ((ReasoningPart("t", signature=SIG_A),), [(SIG_A, A)], A, None, [SIG_A]),
    ((ReasoningPart("t", signature=SIG_A),), [(SIG_A, A)], B, None, []),
    ((ReasoningPart(redacted_data=REDACTED_A),), [(REDACTED_A, A)], B, None, []),
    ((ReasoningPart(encrypted_content="enc"),), [("enc", A)], B, None, []),
    # a conversation that was on both accounts: each keeps its own
    ((ReasoningPart("t", signature=SIG_A), ReasoningPart("u", signature=SIG_B)),
     [(SIG_A, A), (SIG_B, B)], B, None, [SIG_B]),
    # unknown: passed as it is while nothing says the conversation moved...
    ((ReasoningPart("t", signature=SIG_NEW),), [], B, None, [SIG_NEW]),
    ((ReasoningPart("t", signature=SIG_NEW),), [], B, B, [SIG_NEW]),
    ((ReasoningPart("t", signature=SIG_NEW), ReasoningPart("u", signature=SIG_B)),
     [(SIG_B, B)], B, None, [SIG_NEW, SIG_B]),
    # ...and left out when it did: the previous turn was elsewhere, or a sibling is foreign
    ((ReasoningPart("t", signature=SIG_NEW),), [], B, A, []),
    ((ReasoningPart("t", signature=SIG_NEW), ReasoningPart("u", signature=SIG_A)),
     [(SIG_A, A)], B, None, []),
    # unsigned reasoning is nobody's: it stays (translators decide what to do with it)
    ((ReasoningPart("plain"),), [], B, A, [None]),
])
def test_what_goes_to_an_account(parts, known, to, previous, kept):
    request = _request(*parts)
    digests = request_digests(request)
    out, dropped = keep_for(request, to, digests, _signers(*known), previous)
    assert _kept(out) == kept
    assert dropped == len(parts) - len(kept)
    if not dropped:
        assert out is request  # nothing to change: the very request, no copy
    assert [m.role for m in out.messages] == ["user", "assistant", "user"]
    assert out.messages[1].parts[-1] == TextPart("answer")


def test_nothing_signed_nothing_hashed():
    assert request_digests(_request()) == {}
    assert request_digests(_request(ReasoningPart("plain"))) == {}


def _anthropic_raw(first_block: dict, *, tool: bool) -> dict:
    assistant = [first_block, {"type": "text", "text": "answer"}]
    last_user: list[dict] = [{"type": "text", "text": "more"}]
    if tool:
        assistant.append({"type": "tool_use", "id": "t1", "name": "f", "input": {}})
        last_user = [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]
    return {"model": "m", "max_tokens": 4000, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": assistant},
                         {"role": "user", "content": last_user}]}


@pytest.mark.parametrize("block", [{"type": "thinking", "thinking": "t", "signature": SIG_A},
                                   {"type": "redacted_thinking", "data": REDACTED_A}])
@pytest.mark.parametrize("tool", [False, True])
def test_an_anthropic_body_sent_as_it_came_loses_the_foreign_block(block, tool):
    raw = _anthropic_raw(block, tool=tool)
    value = block.get("signature") or block.get("data")
    part = (ReasoningPart("t", signature=SIG_A) if "signature" in block
            else ReasoningPart(redacted_data=REDACTED_A))
    calls = (ToolCallPart("t1", "f", "{}"),) if tool else ()
    request = ChatRequest(model="m", dialect="anthropic", raw=raw, messages=(
        Message("user", (TextPart("hi"),)), Message("assistant", (part, TextPart("answer"), *calls)),
        Message("user", (TextPart("more"),))))
    digests = request_digests(request)
    out, dropped = keep_for(request, B, digests, _signers((value, A)))
    assert dropped == 1
    sent = out.raw["messages"][1]["content"]
    assert [b["type"] for b in sent] == ["text", *(["tool_use"] if tool else [])]
    # a tool turn whose signed thinking stayed home runs without thinking
    assert ("thinking" in out.raw) is (not tool)
    assert raw["messages"][1]["content"][0] == block  # the client's body is untouched
    same, none = keep_for(request, A, digests, _signers((value, A)))
    assert none == 0 and same.raw is raw


def test_an_assistant_turn_of_nothing_but_foreign_thinking_goes_altogether():
    raw = {"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t",
                                           "signature": SIG_A}]},
        {"role": "user", "content": "more"}]}
    request = ChatRequest(model="m", dialect="anthropic", raw=raw, messages=(
        Message("user", (TextPart("hi"),)), Message("assistant", (ReasoningPart("t", SIG_A),)),
        Message("user", (TextPart("more"),))))
    out, _ = keep_for(request, B, request_digests(request), _signers((SIG_A, A)))
    assert [m["role"] for m in out.raw["messages"]] == ["user", "user"]


def test_another_dialects_body_is_not_sent_on_once_something_was_left_out():
    request = _request(ReasoningPart("t", signature=SIG_A), dialect="gemini",
                       raw={"contents": [{"parts": [{"thoughtSignature": SIG_A}]}]})
    out, _ = keep_for(request, B, request_digests(request), _signers((SIG_A, A)))
    assert out.raw == {}  # translated from the canonical form, which lost the block


async def test_the_memory_book_is_bounded_and_forgets():
    now = [0.0]
    book = MemorySignatureBook(max_entries=2, ttl=10, clock=lambda: now[0])
    book.note(A, ["d1", "d2"])
    book.note(B, ["d3"])  # d1 is the oldest: it goes
    assert await book.signers(["d1", "d2", "d3"]) == {"d2": A, "d3": B}
    now[0] = 11
    assert await book.signers(["d2", "d3"]) == {}
    stats = book.stats()
    assert stats["evicted"] == 1 and stats["expired"] == 2 and stats["entries"] == 0


def test_the_book_keeps_digests_never_values():
    book = MemorySignatureBook()
    book.note(A, [digest(SIG_A)])
    assert SIG_A not in repr(book._items)


@pytest.mark.parametrize("tool", [False, True])
def test_a_tool_turn_that_lost_its_thinking_runs_without_a_budget(tool):
    calls = (ToolCallPart("t1", "f", "{}"),) if tool else ()
    request = ChatRequest(model="m", dialect="anthropic", thinking_budget=2048, messages=(
        Message("user", (TextPart("hi"),)),
        Message("assistant", (ReasoningPart("t", signature=SIG_A), *calls)),
        Message("user", (TextPart("more"),))))
    out, _ = keep_for(request, B, request_digests(request), _signers((SIG_A, A)))
    assert out.thinking_budget == (None if tool else 2048)


def test_a_claude_accounts_signer_is_its_account_not_its_worker_name(tmp_path):
    """Replicas on other hosts run other accounts under the same worker names
    (and share their notes through Redis): the signer is the account."""
    from pool.cli.worker import CliSpec, CliWorker

    def worker(account: str | None, key: str | None = None) -> CliWorker:
        env = {"ANTHROPIC_API_KEY": key} if key else {}
        made = CliWorker(CliSpec(name="claude-a", cli="claude", models=("m",),
                                 home=str(tmp_path / "home"), env=env))
        if account is not None:
            made._status = {"account": account}  # what the child reports
        return made

    one, other, same = worker("a@example.com"), worker("b@example.com"), worker("a@example.com")
    assert one.signs_per_account
    assert one.signing_account == same.signing_account != other.signing_account
    assert "a@example.com" not in one.signing_account
    assert worker(None, key="sk-ant-1").signing_account != worker(None, key="sk-ant-2").signing_account
    assert worker(None).signing_account == "cli:claude-a"  # nothing known yet
    before = one.signing_account
    one._status = {}  # a restart forgets the status
    assert one.signing_account == before
