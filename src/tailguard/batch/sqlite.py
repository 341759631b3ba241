"""The batch journal in SQLite (standard library): one file in the batch directory, WAL mode so
readers never wait on the writer, `synchronous=NORMAL` so a committed line survives the process
being killed (not a power cut: docs/batch.md). One gateway per file: on open, every line left
`running` is queued again at once, since the only holder it could have had is dead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tailguard.batch.records import QUEUED, RUNNING, Line
from tailguard.batch.sql import SqlJournal
from tailguard.db import private_sqlite


class SqliteJournal(SqlJournal):
    BEGIN = "BEGIN IMMEDIATE"  # take the write lock first: a claim reads then writes

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def _connect(self) -> Any:
        return private_sqlite(self.path)

    def _after_open(self) -> None:
        self._x("UPDATE lines SET state = ?, holder = NULL, not_before = 0 WHERE state = ?", (QUEUED, RUNNING))

    def _claim(self, batch_id: str, n: int, holder: str, now: float, lease_s: float) -> list[Line]:
        with self._txn():
            rows = self._x("SELECT idx, custom_id, body, attempts FROM lines WHERE batch_id = ? AND ((state = ? AND "
                           "not_before <= ?) OR (state = ? AND lease_until < ?)) ORDER BY idx LIMIT ?",
                           (batch_id, QUEUED, now, RUNNING, now, n)).fetchall()
            self._db.cursor().executemany(
                "UPDATE lines SET state = ?, attempts = attempts + 1, holder = ?, lease_until = ? WHERE batch_id = ? "
                "AND idx = ?", [(RUNNING, holder, now + lease_s, batch_id, r[0]) for r in rows])
        return [Line(batch_id, i, cid, bytes(body), attempts + 1) for i, cid, body, attempts in rows]
