"""Inbound API keys: extraction from headers, identification, token gates."""

from __future__ import annotations

import hmac

import pytest
from pydantic import SecretStr
from starlette.datastructures import Headers

from auth.keys import (
    ANONYMOUS, KeyRing, TokenGate, digest, extract_key, extract_key_from_raw, extract_key_from_scope,
)

EXTRACT = [
    ("bearer", [("Authorization", "Bearer sk-1")], "sk-1"),
    ("bearer lower-case scheme", [("authorization", "bearer sk-1")], "sk-1"),
    ("bearer upper-case scheme", [("Authorization", "BEARER sk-1")], "sk-1"),
    ("bearer padded", [("Authorization", "Bearer   sk-1  ")], "sk-1"),
    ("x-api-key", [("x-api-key", "sk-2")], "sk-2"),
    ("x-api-key mixed case name", [("X-Api-Key", "sk-2")], "sk-2"),
    ("bearer wins over x-api-key", [("x-api-key", "sk-2"), ("authorization", "Bearer sk-1")], "sk-1"),
    ("basic auth falls back to x-api-key", [("authorization", "Basic abc"), ("x-api-key", "sk-2")], "sk-2"),
    ("basic auth alone", [("authorization", "Basic abc")], None),
    ("empty bearer", [("authorization", "Bearer ")], None),
    ("empty x-api-key", [("x-api-key", "  ")], None),
    ("scheme without space", [("authorization", "Bearersk-1")], None),
    ("nothing", [("content-type", "application/json")], None),
]


def raw(pairs: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    # ASGI servers lower-case header names.
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in pairs]


@pytest.mark.parametrize(("case", "pairs", "expected"), EXTRACT, ids=[c[0] for c in EXTRACT])
def test_extract_key(case: str, pairs: list[tuple[str, str]], expected: str | None) -> None:
    assert extract_key(Headers(raw=raw(pairs))) == expected
    assert extract_key(raw(pairs)) == expected
    assert extract_key_from_scope({"type": "http", "headers": raw(pairs)}) == expected
    assert extract_key_from_raw(dict(reversed(raw(pairs)))) == expected  # the gateway's way


def test_keyring_identifies_by_name() -> None:
    ring = KeyRing({"team-a": "sk-a", "team-b": "sk-b", "long": "sk-" + "x" * 200})
    assert ring.enabled and ring.names == ("team-a", "team-b", "long")
    assert ring.identify("sk-a") == "team-a"
    assert ring.identify("sk-b") == "team-b"
    assert ring.identify("sk-" + "x" * 200) == "long"


@pytest.mark.parametrize("presented", [None, "", "sk-", "sk-a ", "SK-A", "sk-ab", "sk-b"[:3], "x" * 1000])
def test_keyring_refuses_anything_else(presented: str | None) -> None:
    assert KeyRing({"team-a": "sk-a"}).identify(presented) is None


def test_keyring_finds_by_digest_and_compares_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # A dict lookup by digest (10,000 keys cost what one does), then one
    # constant-time comparison of equal-length digests; a miss compares nothing.
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    ring = KeyRing({f"k{i}": f"secret-{i}" for i in range(10_000)})
    assert ring.identify("secret-9999") == "k9999"
    assert calls == [(32, 32)]
    calls.clear()
    assert ring.identify("nope") is None
    assert calls == []


def test_keys_added_and_removed_at_run_time() -> None:
    ring = KeyRing({}, required=True)
    assert ring.enabled and ring.identify("sk-new") is None  # required: never opens up
    ring.add("new", digest("sk-new"))
    assert ring.identify("sk-new") == "new"
    ring.add("new", digest("sk-rotated"))
    assert ring.identify("sk-new") is None and ring.identify("sk-rotated") == "new"
    assert ring.remove("new") and not ring.remove("new")
    assert ring.identify("sk-rotated") is None


def test_empty_keyring_lets_everyone_in_as_anonymous() -> None:
    ring = KeyRing({})
    assert not ring.enabled
    assert ring.identify(None) == ANONYMOUS == "anonymous"
    assert ring.identify("whatever") == ANONYMOUS


def test_keyring_accepts_secretstr_and_hides_secrets() -> None:
    ring = KeyRing({"a": SecretStr("sk-hidden")})
    assert ring.identify("sk-hidden") == "a"
    assert "sk-hidden" not in repr(ring) and "a" in repr(ring)


GATES = [
    ("open gate, right token", "tok", "tok", True, False),
    ("open gate, wrong token", "tok", "tok2", False, False),
    ("open gate, prefix", "tok", "to", False, False),
    ("open gate, nothing presented", "tok", None, False, False),
    ("closed gate (None)", None, "tok", False, True),
    ("closed gate (empty)", "", "", False, True),
    ("SecretStr token", SecretStr("tok"), "tok", True, False),
]


@pytest.mark.parametrize(("case", "token", "presented", "ok", "closed"), GATES, ids=[g[0] for g in GATES])
def test_token_gate(case: str, token: object, presented: str | None, ok: bool, closed: bool) -> None:
    gate = TokenGate(token)
    assert gate.check(presented) is ok
    assert gate.closed is closed
    assert "tok" not in repr(gate)


def test_a_secret_another_name_holds_is_refused_without_naming_it():
    ring = KeyRing({"team-a": "sk-a"})
    with pytest.raises(ValueError) as info:
        ring.add("team-b", digest("sk-a"))
    assert "team-b" in str(info.value) and "team-a" not in str(info.value)
    assert ring.identify("sk-a") == "team-a" and ring.names == ("team-a",)
    ring.add("team-a", digest("sk-a"))  # the same name again: a no-op, not a clash
    assert ring.identify("sk-a") == "team-a"
