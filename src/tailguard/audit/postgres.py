"""The audit trail in PostgreSQL (`audit: {store: "postgresql://..."}`, psycopg 3, the `postgres`
extra): every replica appends to the one table, each to its own chain (its `audit.chain`, by
default `<hostname>:<port>`), so no replica waits for another's lock to write, and each chain is
checked on its own. An entry's number is taken by its writer alone; a second process writing the
same chain fails its insert on the primary key and moves to a chain of its own (logged)."""

from __future__ import annotations

from typing import Any

from tailguard.audit.store import AuditStore
from tailguard.db import postgres


class PostgresStore(AuditStore):
    MARK, REAL = "%s", "DOUBLE PRECISION"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def _connect(self) -> Any:
        return postgres(self.url)

    def _create(self) -> None:
        self._sql("SELECT pg_advisory_xact_lock(3033)")  # replicas starting together: one at a time
        super()._create()
