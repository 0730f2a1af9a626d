"""The usage ledger: one row per answered request, in the SQL database.

:class:`UsageLedger` keeps writes off the request path: :meth:`UsageLedger.add`
appends a tuple to a deque (O(1), no I/O) and a thread writes what
accumulated every ``flush_interval`` seconds in one transaction. Rows are
done with only once committed (a batch whose write fails goes back to the
front of the deque, in order): a write that fails ("database is locked", a
lost PostgreSQL connection) is retried with backoff, and past
``max_pending`` rows the oldest are spilled to a file in the state directory
(:class:`~sessions.backlog.Backlog`) and written back first when the
database answers again, by this process or the next. Reads flush first, so
they see every request answered before them.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Sequence

import structlog

from .backlog import Backlog
from .database import Database, DatabaseUnavailable, SqliteDatabase, sqlite_url, open_database
from .schema import migrate

__all__ = ["StateDB", "UsageLedger", "GROUPS", "MEMORY_MAX_ROWS", "open_state_db"]

log = structlog.get_logger("poolgate.ledger")

GROUPS = ("key", "model", "day")
_DAY_SQL = {"sqlite": "strftime('%Y-%m-%d', ts, 'unixepoch')",
            "postgresql": "to_char(to_timestamp(ts) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"}
# An error is a refusal (status >= 400) or a stream that ended with an error
# frame; a client that left is not the gateway's error.
_ERROR_SQL = ("SUM(CASE WHEN status >= 400 OR (error IS NOT NULL AND error != "
              "'client_disconnected') THEN 1 ELSE 0 END)")
_INSERT = ("INSERT INTO usage (ts, key, model, worker, input_tokens, output_tokens, "
           "cached_tokens, status, error, key_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")

# ts, key name, model, worker, input, output, cached tokens, status, error, key id
Row = tuple[float, str, str, str | None, int, int, int, int, str | None, str]


def open_state_db(url: str) -> Database:
    """Connect to ``url`` and migrate its schema to this version."""
    db = open_database(url)
    try:
        migrate(db)
    except BaseException:
        db.close()
        raise
    return db


def StateDB(directory: str | None) -> Database:  # noqa: N802 (the name it always had)
    """The SQLite state file in ``directory`` (memory when None), migrated."""
    return open_state_db(sqlite_url(directory))


# Rows an in-memory ledger keeps (about 100 bytes each): without a state
# directory nothing else bounds it, and a busy gateway answers millions a day.
MEMORY_MAX_ROWS = 200_000
MAX_PENDING = 50_000  # rows waiting in memory for the database before the oldest spill
BATCH = 5_000  # rows per transaction
RETRY_FIRST, RETRY_MAX = 0.1, 5.0  # seconds between failed writes: doubling up to the max


class UsageLedger:
    """Answered requests, batched into ``db`` by a writer thread.

    ``max_rows``: keep only the newest this many (the oldest go at each
    flush; an in-memory database); ``None`` keeps every row (the record
    operators keep). ``spill_dir``: where rows go past ``max_pending`` while
    the database does not take them; without one the oldest are dropped then
    (counted in ``dropped``)."""

    def __init__(self, db: Database, *, flush_interval: float = 0.25,
                 max_rows: int | None = None, spill_dir: str | None = None,
                 max_pending: int = MAX_PENDING) -> None:
        self.db = db
        self.max_rows = max_rows
        self.max_pending = max_pending
        self.backlog = Backlog(spill_dir) if spill_dir is not None else None
        self.failures = 0  # failed write attempts
        self.dropped = 0  # rows lost: past max_pending with nowhere to spill
        self.up = True  # the last write attempt succeeded
        self._pending: collections.deque[Row] = collections.deque()
        self._batch: list[Row] = []  # taken off the deque, being written
        self._flushing = threading.Lock()  # one writer at a time: rows leave once, in order
        self._stop = threading.Event()
        self._interval = flush_interval
        self._thread = threading.Thread(target=self._run, name="usage-ledger", daemon=True)
        self._thread.start()

    def add(self, ts: float, key: str, model: str, worker: str | None, input_tokens: int,
            output_tokens: int, cached_tokens: int, status: int, error: str | None,
            key_id: str | None = None) -> None:
        """Record one answered request (no I/O: the writer thread stores it).
        ``key_id``: the key's immutable id (a config key's is its name)."""
        self._pending.append((ts, key, model, worker, input_tokens, output_tokens,
                              cached_tokens, status, error, key if key_id is None else key_id))

    @property
    def backlog_rows(self) -> int:
        """Rows answered but not yet in the database (in memory and spilled)."""
        return len(self._pending) + len(self._batch) + (self.backlog.rows if self.backlog is not None else 0)

    def flush(self) -> int:
        """Write what is pending now (spilled rows first); the number of rows
        written. Raises :class:`DatabaseUnavailable`, keeping every row, when
        the database does not take them."""
        with self._flushing:
            try:
                written = self._write_all()
            except DatabaseUnavailable:
                self.failures += 1
                self.up = False
                raise
            self.up = True
            return written

    def _write_all(self) -> int:
        written = self.backlog.replay(self._insert, BATCH) if self.backlog is not None else 0
        pending = self._pending
        while pending:
            # popleft, not a look: add() appends meanwhile, and a deque must not
            # change under an iterator. The batch counts as pending until committed.
            batch = self._batch = [pending.popleft() for _ in range(min(len(pending), BATCH))]
            try:
                self._insert(batch)
            except BaseException:
                pending.extendleft(reversed(batch))  # back in front, in order
                raise
            finally:
                self._batch = []
            written += len(batch)
        return written

    def _insert(self, rows: Sequence[Row]) -> None:
        statements: list[tuple[str, Sequence[Sequence[Any]]]] = [(_INSERT, rows)]
        if self.max_rows is not None and isinstance(self.db, SqliteDatabase):
            # rowids grow with each insert: the newest max_rows are the highest
            statements.append(("DELETE FROM usage WHERE rowid <= "
                               "(SELECT MAX(rowid) FROM usage) - ?", [(self.max_rows,)]))
        self.db.transaction(statements)

    def _bound(self) -> None:
        """Past ``max_pending`` rows in memory, the oldest half go to the backlog file."""
        excess = len(self._pending) - self.max_pending
        if excess <= 0:
            return
        with self._flushing:
            count = max(excess, self.max_pending // 2)
            oldest = [self._pending.popleft() for _ in range(min(count, len(self._pending)))]
            if self.backlog is not None:
                try:
                    self.backlog.spill(oldest)
                    log.warning("ledger.spilled", rows=len(oldest), file=self.backlog.path)
                    return
                except OSError as exc:
                    self._pending.extendleft(reversed(oldest))  # kept: the disk may come back
                    log.error("ledger.spill_failed", error=str(exc))
                    return
            self.dropped += len(oldest)
            log.error("ledger.rows_dropped", rows=len(oldest),
                      reason="database unavailable and no state_dir to spill to")

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay or self._interval):
            try:
                self.flush()
                if delay:
                    log.info("ledger.recovered", where=self.db.where)
                delay = 0.0
            except DatabaseUnavailable as exc:
                delay = min(RETRY_MAX, delay * 2 if delay else RETRY_FIRST)
                log.warning("ledger.write_failed", error=str(exc), backlog=self.backlog_rows,
                            retry_in=delay)
                self._bound()
            except Exception:  # a bug must not end the writer: rows stay queued
                delay = RETRY_MAX
                log.exception("ledger.writer_error")

    def close(self, timeout: float = 5.0) -> None:
        """Stop the writer and write what is left, retrying for up to ``timeout``
        seconds; what the database still refuses then goes to the backlog file."""
        self._stop.set()
        self._thread.join(timeout=30)
        deadline = time.monotonic() + timeout
        delay = RETRY_FIRST
        while True:
            try:
                self.flush()
                return
            except DatabaseUnavailable as exc:
                if time.monotonic() + delay > deadline:
                    self._give_up(exc)
                    return
                time.sleep(delay)
                delay = min(RETRY_MAX, delay * 2)

    def _give_up(self, exc: Exception) -> None:
        with self._flushing:
            rows = list(self._pending)
            self._pending.clear()
            if self.backlog is not None:
                self.backlog.spill(rows)
                log.warning("ledger.spilled_at_exit", rows=len(rows), file=self.backlog.path,
                            error=str(exc))
            elif rows:
                self.dropped += len(rows)
                log.error("ledger.rows_dropped", rows=len(rows), error=str(exc))

    def _flush_for_read(self) -> None:
        if not self.up:
            return  # the writer is retrying: read what is there, do not wait for it
        try:
            self.flush()
        except DatabaseUnavailable:
            pass  # the read says whether the database answers

    def usage(self, *, key: str | None = None, model: str | None = None,
              since: float | None = None, until: float | None = None,
              group_by: Sequence[str] = GROUPS) -> list[dict[str, Any]]:
        """Rows of counts grouped by ``group_by`` (a subset of :data:`GROUPS`),
        over ``since <= ts < until``, for one key (a name: every key that had
        it; or an id) and/or model when given. Grouped by key, a row is one
        key id, with the name it had."""
        self._flush_for_read()
        where, params = [], []
        for column, value in (("(key = ? OR key_id = ?)", key), ("model = ?", model),
                              ("ts >= ?", since), ("ts < ?", until)):
            if value is not None:
                where.append(column)
                params.extend([value] * column.count("?"))
        groups = [g for g in GROUPS if g in group_by]
        columns = {"key": ["key", "key_id"], "model": ["model"],
                   "day": [f"{_DAY_SQL[self.db.dialect]}"]}
        select = [c for g in groups for c in columns[g]]
        sums = ["COUNT(*)", *(f"CAST(SUM({c}) AS BIGINT)" for c in
                              ("input_tokens", "output_tokens", "cached_tokens")),
                f"CAST({_ERROR_SQL} AS BIGINT)"]
        sql = (f"SELECT {', '.join([*select, *sums])} FROM usage"
               f"{' WHERE ' + ' AND '.join(where) if where else ''}")
        if groups:
            sql += f" GROUP BY {', '.join(select)} ORDER BY {', '.join(select)}"
        names = [n for g in groups for n in (("key", "key_id") if g == "key" else (g,))]
        out = []
        for row in self.db.read(sql, params):
            n = len(names)
            requests, tokens_in, tokens_out, cached, errors = row[n:]
            if not requests:
                continue  # no grouping and no rows: nothing to report
            item = dict(zip(names, row[:n]))
            item.update(requests=requests, input_tokens=tokens_in or 0,
                        output_tokens=tokens_out or 0, cached_tokens=cached or 0,
                        errors=errors or 0)
            out.append(item)
        return out

    def tokens_by_key(self, since: float) -> dict[str, tuple[int, int, int]]:
        """key id -> (requests, input, output tokens) since ``since``: what
        budgets count (a config key's id is its name; see sessions.schema)."""
        self._flush_for_read()
        rows = self.db.read("SELECT key_id, COUNT(*), CAST(SUM(input_tokens) AS BIGINT), "
                            "CAST(SUM(output_tokens) AS BIGINT) FROM usage WHERE ts >= ? "
                            "GROUP BY key_id", (since,))
        return {k: (n, i or 0, o or 0) for k, n, i, o in rows}
