"""The batch journal in PostgreSQL (`batches: {store: "postgresql://..."}`, psycopg 3, the
`postgres` extra), so several gateway replicas share the batches: each claims lines with
`FOR UPDATE SKIP LOCKED` and a lease, renews the lease while it runs them, and a replica that
dies hands its lines to the others when the lease ends (llm-d's batch gateway keeps its state in
PostgreSQL the same way; unlike it, a line running at a crash is run again, not failed).
Leases are read against each replica's clock: keep the replicas' clocks in sync (NTP)."""

from __future__ import annotations

from typing import Any

from tailguard.batch.records import QUEUED, RUNNING, Line
from tailguard.batch.sql import SqlJournal
from tailguard.db import postgres


class PostgresJournal(SqlJournal):
    PARAM = "%s"
    BLOB = "BYTEA"
    REAL = "DOUBLE PRECISION"

    def __init__(self, url: str) -> None:
        super().__init__()
        self._url = url

    def _connect(self) -> Any:
        return postgres(self._url)

    def _open(self) -> None:
        """Replicas starting together create the tables one at a time (concurrent `CREATE TABLE IF
        NOT EXISTS` can collide in PostgreSQL's catalog)."""
        self._db = self._connect()
        with self._txn():
            self._x("SELECT pg_advisory_xact_lock(2020)")
            self._tables()

    def _locked(self) -> str:
        return " FOR UPDATE"

    def _claim(self, batch_id: str, n: int, holder: str, now: float, lease_s: float) -> list[Line]:
        rows = self._x(
            "UPDATE lines SET state = ?, attempts = attempts + 1, holder = ?, lease_until = ? WHERE batch_id = ? AND "
            "idx IN (SELECT idx FROM lines WHERE batch_id = ? AND ((state = ? AND not_before <= ?) OR (state = ? AND "
            "lease_until < ?)) ORDER BY idx LIMIT ? FOR UPDATE SKIP LOCKED) RETURNING idx, custom_id, body, attempts",
            (RUNNING, holder, now + lease_s, batch_id, batch_id, QUEUED, now, RUNNING, now, n)).fetchall()
        return sorted((Line(batch_id, i, cid, bytes(body), attempts) for i, cid, body, attempts in rows), key=lambda x: x.idx)
