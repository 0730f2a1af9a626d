"""API keys created at run time (``POST /internal/keys``), in the database.

A key is stored as the SHA-256 digest of its secret, never the secret; its
policy as JSON; and an immutable ``id`` that owns what the key creates
(stored responses, usage rows), so a later key with the same name inherits
nothing. Every change bumps ``key_version`` in the same transaction: other
replicas poll it (:meth:`KeyStore.version`) and reload when it moved. Config
keys are not stored here: they come from the configuration on every start.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Mapping

import orjson

from .database import Database, DuplicateRow

__all__ = ["StoredKey", "KeyStore", "KeyExists", "new_key_id"]

_BUMP = ("UPDATE key_version SET version = version + 1 WHERE one = 1", [()])


class KeyExists(Exception):
    """A key with that name (or that secret) is already stored."""


def new_key_id() -> str:
    """A run-time key's id: ``key:`` and 24 hex digits (no key name has a colon)."""
    return "key:" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class StoredKey:
    id: str
    name: str
    digest: bytes
    policy: Mapping[str, Any]  # models, max_in_flight, rpm, tpm, budget_tokens
    created_at: float


class KeyStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def all(self) -> list[StoredKey]:
        rows = self.db.read("SELECT id, name, digest, policy, created_at FROM keys ORDER BY name")
        return [StoredKey(i, n, bytes(d), orjson.loads(p), c) for i, n, d, p, c in rows]

    def version(self) -> int:
        """The number every key change increments (for replicas to notice one)."""
        rows = self.db.read("SELECT version FROM key_version WHERE one = 1")
        return int(rows[0][0]) if rows else 0

    def create(self, name: str, digest: bytes, policy: Mapping[str, Any]) -> StoredKey:
        now = time.time()
        key = StoredKey(new_key_id(), name, digest, dict(policy), now)
        try:
            self.db.transaction([
                ("INSERT INTO keys (id, name, digest, policy, created_at, updated_at) "
                 "VALUES (?, ?, ?, ?, ?, ?)",
                 [(key.id, name, digest, orjson.dumps(key.policy).decode(), now, now)]),
                _BUMP])
        except DuplicateRow:
            raise KeyExists(name) from None
        return key

    def update(self, name: str, policy: Mapping[str, Any]) -> bool:
        changed, _ = self.db.transaction([
            ("UPDATE keys SET policy = ?, updated_at = ? WHERE name = ?",
             [(orjson.dumps(dict(policy)).decode(), time.time(), name)]), _BUMP])
        return changed > 0

    def delete(self, name: str) -> str | None:
        """Delete the key named ``name``; its id (None if there was none)."""
        rows = self.db.read("SELECT id FROM keys WHERE name = ?", (name,))
        if not rows:
            return None
        key_id = rows[0][0]
        deleted, _ = self.db.transaction([("DELETE FROM keys WHERE id = ?", [(key_id,)]),
                                          _BUMP])
        return key_id if deleted else None
