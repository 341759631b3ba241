"""The trail's writer on a real SQLite file: order, restarts, a full queue, retention, a second
writer on one chain, a store that fails for a while, and retained text redacted."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from tailguard.audit.chain import Entry, verify
from tailguard.audit.store import SqliteStore
from tailguard.audit.trail import Trail


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def opened(path: Path) -> SqliteStore:
    s = SqliteStore(path)
    s.open()
    return s


def check(store: SqliteStore, chain: str) -> list[Entry]:
    entries = list(store.entries(chain))
    problems, head = verify(chain, entries, store.anchor(chain))
    assert problems == []
    return entries


def test_entries_are_written_in_order_and_a_restart_continues_the_chain(tmp_path: Path) -> None:
    clock = Clock()
    trail = Trail(opened(tmp_path / "a.sqlite3"), "gw:1", clock=clock)
    for i in range(5):
        clock.t += 1
        assert trail.add({"kind": "request", "caller": "a", "n": i})
    assert trail.flush() == 5
    trail.close()
    trail = Trail(opened(tmp_path / "a.sqlite3"), "gw:1", clock=clock)
    trail.add({"kind": "admin", "caller": None, "action": "reload"})
    trail.flush()
    entries = check(trail.store, "gw:1")
    assert [e.fields().get("n") for e in entries] == [0, 1, 2, 3, 4, None]
    assert entries[0].fields()["at"] == "2023-11-14T22:13:21.000Z"
    trail.close()


def test_a_full_queue_drops_and_the_trail_records_the_gap(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trail = Trail(opened(tmp_path / "a.sqlite3"), "gw:1", queue_entries=3, clock=Clock())
    with caplog.at_level(logging.ERROR, "tailguard.gateway"):
        results = [trail.add({"kind": "request", "caller": None, "n": i}) for i in range(5)]
    assert results == [True, True, True, False, False] and trail.full() and trail.dropped == 2
    assert sum("queue full" in r.message for r in caplog.records) == 1  # said once a minute
    trail.flush()
    entries = check(trail.store, "gw:1")
    assert [e.kind for e in entries] == ["request"] * 3 + ["gap"]
    assert entries[-1].fields()["dropped"] == 2
    trail.close()


def test_retention_by_count_and_age_keeps_the_chain_checkable(tmp_path: Path) -> None:
    clock = Clock()
    trail = Trail(opened(tmp_path / "a.sqlite3"), "gw:1", max_entries=1000, max_age_s=100.0, clock=clock)
    for i in range(1500):
        clock.t += 0.01
        trail.add({"kind": "request", "caller": None})
    trail.flush()
    assert trail.prune() == 500
    assert trail.store.anchor("gw:1") == (500, list(trail.store.entries("gw:1"))[0].prev)
    check(trail.store, "gw:1")
    clock.t += 200  # all older than the age bound now
    trail.add({"kind": "request", "caller": None})
    trail.flush()
    assert trail.prune() == 1000
    assert [e.seq for e in check(trail.store, "gw:1")] == [1501]
    trail.close()


def test_a_second_writer_on_one_chain_moves_to_its_own(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite3"
    one, two = Trail(opened(path), "gw:1", clock=Clock()), Trail(opened(path), "gw:1", clock=Clock())
    one.add({"kind": "request", "caller": None})
    one.flush()
    two.add({"kind": "request", "caller": None})
    assert two.flush() == 1
    assert two.chain.startswith("gw:1~")
    check(one.store, "gw:1")
    check(one.store, two.chain)
    one.close()
    two.close()


class FailingFirst(SqliteStore):
    def __init__(self, path: Path, fails: int) -> None:
        super().__init__(path)
        self.fails = fails

    def append(self, entries: Sequence[Entry]) -> None:
        if self.fails:
            self.fails -= 1
            raise sqlite3.OperationalError("database is locked")
        super().append(entries)


def test_a_batch_the_store_refused_is_written_later_in_order(tmp_path: Path) -> None:
    store = FailingFirst(tmp_path / "a.sqlite3", fails=2)
    store.open()
    trail = Trail(store, "gw:1", clock=Clock())
    trail.add({"kind": "request", "caller": None, "n": 1})
    assert trail.flush() == 0
    trail.add({"kind": "request", "caller": None, "n": 2})
    assert trail.flush() == 0
    assert trail.flush() == 2  # the batch refused first, then the one queued since
    assert trail.flush() == 0
    assert [e.fields()["n"] for e in check(store, "gw:1")] == [1, 2]
    assert trail.failures == 2
    trail.close()


def test_retained_text_is_redacted_before_it_is_written(tmp_path: Path) -> None:
    trail = Trail(opened(tmp_path / "a.sqlite3"), "gw:1", clock=Clock(), redact=lambda s: s.replace("secret", "[X]"))
    trail.add({"kind": "request", "caller": None, "prompt": "a secret", "completion": "the secret", "model": "secret"})
    trail.flush()
    doc = check(trail.store, "gw:1")[0].fields()
    assert (doc["prompt"], doc["completion"], doc["model"]) == ("a [X]", "the [X]", "secret")
    trail.close()


def test_the_writer_thread_writes_on_its_own_and_at_close(tmp_path: Path) -> None:
    trail = Trail(opened(tmp_path / "a.sqlite3"), "gw:1", flush_s=60.0)
    trail.start()
    for _ in range(100):
        trail.add({"kind": "request", "caller": None})
    trail.close()  # written as it stops, not after 60 s
    store = opened(tmp_path / "a.sqlite3")
    assert len(check(store, "gw:1")) == 100
    store.close()
