"""Session keys: every source in order of precedence, real client requests, the content hash."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import replace
from typing import Any

import pytest
from starlette.datastructures import Headers

from app.dialects import anthropic_decode, openai_responses_decode
from pool.model import ChatRequest, Message, TextPart, ToolCallPart, ToolResultPart
from sessions.keys import SOURCES, content_hash, owned_session_key, response_key, session_key
from tests.support.paths import FIXTURES

CLAUDE_CODE = sorted(glob.glob(os.path.join(FIXTURES, "claude-code-*-POST-v1_messages.json")))
CODEX = sorted(glob.glob(os.path.join(FIXTURES, "codex-responses-*-POST-v1_responses.json")))
CC_USER_ID = ('{"device_id":"a8c1","account_uuid":"",'
              '"session_id":"cdc58401-bc30-455d-9146-6fe8ce03768a"}')


def msg(role: Any, text: str) -> Message:
    return Message(role, (TextPart(text),))


def request(**fields: Any) -> ChatRequest:
    base = ChatRequest(model="m", dialect="openai_chat",
                       messages=(msg("system", "be brief"), msg("user", "hello")))
    return replace(base, **fields)


# Every source present, from ``level`` down: the one at ``level`` must win.
ALL_SOURCES: list[tuple[str, dict[str, str], dict[str, Any], str]] = [
    ("header:x-session-id", {"x-session-id": "h1"}, {}, "session:h1"),
    ("header:x-claude-code-session-id", {"x-claude-code-session-id": "h2"}, {}, "session:h2"),
    ("header:session-id", {"session-id": "h3"}, {}, "session:h3"),
    ("metadata.user_id", {}, {"metadata": {"user_id": CC_USER_ID}},
     "session:cdc58401-bc30-455d-9146-6fe8ce03768a"),
    ("session_id", {}, {"session_id": "s5"}, "session:s5"),
    ("prompt_cache_key", {}, {"prompt_cache_key": "pck"}, "cache:pck"),
    ("previous_response_id", {}, {"raw": {"previous_response_id": "resp_7"}}, "response:resp_7"),
    ("user", {}, {"user": "alice"}, "user:alice"),
]


def test_sources_are_listed_in_precedence_order() -> None:
    assert [s for s, *_ in ALL_SOURCES] + ["content_hash"] == list(SOURCES)


@pytest.mark.parametrize("level", range(len(ALL_SOURCES) + 1),
                         ids=[s for s, *_ in ALL_SOURCES] + ["content_hash"])
def test_first_present_source_wins(level: int) -> None:
    headers: dict[str, str] = {}
    fields: dict[str, Any] = {}
    for _, h, f, _ in ALL_SOURCES[level:]:
        headers |= h
        fields |= f
    key, source = session_key(request(**fields), headers)
    if level == len(ALL_SOURCES):
        assert (key, source) == ("content:" + content_hash(request()), "content_hash")
    else:
        assert (source, key) == (ALL_SOURCES[level][0], ALL_SOURCES[level][3])


def test_prompt_cache_key_is_read_from_raw_when_not_decoded() -> None:
    req = request(raw={"prompt_cache_key": "from-raw"})
    assert session_key(req, {}) == ("cache:from-raw", "prompt_cache_key")


@pytest.mark.parametrize("user_id", [
    '{"device_id":"a8c1","session_id":"abc"',          # truncated JSON
    '{"device_id":"a8c1"}',                              # no session_id
    '{"session_id": 5}',                                 # not a string
    '{"session_id": ""}',                                # empty
    '{not json at all',
    'plain-user-42',
])
def test_malformed_claude_code_user_id_falls_back_to_user(user_id: str) -> None:
    req = request(metadata={"user_id": user_id}, user=user_id)
    assert session_key(req, {}) == ("user:" + user_id, "user")


def test_empty_headers_are_ignored_and_names_are_case_insensitive() -> None:
    assert session_key(request(user="u"), {"x-session-id": ""}) == ("user:u", "user")
    headers = Headers({"X-Claude-Code-Session-Id": "abc"})
    assert session_key(request(), headers) == ("session:abc", "header:x-claude-code-session-id")


def test_kinds_never_collide_but_session_ids_share_one_namespace() -> None:
    keys = {session_key(request(prompt_cache_key="x"), {})[0],
            session_key(request(user="x"), {})[0],
            session_key(request(raw={"previous_response_id": "x"}), {})[0],
            session_key(request(), {"x-session-id": "x"})[0]}
    assert len(keys) == 4
    # Claude Code sends its session id both ways: either alone gives one key.
    by_header = session_key(request(), {"x-claude-code-session-id": "u-1"})[0]
    by_metadata = session_key(request(metadata={"user_id": '{"session_id":"u-1"}'}), {})[0]
    assert by_header == by_metadata == "session:u-1"


def test_response_key_matches_previous_response_id_source() -> None:
    req = request(raw={"previous_response_id": "resp_9"})
    assert session_key(req, {})[0] == response_key("resp_9")


def test_long_identifiers_are_stored_by_digest() -> None:
    key, _ = session_key(request(), {"x-session-id": "z" * 10_000})
    other, _ = session_key(request(), {"x-session-id": "z" * 9_999})
    assert key.startswith("session:#") and len(key) < 60 and key != other


# --- real clients -------------------------------------------------------------------------

def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("path", CLAUDE_CODE, ids=os.path.basename)
def test_claude_code_session_from_header_and_from_metadata(path: str) -> None:
    record = load(path)
    headers = {k.lower(): v for k, v in record["headers"].items()}
    uuid = json.loads(record["body"]["metadata"]["user_id"])["session_id"]
    with_headers = anthropic_decode.decode(record["body"], headers)
    assert session_key(with_headers, headers) == (f"session:{uuid}",
                                                   "header:x-claude-code-session-id")
    bare = anthropic_decode.decode(record["body"])
    assert session_key(bare, {}) == (f"session:{uuid}", "metadata.user_id")


def test_claude_code_fixtures_exist() -> None:
    assert len(CLAUDE_CODE) >= 5 and len(CODEX) >= 5


@pytest.mark.parametrize("path", CODEX, ids=os.path.basename)
def test_codex_session_header_then_prompt_cache_key(path: str) -> None:
    record = load(path)
    headers = {k.lower(): v for k, v in record["headers"].items()}
    body = record["body"]
    req = openai_responses_decode.decode(body, headers)
    assert session_key(req, headers) == ("session:" + headers["session-id"], "header:session-id")
    # Without headers the decoder's client_metadata.session_id comes next.
    bare = openai_responses_decode.decode(body)
    assert session_key(bare, {})[1] == "session_id"
    no_meta = openai_responses_decode.decode({k: v for k, v in body.items()
                                              if k != "client_metadata"})
    assert session_key(no_meta, {}) == ("cache:" + body["prompt_cache_key"], "prompt_cache_key")


# --- content hash -------------------------------------------------------------------------

def test_content_hash_is_stable_across_turns() -> None:
    first = request()
    later = request(messages=(
        msg("system", "be brief"), msg("user", "hello"), msg("assistant", "hi!"),
        msg("user", "and now?"), Message("assistant", (ToolCallPart("c1", "f", "{}"),)),
        Message("user", (ToolResultPart("c1", (TextPart("42"),)),)),
        msg("system", "a late reminder"),
    ))
    assert content_hash(first) == content_hash(later)
    assert len(content_hash(first)) == 32


@pytest.mark.parametrize("messages", [
    (msg("system", "be brief"), msg("user", "goodbye")),
    (msg("system", "be verbose"), msg("user", "hello")),
    (msg("developer", "be brief"), msg("user", "hello")),
    (msg("user", "hello"),),
    (msg("system", "be brief"), msg("user", "hel"), msg("user", "lo")),
])
def test_content_hash_differs_for_a_different_opening(messages: tuple[Message, ...]) -> None:
    assert content_hash(request(messages=messages)) != content_hash(request())


def test_content_hash_without_messages_still_gives_a_key() -> None:
    key, source = session_key(request(messages=()), {})
    assert source == "content_hash" and key.startswith("content:") and len(key) == 40


def test_owned_session_keys_of_two_api_keys_never_meet() -> None:
    headers = {"x-session-id": "same"}
    a = owned_session_key("team-a", request(), headers)
    b = owned_session_key("team-b", request(), headers)
    assert a == ("team-a:session:same", "header:x-session-id")
    assert b[0] != a[0] and b[1] == a[1]
    # the content hash, too, is per key
    assert owned_session_key("team-a", request(), {})[0] != owned_session_key(
        "team-b", request(), {})[0]
