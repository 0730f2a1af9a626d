"""The usage ledger: one row per answered request, in SQLite.

:class:`StateDB` is the one SQLite connection (a file in the state directory,
WAL; ``:memory:`` when there is none) shared by the ledger and the run-time
key store, behind one lock. :class:`UsageLedger` keeps writes off the request
path: :meth:`UsageLedger.add` appends a tuple to a deque (O(1), no I/O) and a
thread writes what accumulated every ``flush_interval`` seconds in one
transaction, so a process killed outright loses at most that much. Reads
flush first, so they see every request answered before them.
"""

from __future__ import annotations

import collections
import os
import sqlite3
import threading
from typing import Any, Iterator, Sequence

__all__ = ["StateDB", "UsageLedger", "GROUPS", "STATE_FILE", "MEMORY_MAX_ROWS"]

STATE_FILE = "poolgate.sqlite3"
GROUPS = ("key", "model", "day")
_GROUP_SQL = {"key": "key", "model": "model", "day": "strftime('%Y-%m-%d', ts, 'unixepoch')"}
# An error is a refusal (status >= 400) or a stream that ended with an error
# frame; a client that left is not the gateway's error.
_ERROR_SQL = ("SUM(CASE WHEN status >= 400 OR (error IS NOT NULL AND error != "
              "'client_disconnected') THEN 1 ELSE 0 END)")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    ts REAL NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL, worker TEXT,
    input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL, status INTEGER NOT NULL, error TEXT);
CREATE INDEX IF NOT EXISTS usage_ts ON usage (ts);
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY, digest BLOB NOT NULL UNIQUE, policy TEXT NOT NULL,
    created_at REAL NOT NULL);
"""

Row = tuple[float, str, str, str | None, int, int, int, int, str | None]


class StateDB:
    """One SQLite connection and its lock; ``directory`` None keeps it in memory."""

    def __init__(self, directory: str | None) -> None:
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
            self.path = os.path.join(directory, STATE_FILE)
        else:
            self.path = ":memory:"
        self.lock = threading.Lock()
        self.conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        if directory is not None:
            self.conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL: a commit survives the process being killed (not a power cut)
            self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(_SCHEMA)

    def write(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run ``sql`` for every row in one transaction; the rows changed."""
        with self.lock:
            conn = self.conn
            conn.execute("BEGIN")
            try:
                cursor = conn.executemany(sql, rows)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return cursor.rowcount

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.lock:
            return self.conn.execute(sql, params).fetchall()

    def close(self) -> None:
        with self.lock:
            self.conn.close()


# Rows an in-memory ledger keeps (about 100 bytes each): without a state
# directory nothing else bounds it, and a busy gateway answers millions a day.
MEMORY_MAX_ROWS = 200_000


class UsageLedger:
    """Answered requests, batched into ``db`` by a writer thread.

    ``max_rows``: keep only the newest this many (the oldest go at each
    flush); ``None`` keeps every row (a file: the record operators keep)."""

    def __init__(self, db: StateDB, *, flush_interval: float = 0.25,
                 max_rows: int | None = None) -> None:
        self.db = db
        self.max_rows = max_rows
        self._pending: collections.deque[Row] = collections.deque()
        self._stop = threading.Event()
        self._interval = flush_interval
        self._thread = threading.Thread(target=self._run, name="usage-ledger", daemon=True)
        self._thread.start()

    def add(self, ts: float, key: str, model: str, worker: str | None, input_tokens: int,
            output_tokens: int, cached_tokens: int, status: int, error: str | None) -> None:
        """Record one answered request (no I/O: the writer thread stores it)."""
        self._pending.append((ts, key, model, worker, input_tokens, output_tokens,
                              cached_tokens, status, error))

    def flush(self) -> int:
        """Write what is pending now; the number of rows written."""
        rows = list(self._drain())
        if rows:
            self.db.write("INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            if self.max_rows is not None:
                # rowids grow with each insert: the newest max_rows are the highest
                self.db.write("DELETE FROM usage WHERE rowid <= "
                              "(SELECT MAX(rowid) FROM usage) - ?", [(self.max_rows,)])
        return len(rows)

    def _drain(self) -> Iterator[Row]:
        pending = self._pending
        while pending:
            yield pending.popleft()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.flush()

    def usage(self, *, key: str | None = None, model: str | None = None,
              since: float | None = None, until: float | None = None,
              group_by: Sequence[str] = GROUPS) -> list[dict[str, Any]]:
        """Rows of counts grouped by ``group_by`` (a subset of :data:`GROUPS`),
        over ``since <= ts < until``, for one key and/or model when given."""
        self.flush()
        where, params = [], []
        for column, value in (("key = ?", key), ("model = ?", model), ("ts >= ?", since),
                              ("ts < ?", until)):
            if value is not None:
                where.append(column)
                params.append(value)
        groups = [g for g in GROUPS if g in group_by]
        select = [f"{_GROUP_SQL[g]} AS {g}" for g in groups]
        sql = (f"SELECT {', '.join([*select, 'COUNT(*)', 'SUM(input_tokens)', 'SUM(output_tokens)', 'SUM(cached_tokens)', _ERROR_SQL])}"
               f" FROM usage{' WHERE ' + ' AND '.join(where) if where else ''}")
        if groups:
            sql += f" GROUP BY {', '.join(groups)} ORDER BY {', '.join(groups)}"
        out = []
        for row in self.db.read(sql, params):
            n = len(groups)
            requests, tokens_in, tokens_out, cached, errors = row[n:]
            if not requests:
                continue  # no grouping and no rows: nothing to report
            item = dict(zip(groups, row[:n]))
            item.update(requests=requests, input_tokens=tokens_in or 0,
                        output_tokens=tokens_out or 0, cached_tokens=cached or 0,
                        errors=errors or 0)
            out.append(item)
        return out

    def tokens_by_key(self, since: float) -> dict[str, tuple[int, int, int]]:
        """key -> (requests, input, output tokens) since ``since``."""
        self.flush()
        rows = self.db.read("SELECT key, COUNT(*), SUM(input_tokens), SUM(output_tokens) "
                            "FROM usage WHERE ts >= ? GROUP BY key", (since,))
        return {k: (n, i or 0, o or 0) for k, n, i, o in rows}
