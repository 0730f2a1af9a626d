"""The database's tables and the migrations that get any earlier file there.

``schema_version`` holds one number; :func:`migrate` runs the steps above it,
each in one transaction with the new number (PostgreSQL: under an advisory
lock, so replicas starting together migrate once). Version 1 is the layout
state files had before versions were recorded (usage rows by key name, keys
by name); a file of that age is recognised and migrated, not rebuilt.

Version 2: keys get an immutable ``id`` (ownership is by id; a new key with
an old name is another key), usage rows the ``key_id`` they were charged to,
and ``key_version`` a counter bumped with every key change (replicas poll it).
A config key's id is its name (``anonymous`` when auth is off): config names
are the operator's identity for them; run-time ids are ``key:<hex>``, which
no name can be.
"""

from __future__ import annotations

import structlog

from .database import Database, schema_version

__all__ = ["migrate", "SCHEMA_VERSION"]

log = structlog.get_logger("poolgate.database")

_V1 = {
    "sqlite": """
CREATE TABLE IF NOT EXISTS usage (
    ts REAL NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL, worker TEXT,
    input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL, status INTEGER NOT NULL, error TEXT);
CREATE INDEX IF NOT EXISTS usage_ts ON usage (ts);
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY, digest BLOB NOT NULL UNIQUE, policy TEXT NOT NULL,
    created_at REAL NOT NULL);
""",
    "postgresql": """
CREATE TABLE IF NOT EXISTS usage (
    ts DOUBLE PRECISION NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL, worker TEXT,
    input_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL, status INTEGER NOT NULL, error TEXT);
CREATE INDEX IF NOT EXISTS usage_ts ON usage (ts);
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY, digest BYTEA NOT NULL UNIQUE, policy TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL);
""",
}

_V2 = {
    "sqlite": """
ALTER TABLE keys RENAME TO keys_v1;
CREATE TABLE keys (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, digest BLOB NOT NULL UNIQUE,
    policy TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL);
INSERT INTO keys SELECT 'key:' || lower(hex(randomblob(12))), name, digest, policy,
    created_at, created_at FROM keys_v1;
DROP TABLE keys_v1;
ALTER TABLE usage ADD COLUMN key_id TEXT;
UPDATE usage SET key_id = COALESCE((SELECT id FROM keys WHERE keys.name = usage.key), key);
CREATE INDEX usage_key_id_ts ON usage (key_id, ts);
CREATE TABLE key_version (one INTEGER PRIMARY KEY CHECK (one = 1), version INTEGER NOT NULL);
INSERT INTO key_version VALUES (1, 0);
""",
    "postgresql": """
ALTER TABLE keys RENAME TO keys_v1;
CREATE TABLE keys (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, digest BYTEA NOT NULL UNIQUE,
    policy TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL);
INSERT INTO keys SELECT 'key:' || substr(md5(random()::text || name), 1, 24), name, digest,
    policy, created_at, created_at FROM keys_v1;
DROP TABLE keys_v1;
ALTER TABLE usage ADD COLUMN key_id TEXT;
UPDATE usage SET key_id = COALESCE((SELECT id FROM keys WHERE keys.name = usage.key), key);
CREATE INDEX usage_key_id_ts ON usage (key_id, ts);
CREATE TABLE key_version (one INTEGER PRIMARY KEY CHECK (one = 1), version BIGINT NOT NULL);
INSERT INTO key_version VALUES (1, 0);
""",
}

_STEPS = (_V1, _V2)
SCHEMA_VERSION = len(_STEPS)


def migrate(db: Database) -> int:
    """Bring ``db`` to :data:`SCHEMA_VERSION`; the version it had (0: none)."""
    found = version = schema_version(db)
    if found > SCHEMA_VERSION:
        raise RuntimeError(f"the database has schema version {found}; this poolgate knows "
                           f"up to {SCHEMA_VERSION} (a newer poolgate wrote it)")
    while version < SCHEMA_VERSION:
        statements = [s.strip() for s in _STEPS[version][db.dialect].split(";") if s.strip()]
        if db.migrate_step(version, statements, version + 1):
            log.info("database.migrated", to_version=version + 1, where=db.where)
        version = schema_version(db)  # another process may have migrated meanwhile
    return found
