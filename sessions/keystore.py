"""API keys created at run time (``POST /internal/keys``), in the state file.

A key is stored as the SHA-256 digest of its secret, never the secret; its
policy as JSON. Config keys are not stored here: they come from the
configuration on every start.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Mapping

import orjson

from .ledger import StateDB

__all__ = ["StoredKey", "KeyStore", "KeyExists"]


class KeyExists(Exception):
    """A key with that name (or that secret) is already stored."""


@dataclass(frozen=True, slots=True)
class StoredKey:
    name: str
    digest: bytes
    policy: Mapping[str, Any]  # models, max_in_flight, rpm, tpm, budget_tokens
    created_at: float


class KeyStore:
    def __init__(self, db: StateDB) -> None:
        self.db = db

    def all(self) -> list[StoredKey]:
        rows = self.db.read("SELECT name, digest, policy, created_at FROM keys ORDER BY name")
        return [StoredKey(n, bytes(d), orjson.loads(p), c) for n, d, p, c in rows]

    def create(self, name: str, digest: bytes, policy: Mapping[str, Any]) -> StoredKey:
        key = StoredKey(name, digest, dict(policy), time.time())
        try:
            self.db.write("INSERT INTO keys VALUES (?, ?, ?, ?)",
                          [(name, digest, orjson.dumps(key.policy), key.created_at)])
        except sqlite3.IntegrityError:
            raise KeyExists(name) from None
        return key

    def update(self, name: str, policy: Mapping[str, Any]) -> bool:
        return self.db.write("UPDATE keys SET policy = ? WHERE name = ?",
                             [(orjson.dumps(dict(policy)), name)]) > 0

    def delete(self, name: str) -> bool:
        return self.db.write("DELETE FROM keys WHERE name = ?", [(name,)]) > 0
