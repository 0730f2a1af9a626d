"""The ledger's overflow file: rows the database could not take yet, on disk.

While the database is down or locked the ledger's rows wait in memory; past
a bound the oldest go here (one JSON array per line, appended and fsynced),
and they are written to the database before anything newer once it answers,
also by the next process when this one stopped first. What has been replayed
is recorded as a byte offset beside the file after each committed chunk, so
a crash re-sends at most one chunk.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import orjson

__all__ = ["Backlog", "BACKLOG_FILE"]

BACKLOG_FILE = "ledger-backlog.jsonl"


class Backlog:
    """Rows spilled to ``directory``/:data:`BACKLOG_FILE`, replayed in order."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, BACKLOG_FILE)
        self._offset_path = self.path + ".offset"
        self.rows = self._count()

    def _offset(self) -> int:
        try:
            with open(self._offset_path, "rb") as f:
                return int(f.read() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _count(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset())
                return sum(1 for line in f if line.strip())
        except FileNotFoundError:
            return 0

    def spill(self, rows: Sequence[Sequence[Any]]) -> None:
        """Append ``rows``, durably (fsync) before returning."""
        if not rows:
            return
        data = b"".join(orjson.dumps(list(r)) + b"\n" for r in rows)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.rows += len(rows)

    def replay(self, write: Callable[[list[tuple[Any, ...]]], Any], chunk: int) -> int:
        """Hand the spilled rows to ``write`` (which commits them or raises),
        ``chunk`` at a time; delete the file once all went. The rows written."""
        if not self.rows:
            return 0
        done = 0
        offset = self._offset()
        with open(self.path, "rb") as f:
            f.seek(offset)
            while True:
                batch: list[tuple[Any, ...]] = []
                while len(batch) < chunk:
                    line = f.readline()
                    if not line:
                        break
                    if line.strip():
                        batch.append(tuple(orjson.loads(line)))
                if not batch:
                    break
                write(batch)  # raises while the database is still away: the offset stays
                offset = f.tell()
                self._save_offset(offset)
                done += len(batch)
                self.rows = max(0, self.rows - len(batch))
        os.unlink(self.path)
        os.unlink(self._offset_path)
        self.rows = 0
        return done

    def _save_offset(self, offset: int) -> None:
        tmp = self._offset_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(str(offset).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._offset_path)
