"""The usage ledger and the run-time key store on SQLite, in memory and in a file."""

from __future__ import annotations

import calendar

import pytest

from sessions.keystore import KeyExists, KeyStore
from sessions.ledger import StateDB, UsageLedger

DAY1 = float(calendar.timegm((2026, 11, 23, 10, 0, 0)))
DAY2 = DAY1 + 86400


@pytest.fixture
def ledger():
    db = StateDB(None)
    ledger = UsageLedger(db, flush_interval=3600)  # flushed by reads only
    yield ledger
    ledger.close()
    db.close()


def _fill(ledger: UsageLedger) -> None:
    ledger.add(DAY1, "a", "m1", "w", 10, 5, 2, 200, None)
    ledger.add(DAY1 + 1, "a", "m1", "w", 20, 7, 0, 200, None)
    ledger.add(DAY1 + 2, "a", "m2", None, 0, 0, 0, 404, "not_found")
    ledger.add(DAY2, "b", "m1", "w", 1, 1, 0, 200, "client_disconnected")
    ledger.add(DAY2 + 1, "b", "m1", "w", 1, 0, 0, 200, "upstream")


def test_grouped_rows_have_only_their_fields(ledger) -> None:
    _fill(ledger)
    rows = ledger.usage()
    assert rows == [
        {"key": "a", "key_id": "a", "model": "m1", "day": "2026-11-23", "requests": 2,
         "input_tokens": 30, "output_tokens": 12, "cached_tokens": 2, "errors": 0},
        {"key": "a", "key_id": "a", "model": "m2", "day": "2026-11-23", "requests": 1,
         "input_tokens": 0, "output_tokens": 0, "cached_tokens": 0, "errors": 1},
        {"key": "b", "key_id": "b", "model": "m1", "day": "2026-11-24", "requests": 2,
         "input_tokens": 2,
         "output_tokens": 1, "cached_tokens": 0, "errors": 1},  # a client leaving is no error
    ]
    assert ledger.usage(group_by=["day"]) == [
        {"day": "2026-11-23", "requests": 3, "input_tokens": 30, "output_tokens": 12,
         "cached_tokens": 2, "errors": 1},
        {"day": "2026-11-24", "requests": 2, "input_tokens": 2, "output_tokens": 1,
         "cached_tokens": 0, "errors": 1}]
    assert ledger.usage(group_by=[]) == [{"requests": 5, "input_tokens": 32, "output_tokens": 13,
                                          "cached_tokens": 2, "errors": 2}]


def test_a_bounded_ledger_keeps_the_newest_rows() -> None:
    db = StateDB(None)
    ledger = UsageLedger(db, flush_interval=3600, max_rows=3)
    try:
        _fill(ledger)  # five rows, two days
        assert ledger.usage(group_by=[])[0]["requests"] == 3
        assert [(r["key"], r["requests"]) for r in ledger.usage(group_by=["key"])] == [
            ("a", 1), ("b", 2)]  # the two oldest of key a went
        ledger.add(DAY2 + 2, "c", "m1", "w", 1, 1, 0, 200, None)
        assert [(r["key"], r["requests"]) for r in ledger.usage(group_by=["key"])] == [
            ("b", 2), ("c", 1)]
    finally:
        ledger.close()
        db.close()


def test_filters(ledger) -> None:
    assert ledger.usage(group_by=[]) == []  # nothing recorded: no row, not a row of zeros
    _fill(ledger)
    assert [r["requests"] for r in ledger.usage(key="a", model="m1", group_by=["key"])] == [2]
    assert [r["key"] for r in ledger.usage(since=DAY2, group_by=["key"])] == ["b"]
    assert [r["key"] for r in ledger.usage(until=DAY2, group_by=["key"])] == ["a"]
    assert ledger.usage(since=DAY2 + 10) == []
    assert ledger.tokens_by_key(DAY1 + 1) == {"a": (2, 20, 7), "b": (2, 2, 1)}


def test_file_survives_reopening_and_keys_are_stored(tmp_path) -> None:
    db = StateDB(str(tmp_path))
    ledger = UsageLedger(db, flush_interval=0.05)
    ledger.add(DAY1, "a", "m1", "w", 3, 4, 0, 200, None)
    keys = KeyStore(db)
    team = keys.create("team", b"\x01" * 32, {"rpm": 5})
    assert team.id.startswith("key:")
    with pytest.raises(KeyExists):
        keys.create("team", b"\x02" * 32, {})
    assert keys.update("team", {"rpm": 6}) and not keys.update("nobody", {})
    ledger.close()
    db.close()
    db = StateDB(str(tmp_path))
    assert db.read("PRAGMA journal_mode")[0][0] == "wal"
    again = UsageLedger(db)
    assert again.usage(group_by=["key"])[0]["output_tokens"] == 4
    stored = KeyStore(db).all()
    assert [(k.id, k.name, k.digest, dict(k.policy)) for k in stored] == [
        (team.id, "team", b"\x01" * 32, {"rpm": 6})]
    assert KeyStore(db).delete("team") == team.id and KeyStore(db).delete("team") is None
    again.close()
    db.close()


async def test_the_gateway_bounds_only_an_in_memory_ledger(tmp_path) -> None:
    import contextlib

    from app.gateway import Gateway
    from app.state import open_state
    from sessions.ledger import MEMORY_MAX_ROWS

    for state_dir, bound in ((None, MEMORY_MAX_ROWS), (str(tmp_path), None)):
        gw = Gateway(settings=None, metrics=None, admin=None, metrics_gate=None,
                     metrics_public=False, max_body_bytes=1)
        async with contextlib.AsyncExitStack() as stack:
            await open_state(gw, state_dir, stack)
            assert gw.ledger is not None and gw.ledger.max_rows == bound
