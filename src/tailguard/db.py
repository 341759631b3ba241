"""The SQL connections the gateway's own stores open (the batch journal, the audit trail), and
their transactions, in one place: a SQLite file private to the user in WAL mode, and PostgreSQL
(psycopg 3, the `postgres` extra, imported only when asked for) in autocommit, where each
transaction is begun and ended explicitly.

    conn = private_sqlite(path)                   # or postgres(url)
    with transaction(lambda sql: conn.execute(sql), "BEGIN IMMEDIATE"):
        ...
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def private_sqlite(path: Path) -> sqlite3.Connection:
    """A SQLite file in WAL mode (readers never wait for the writer), `synchronous=NORMAL` (a
    commit survives the process being killed, not a power cut), private to the user like the
    rest of the state directory (SQLite gives its -wal and -shm files the database file's mode);
    never opened through a symbolic link. Used from one thread at a time."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


def postgres(url: str) -> Any:
    """A PostgreSQL connection in autocommit (each transaction begun with `transaction`)."""
    import psycopg

    return psycopg.connect(url, autocommit=True)


@contextlib.contextmanager
def transaction(run: Callable[[str], object], begin: str = "BEGIN") -> Iterator[None]:
    """`begin` ... COMMIT around the block, ROLLBACK if it raises; `run` executes a statement."""
    run(begin)
    try:
        yield
    except BaseException:
        run("ROLLBACK")
        raise
    run("COMMIT")
