"""The gateway's SQL database: SQLite (one file in ``state_dir``, or memory)
or PostgreSQL (``server.database_url = "postgresql://…"``, shared by replicas).

One connection per process behind one lock, used from threads (the ledger's
writer, ``asyncio.to_thread`` for the rest): statements are short, and a
thread is what both drivers block in. psycopg 3 is the PostgreSQL driver: it
is maintained, ships libpq in its wheel, and has the same API sync and async.

SQL is written once with ``?`` placeholders; :class:`PostgresDatabase` turns
them into ``%s``. Driver errors are mapped once, here: a lost or locked
database is :class:`DatabaseUnavailable` (callers retry), a duplicate is
:class:`DuplicateRow`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import urllib.parse
from typing import Any, Protocol, Sequence

__all__ = ["Database", "SqliteDatabase", "PostgresDatabase", "DatabaseUnavailable",
           "DuplicateRow", "open_database", "schema_version", "sqlite_url", "redact", "STATE_FILE",
           "BUSY_TIMEOUT"]

STATE_FILE = "poolgate.sqlite3"
BUSY_TIMEOUT = 5.0  # seconds SQLite waits for another connection's lock
CONNECT_TIMEOUT = 5  # seconds to reach PostgreSQL
STATEMENT_TIMEOUT_MS = 30_000
TCP_USER_TIMEOUT_MS = 15_000

Statement = tuple[str, Sequence[Sequence[Any]]]


class DatabaseUnavailable(Exception):
    """The database cannot be reached or is locked now; the caller may retry."""


class DuplicateRow(Exception):
    """A unique constraint refused the row."""


class Database(Protocol):
    dialect: str  # "sqlite" or "postgresql"
    where: str  # for logs: the file, or the URL without its password

    def write(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run ``sql`` for every row in one transaction; the rows changed."""
        ...

    def transaction(self, statements: Sequence[Statement]) -> list[int]:
        """Run several statements (each for its rows) in one transaction."""
        ...

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def migrate_step(self, before: int, statements: Sequence[str], after: int) -> bool:
        """One migration, atomic, if the schema is still at ``before``."""
        ...

    def close(self) -> None: ...


def sqlite_url(state_dir: str | None) -> str:
    """The default ``database_url``: the state file in ``state_dir`` (memory without one)."""
    if state_dir is None:
        return "sqlite://"
    return "sqlite:///" + os.path.abspath(os.path.join(state_dir, STATE_FILE))


def redact(url: str) -> str:
    """``url`` without a password, for logs and errors."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def open_database(url: str) -> Database:
    """Connect to ``url`` (``sqlite://`` memory, ``sqlite:///path``, ``postgresql://…``)."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresDatabase(url)
    if url.startswith("sqlite://"):
        path = url[len("sqlite://"):]
        if path in ("", "/", "/:memory:"):
            return SqliteDatabase(None)
        return SqliteDatabase(path[1:] if path.startswith("//") else path)
    raise ValueError("database_url must start with sqlite:// or postgresql://")


class SqliteDatabase:
    """One SQLite connection and its lock; ``path`` None keeps it in memory."""

    dialect = "sqlite"

    def __init__(self, path: str | None, *, busy_timeout: float = BUSY_TIMEOUT) -> None:
        if path is not None:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path if path is not None else ":memory:"
        self.where = self.path
        self.lock = threading.Lock()
        self.conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                    timeout=busy_timeout)
        if path is not None:
            self.conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL: a commit survives the process being killed (not a power cut)
            self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute(_VERSION_TABLE)

    def write(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return self.transaction([(sql, rows)])[0]

    def transaction(self, statements: Sequence[Statement]) -> list[int]:
        with self.lock:
            conn = self.conn
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise DatabaseUnavailable(str(exc)) from exc
            try:
                counts = [conn.executemany(sql, rows).rowcount for sql, rows in statements]
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.IntegrityError):
                    raise DuplicateRow(str(exc)) from exc
                if isinstance(exc, sqlite3.OperationalError):
                    raise DatabaseUnavailable(str(exc)) from exc
                raise
            return counts

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.lock:
            try:
                return self.conn.execute(sql, params).fetchall()
            except sqlite3.OperationalError as exc:
                raise DatabaseUnavailable(str(exc)) from exc

    def migrate_step(self, before: int, statements: Sequence[str], after: int) -> bool:
        """Run ``statements`` and set ``schema_version`` to ``after`` in one transaction,
        if the version is still ``before`` once the write lock is held (another
        process may have migrated meanwhile); whether this call migrated."""
        with self.lock:
            conn = self.conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    if _current(conn.execute(_VERSION_SQL).fetchall()) != before:
                        conn.execute("ROLLBACK")
                        return False
                    for sql in (*statements, *_set_version(after)):
                        conn.execute(sql)
                    conn.execute("COMMIT")
                    return True
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:
                raise DatabaseUnavailable(str(exc)) from exc

    def close(self) -> None:
        with self.lock:
            self.conn.close()


class PostgresDatabase:
    """One psycopg connection, reconnected on the next call after it was lost."""

    dialect = "postgresql"

    def __init__(self, url: str) -> None:
        import psycopg  # imported only when PostgreSQL is configured

        self._psycopg = psycopg
        self.url = url
        self.where = redact(url)
        self.lock = threading.Lock()
        self._conn: Any = None
        with self.lock:
            conn = self._connection()
            try:
                with conn.transaction(), conn.cursor() as cur:  # replicas may start together
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                    cur.execute(_VERSION_TABLE)
            except self._psycopg.Error as exc:
                raise self._fail(exc) from None

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            try:
                # tcp_user_timeout and keepalives: a server that vanished (no RST)
                # fails a call within seconds instead of the kernel's 15 minutes
                self._conn = self._psycopg.connect(
                    self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                    options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                    tcp_user_timeout=TCP_USER_TIMEOUT_MS, keepalives=1, keepalives_idle=10,
                    keepalives_interval=3, keepalives_count=3)
            except self._psycopg.Error as exc:
                self._conn = None
                raise DatabaseUnavailable(_pg_message(exc, self.url)) from None
        return self._conn

    def _fail(self, exc: Exception) -> Exception:
        errors = self._psycopg.errors
        if isinstance(exc, errors.UniqueViolation):
            return DuplicateRow(type(exc).__name__)
        if isinstance(exc, (self._psycopg.OperationalError, self._psycopg.InterfaceError)):
            if self._conn is not None and (self._conn.broken or self._conn.closed):
                self._conn.close()
                self._conn = None  # reconnect on the next call
            return DatabaseUnavailable(_pg_message(exc, self.url))
        return exc

    def write(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return self.transaction([(sql, rows)])[0]

    def transaction(self, statements: Sequence[Statement]) -> list[int]:
        with self.lock:
            conn = self._connection()
            try:
                counts = []
                with conn.transaction(), conn.cursor() as cur:
                    for sql, rows in statements:
                        cur.executemany(_pg(sql), rows)
                        counts.append(cur.rowcount)
                return counts
            except self._psycopg.Error as exc:
                raise self._fail(exc) from None

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.lock:
            conn = self._connection()
            try:
                with conn.cursor() as cur:
                    cur.execute(_pg(sql), params)
                    return cur.fetchall()
            except self._psycopg.Error as exc:
                raise self._fail(exc) from None

    def migrate_step(self, before: int, statements: Sequence[str], after: int) -> bool:
        """As :meth:`SqliteDatabase.migrate_step`; replicas queue on an advisory lock."""
        with self.lock:
            conn = self._connection()
            try:
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                    cur.execute(_VERSION_SQL)
                    if _current(cur.fetchall()) != before:
                        return False
                    for sql in (*statements, *_set_version(after)):
                        cur.execute(sql.encode())
                    return True
            except self._psycopg.Error as exc:
                raise self._fail(exc) from None

    def close(self) -> None:
        with self.lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"
_VERSION_SQL = "SELECT MAX(version) FROM schema_version"
MIGRATION_LOCK = 0x706F6F6C  # pg_advisory_xact_lock key ("pool")


def _current(rows: list[Any]) -> int:
    return int(rows[0][0] or 0) if rows else 0


def _set_version(version: int) -> tuple[str, str]:
    return ("DELETE FROM schema_version", f"INSERT INTO schema_version VALUES ({int(version)})")


def schema_version(db: Database) -> int:
    """The version in ``schema_version`` (0: none yet)."""
    return _current(db.read(_VERSION_SQL))


def _pg(sql: str) -> bytes:
    return sql.replace("?", "%s").encode()


def _pg_message(exc: Exception, url: str) -> str:
    """The driver's message with any password of ``url`` blanked out."""
    text = " ".join(str(exc).split())[:300]
    password = urllib.parse.urlsplit(url).password
    return text.replace(password, "***") if password else text
