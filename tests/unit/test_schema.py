"""Schema versions and migrations: a state file written before versions
existed is migrated in place (its keys get ids, its usage rows the ids they
were charged to), and replicas starting together migrate once."""

from __future__ import annotations

import os
import sqlite3
import threading

import pytest

from sessions.database import STATE_FILE, schema_version
from sessions.keystore import KeyStore
from sessions.ledger import StateDB, UsageLedger, open_state_db
from sessions.schema import SCHEMA_VERSION
from tests.support.postgres_server import PostgresServer

# the layout of state files before schema versions (poolgate of issue 9)
LEGACY = """
CREATE TABLE IF NOT EXISTS usage (
    ts REAL NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL, worker TEXT,
    input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL, status INTEGER NOT NULL, error TEXT);
CREATE INDEX IF NOT EXISTS usage_ts ON usage (ts);
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY, digest BLOB NOT NULL UNIQUE, policy TEXT NOT NULL,
    created_at REAL NOT NULL);
"""


def test_a_state_file_from_before_versions_is_migrated(tmp_path) -> None:
    path = os.path.join(str(tmp_path), STATE_FILE)
    old = sqlite3.connect(path)
    old.executescript(LEGACY)
    old.execute("INSERT INTO keys VALUES ('team', ?, ?, 1.0)", (b"\x01" * 32, b'{"rpm": 5}'))
    old.executemany("INSERT INTO usage VALUES (?, ?, 'm', 'w', ?, ?, 0, 200, NULL)",
                    [(100.0, "team", 3, 4), (101.0, "cfg", 10, 1), (102.0, "team", 1, 1)])
    old.commit()
    old.close()

    db = StateDB(str(tmp_path))
    try:
        assert schema_version(db) == SCHEMA_VERSION
        [team] = KeyStore(db).all()
        assert team.name == "team" and team.id.startswith("key:") and team.digest == b"\x01" * 32
        assert dict(team.policy) == {"rpm": 5}
        ledger = UsageLedger(db, flush_interval=3600)
        # usage rows follow the key's new id; a config key's id is its name
        assert ledger.tokens_by_key(0) == {team.id: (2, 4, 5), "cfg": (1, 10, 1)}
        ledger.add(200.0, "team", "m", "w", 1, 0, 0, 200, None, team.id)
        assert ledger.tokens_by_key(150)[team.id] == (1, 1, 0)
        ledger.close()
    finally:
        db.close()
    again = StateDB(str(tmp_path))  # a second start finds nothing to do
    try:
        assert [k.id for k in KeyStore(again).all()] == [team.id]
    finally:
        again.close()


def test_a_newer_schema_is_refused(tmp_path) -> None:
    db = StateDB(str(tmp_path))
    db.write("UPDATE schema_version SET version = ?", [(SCHEMA_VERSION + 1,)])
    db.close()
    with pytest.raises(RuntimeError, match="newer poolgate"):
        StateDB(str(tmp_path))


@pytest.mark.slow
def test_replicas_starting_together_on_postgres_migrate_once() -> None:
    server = PostgresServer().start()
    try:
        url = server.create_database("together")
        opened, errors = [], []

        def start() -> None:
            try:
                opened.append(open_state_db(url))
            except Exception as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)

        threads = [threading.Thread(target=start) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and len(opened) == 4
        assert schema_version(opened[0]) == SCHEMA_VERSION
        assert opened[0].read("SELECT COUNT(*) FROM schema_version") == [(1,)]
        for db in opened:
            db.close()
    finally:
        server.close()
