"""The journal in SQL, shared by SQLite and PostgreSQL: the tables, and every read and write as
plain DB-API calls run on one thread of the journal's own, so the event loop never waits on a
disk or a server. Each dialect (`batch.sqlite`, `batch.postgres`) gives its connection, its
column types and how lines are claimed; the rest is here once.

    files(id, owner, purpose, filename, bytes, created_at, expires_at)
    batches(id, owner, created_at, status, doc)   doc: the rest of the batch as JSON
    lines(batch_id, idx, custom_id, body, state, attempts, not_before, holder, lease_until, result)
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import orjson

from tailguard.db import transaction
from tailguard.batch.records import ACTIVE, DONE, FAILED, QUEUED, RUNNING, BatchRecord, FileRecord, Line, error_line

T = TypeVar("T")

_BATCH_COLUMNS = ("id", "owner", "created_at", "status")
_ENQUEUED = ("in_progress", "finalizing", "cancelling")  # the statuses whose tokens count as enqueued


class SqlJournal(abc.ABC):
    """A `Journal` over a DB-API connection; subclasses say how to connect and how to claim."""

    PARAM = "?"  # the driver's placeholder
    BEGIN = "BEGIN"
    BLOB = "BLOB"
    REAL = "REAL"

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailguard-journal")
        self._db: Any = None

    # --- what a dialect provides ---

    @abc.abstractmethod
    def _connect(self) -> Any:
        """A new DB-API connection, opened on the journal's own thread."""

    @abc.abstractmethod
    def _claim(self, batch_id: str, n: int, holder: str, now: float, lease_s: float) -> list[Line]:
        """Up to `n` lines of the batch, leased to `holder` until `now + lease_s`, in one statement."""

    def _after_open(self) -> None:
        """Anything the dialect does once the tables exist."""

    # --- plumbing ---

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _q(self, sql: str) -> str:
        return sql if self.PARAM == "?" else sql.replace("?", self.PARAM)

    def _x(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        cur = self._db.cursor()
        cur.execute(self._q(sql), args)
        return cur

    def _txn(self) -> contextlib.AbstractContextManager[None]:
        return transaction(self._x, self.BEGIN)

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        self._db = self._connect()
        self._tables()
        self._after_open()

    def _tables(self) -> None:
        b, r = self.BLOB, self.REAL
        for ddl in (
            "CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, "
            "filename TEXT NOT NULL, bytes BIGINT NOT NULL, created_at BIGINT NOT NULL, expires_at BIGINT)",
            "CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at BIGINT NOT NULL, "
            "status TEXT NOT NULL, doc TEXT NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS lines (batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL, "
            f"body {b} NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, not_before {r} NOT NULL "
            f"DEFAULT 0, holder TEXT, lease_until {r} NOT NULL DEFAULT 0, result {b}, PRIMARY KEY (batch_id, idx))",
            "CREATE INDEX IF NOT EXISTS lines_by_state ON lines (batch_id, state, idx)",
            "CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner, created_at)",
            "CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner, created_at)",
        ):
            self._x(ddl)

    async def close(self) -> None:
        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None
        await self._run(shut)
        self._pool.shutdown(wait=True)

    # --- files ---

    async def add_file(self, rec: FileRecord) -> None:
        await self._run(self._x, "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (rec.id, rec.owner, rec.purpose, rec.filename, rec.bytes, rec.created_at, rec.expires_at))

    async def get_file(self, file_id: str) -> FileRecord | None:
        def get() -> FileRecord | None:
            row = self._x("SELECT * FROM files WHERE id = ?", (file_id,)).fetchone()
            return None if row is None else FileRecord(*row)
        return await self._run(get)

    async def list_files(self, owner: str, purpose: str | None, after: str | None, limit: int) -> list[FileRecord]:
        def listed() -> list[FileRecord]:
            sql, args = "SELECT * FROM files WHERE owner = ?", [owner]
            if purpose is not None:
                sql += " AND purpose = ?"
                args.append(purpose)
            sql, args = _after(sql, args, "files", after)
            rows = self._x(sql + " ORDER BY created_at DESC, id DESC LIMIT ?", (*args, limit)).fetchall()
            return [FileRecord(*r) for r in rows]
        return await self._run(listed)

    async def delete_file(self, file_id: str) -> bool:
        return bool(await self._run(lambda: self._x("DELETE FROM files WHERE id = ?", (file_id,)).rowcount))

    async def expired_files(self, now: int) -> list[FileRecord]:
        def found() -> list[FileRecord]:
            rows = self._x("SELECT * FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)).fetchall()
            return [FileRecord(*r) for r in rows]
        return await self._run(found)

    # --- batches ---

    async def add_batch(self, rec: BatchRecord) -> None:
        await self._run(self._x, "INSERT INTO batches VALUES (?, ?, ?, ?, ?)",
                        (rec.id, rec.owner, rec.created_at, rec.status, _doc(rec)))

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        def get() -> BatchRecord | None:
            row = self._x("SELECT id, owner, created_at, status, doc FROM batches WHERE id = ?", (batch_id,)).fetchone()
            return None if row is None else self._counted(_record(row))
        return await self._run(get)

    async def status(self, batch_id: str) -> str | None:
        row = await self._run(lambda: self._x("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone())
        return None if row is None else str(row[0])

    def _counted(self, rec: BatchRecord) -> BatchRecord:
        rows = self._x("SELECT state, COUNT(*) FROM lines WHERE batch_id = ? GROUP BY state", (rec.id,)).fetchall()
        by = {s: int(n) for s, n in rows}
        if by:
            rec.total = sum(by.values())
            rec.completed, rec.failed = by.get(DONE, 0), by.get(FAILED, 0)
        return rec

    async def list_batches(self, owner: str, after: str | None, limit: int) -> list[BatchRecord]:
        def listed() -> list[BatchRecord]:
            sql, args = _after("SELECT id, owner, created_at, status, doc FROM batches WHERE owner = ?", [owner],
                               "batches", after)
            rows = self._x(sql + " ORDER BY created_at DESC, id DESC LIMIT ?", (*args, limit)).fetchall()
            return [self._counted(_record(r)) for r in rows]
        return await self._run(listed)

    async def enqueued_tokens(self, owner: str) -> int:
        def held() -> int:
            rows = self._x("SELECT doc FROM batches WHERE owner = ? AND status IN (?, ?, ?)",
                           (owner, *_ENQUEUED)).fetchall()
            return sum(int(orjson.loads(r[0]).get("enqueued_tokens", 0)) for r in rows)
        return await self._run(held)

    async def active_batches(self) -> list[str]:
        marks = ", ".join("?" * len(ACTIVE))
        rows = await self._run(lambda: self._x(f"SELECT id FROM batches WHERE status IN ({marks}) ORDER BY created_at",
                                               ACTIVE).fetchall())
        return [r[0] for r in rows]

    async def transition(self, batch_id: str, allowed: tuple[str, ...], status: str, at: int | None,
                         changes: Mapping[str, object] | None = None) -> BatchRecord | None:
        def move() -> BatchRecord | None:
            with self._txn():
                return self._move(batch_id, allowed, status, at, changes or {})
        return await self._run(move)

    def _move(self, batch_id: str, allowed: tuple[str, ...], status: str, at: int | None,
              changes: Mapping[str, object]) -> BatchRecord | None:
        row = self._x("SELECT id, owner, created_at, status, doc FROM batches WHERE id = ?" + self._locked(),
                      (batch_id,)).fetchone()
        if row is None or row[3] not in allowed:
            return None
        rec = _record(row)
        rec.status = status
        if at is not None:
            rec.times[f"{status}_at"] = at
        for k, v in changes.items():
            setattr(rec, k, v)
        self._x("UPDATE batches SET status = ?, doc = ? WHERE id = ?", (status, _doc(rec), batch_id))
        return rec

    def _locked(self) -> str:
        """What a read inside a transaction adds to lock its row (PostgreSQL: FOR UPDATE)."""
        return ""

    async def start(self, batch_id: str, lines: list[tuple[str, bytes]], at: int, enqueued_tokens: int = 0) -> bool:
        def started() -> bool:
            with self._txn():
                if self._move(batch_id, ("validating",), "in_progress", at, {"enqueued_tokens": enqueued_tokens}) is None:
                    return False
                self._x("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
                cur = self._db.cursor()
                cur.executemany(self._q("INSERT INTO lines (batch_id, idx, custom_id, body, state) VALUES (?, ?, ?, ?, ?)"),
                                [(batch_id, i, cid, body, QUEUED) for i, (cid, body) in enumerate(lines)])
                return True
        return await self._run(started)

    # --- lines ---

    async def claim(self, batch_id: str, n: int, holder: str, now: float, lease_s: float) -> list[Line]:
        return await self._run(self._claim, batch_id, n, holder, now, lease_s)

    async def renew(self, holder: str, now: float, lease_s: float) -> None:
        await self._run(self._x, "UPDATE lines SET lease_until = ? WHERE holder = ? AND state = ?",
                        (now + lease_s, holder, RUNNING))

    async def finish(self, line: Line, holder: str, ok: bool, result: bytes) -> bool:
        cur = await self._run(self._x, "UPDATE lines SET state = ?, result = ?, holder = NULL WHERE batch_id = ? "
                              "AND idx = ? AND state = ? AND holder = ?",
                              (DONE if ok else FAILED, result, line.batch_id, line.idx, RUNNING, holder))
        return bool(cur.rowcount)

    async def release(self, holder: str) -> None:
        await self._run(self._x, "UPDATE lines SET state = ?, holder = NULL WHERE holder = ? AND state = ?",
                        (QUEUED, holder, RUNNING))

    async def again(self, line: Line, holder: str, not_before: float, attempted: bool = True) -> None:
        await self._run(self._x, "UPDATE lines SET state = ?, not_before = ?, holder = NULL, attempts = attempts - ? "
                        "WHERE batch_id = ? AND idx = ? AND state = ? AND holder = ?",
                        (QUEUED, not_before, 0 if attempted else 1, line.batch_id, line.idx, RUNNING, holder))

    async def close_open(self, batch_id: str, code: str, message: str) -> int:
        def closed() -> int:
            with self._txn():
                rows = self._x("SELECT idx, custom_id FROM lines WHERE batch_id = ? AND state IN (?, ?)",
                               (batch_id, QUEUED, RUNNING)).fetchall()
                cur = self._db.cursor()
                cur.executemany(self._q("UPDATE lines SET state = ?, result = ?, holder = NULL WHERE batch_id = ? "
                                        "AND idx = ?"),
                                [(FAILED, orjson.dumps(error_line(cid, code, message)), batch_id, i) for i, cid in rows])
                return len(rows)
        return await self._run(closed)

    async def open_lines(self, batch_id: str) -> int:
        row = await self._run(lambda: self._x("SELECT COUNT(*) FROM lines WHERE batch_id = ? AND state IN (?, ?)",
                                              (batch_id, QUEUED, RUNNING)).fetchone())
        return int(row[0])

    async def results(self, batch_id: str) -> list[tuple[bool, bytes]]:
        rows = await self._run(lambda: self._x("SELECT state, result FROM lines WHERE batch_id = ? AND state IN (?, ?) "
                                               "ORDER BY idx", (batch_id, DONE, FAILED)).fetchall())
        return [(s == DONE, bytes(r)) for s, r in rows]

    async def failed_lines(self, batch_id: str) -> list[tuple[str, bytes]]:
        rows = await self._run(lambda: self._x("SELECT custom_id, body FROM lines WHERE batch_id = ? AND state = ? "
                                               "ORDER BY idx", (batch_id, FAILED)).fetchall())
        return [(c, bytes(b)) for c, b in rows]

    async def tally(self) -> tuple[dict[str, int], dict[str, int]]:
        marks = ", ".join("?" * len(ACTIVE))

        def counted() -> tuple[dict[str, int], dict[str, int]]:
            lines = self._x(f"SELECT state, COUNT(*) FROM lines WHERE batch_id IN (SELECT id FROM batches WHERE status "
                            f"IN ({marks})) GROUP BY state", ACTIVE).fetchall()
            batches = self._x("SELECT status, COUNT(*) FROM batches GROUP BY status").fetchall()
            return {s: int(n) for s, n in lines}, {s: int(n) for s, n in batches}
        return await self._run(counted)


def _after(sql: str, args: list[Any], table: str, after: str | None) -> tuple[str, list[Any]]:
    """OpenAI's cursor: items older than `after` (by creation, then id), newest first."""
    if after is None:
        return sql, args
    sql += (f" AND (created_at, id) < (SELECT created_at, id FROM {table} WHERE id = ?)")
    return sql, [*args, after]


def _doc(rec: BatchRecord) -> str:
    rest = {k: getattr(rec, k) for k in ("endpoint", "input_file_id", "completion_window", "expires_at", "metadata",
                                          "errors", "output_file_id", "error_file_id", "times", "owner_key",
                                          "enqueued_tokens")}
    return orjson.dumps(rest).decode()


def _record(row: tuple[Any, ...]) -> BatchRecord:
    fields = dict(zip(_BATCH_COLUMNS, row[:4]))
    return BatchRecord(**fields, **orjson.loads(row[4]))
