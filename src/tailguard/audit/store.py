"""Where the audit trail is kept: one table of entries (each chain numbered from 1) and one of
anchors (the last entry retention deleted from each chain), over a DB-API connection used from
one thread at a time: the trail's writer, or `tailguard audit`. `SqliteStore` is the default, a
file in the state directory in WAL mode; `audit.postgres.PostgresStore` lets replicas share one
table, each appending to its own chain.

    audit_entries(chain, seq, at, kind, caller, doc, prev, hash)   PRIMARY KEY (chain, seq)
    audit_anchors(chain, seq, hash)

Nothing here updates an entry: the trail appends, and retention deletes a chain's oldest ones.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tailguard.audit.chain import Entry
from tailguard.db import private_sqlite, transaction

FILE_NAME = "audit.sqlite3"
_COLUMNS = "chain, seq, at, kind, caller, doc, prev, hash"


class AuditStore(abc.ABC):
    """The SQL both dialects share; a dialect gives its connection and its types."""

    MARK = "?"  # the driver's placeholder
    REAL = "REAL"
    BEGIN = "BEGIN"

    def __init__(self) -> None:
        self._db: Any = None

    @abc.abstractmethod
    def _connect(self) -> Any: ...

    def _sql(self, sql: str, args: Sequence[Any] = ()) -> Any:
        cur = self._db.cursor()
        cur.execute(sql if self.MARK == "?" else sql.replace("?", self.MARK), args)
        return cur

    def _transaction(self) -> contextlib.AbstractContextManager[None]:
        return transaction(self._sql, self.BEGIN)

    def open(self) -> None:
        self._db = self._connect()
        with self._transaction():
            self._create()

    def _create(self) -> None:
        self._sql(f"CREATE TABLE IF NOT EXISTS audit_entries (chain TEXT NOT NULL, seq BIGINT NOT NULL, "
                  f"at {self.REAL} NOT NULL, kind TEXT NOT NULL, caller TEXT, doc TEXT NOT NULL, prev TEXT NOT NULL, "
                  f"hash TEXT NOT NULL, PRIMARY KEY (chain, seq))")
        self._sql("CREATE INDEX IF NOT EXISTS audit_entries_at ON audit_entries (at)")
        self._sql("CREATE TABLE IF NOT EXISTS audit_anchors (chain TEXT PRIMARY KEY, seq BIGINT NOT NULL, "
                  "hash TEXT NOT NULL)")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # --- the writer ---------------------------------------------------------------------------

    def head(self, chain: str) -> tuple[int, str] | None:
        """The chain's last entry (number, hash): its last row, else its anchor, else None."""
        row = self._sql("SELECT seq, hash FROM audit_entries WHERE chain = ? ORDER BY seq DESC LIMIT 1",
                        (chain,)).fetchone()
        return (int(row[0]), str(row[1])) if row is not None else self.anchor(chain)

    def append(self, entries: Sequence[Entry]) -> None:
        """Entries in one transaction: all or none (a number taken twice, another writer on the
        same chain, fails the whole batch)."""
        with self._transaction():
            self._db.cursor().executemany(
                f"INSERT INTO audit_entries ({_COLUMNS}) VALUES ({', '.join([self.MARK] * 8)})",
                [(e.chain, e.seq, e.at, e.kind, e.caller, e.doc.decode(), e.prev, e.hash) for e in entries])

    def prune(self, chain: str, before: float, keep: int) -> int:
        """Delete the chain's entries older than `before` and all but its newest `keep`, oldest
        first, and anchor it at the last one deleted; the number deleted."""
        with self._transaction():
            row = self._sql("SELECT MAX(seq) FROM audit_entries WHERE chain = ? AND at < ?", (chain, before)).fetchone()
            by_age = int(row[0]) if row and row[0] is not None else 0
            row = self._sql("SELECT MAX(seq) FROM audit_entries WHERE chain = ?", (chain,)).fetchone()
            by_count = (int(row[0]) - keep) if row and row[0] is not None else 0
            upto = max(by_age, by_count)
            last = self._sql("SELECT seq, hash FROM audit_entries WHERE chain = ? AND seq <= ? ORDER BY seq DESC "
                             "LIMIT 1", (chain, upto)).fetchone() if upto > 0 else None
            if last is None:
                return 0
            n = self._sql("DELETE FROM audit_entries WHERE chain = ? AND seq <= ?", (chain, upto)).rowcount
            self._sql("DELETE FROM audit_anchors WHERE chain = ?", (chain,))
            self._sql("INSERT INTO audit_anchors (chain, seq, hash) VALUES (?, ?, ?)", (chain, int(last[0]), last[1]))
            return int(n)

    # --- readers --------------------------------------------------------------------------------

    def chains(self) -> list[str]:
        rows = self._sql("SELECT DISTINCT chain FROM audit_entries UNION SELECT chain FROM audit_anchors").fetchall()
        return sorted(str(r[0]) for r in rows)

    def hash_of(self, chain: str, seq: int) -> str | None:
        row = self._sql("SELECT hash FROM audit_entries WHERE chain = ? AND seq = ?", (chain, seq)).fetchone()
        return None if row is None else str(row[0])

    def anchor(self, chain: str) -> tuple[int, str] | None:
        row = self._sql("SELECT seq, hash FROM audit_anchors WHERE chain = ?", (chain,)).fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    def entries(self, chain: str | None = None, *, since: float | None = None, until: float | None = None,
                caller: str | None = None, batch: int = 1000) -> Iterator[Entry]:
        """Entries by chain and number, filtered; read `batch` rows at a time."""
        where, args = [], []
        for clause, value in (("chain = ?", chain), ("at >= ?", since), ("at < ?", until), ("caller = ?", caller)):
            if value is not None:
                where.append(clause)
                args.append(value)
        sql = f"SELECT {_COLUMNS} FROM audit_entries"
        if where:
            sql += " WHERE " + " AND ".join(where)
        cur = self._sql(sql + " ORDER BY chain, seq", args)
        while rows := cur.fetchmany(batch):
            for c, seq, at, kind, who, doc, prev, h in rows:
                yield Entry(c, int(seq), float(at), kind, who, doc.encode(), prev, h)


class SqliteStore(AuditStore):
    """The trail in a SQLite file (WAL: readers never wait for the writer; private to the user,
    as everything in the state directory)."""

    BEGIN = "BEGIN IMMEDIATE"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def _connect(self) -> Any:
        return private_sqlite(self.path)


def open_store(store: str, path: Path | None) -> AuditStore:
    """The store `audit.store` names: SQLite at `path`, or PostgreSQL at its URL (opened)."""
    if store == "sqlite":
        if path is None:
            raise ValueError("the audit trail in SQLite needs a file: set audit.path, or serve with a state directory "
                             "(tailguard serve --config FILE, or --state-dir)")
        s: AuditStore = SqliteStore(path)
    else:
        from tailguard.audit.postgres import PostgresStore  # the optional extra, imported only when asked for
        s = PostgresStore(store)
    s.open()
    return s
