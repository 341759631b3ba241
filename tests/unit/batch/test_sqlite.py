"""The SQLite journal's line semantics: a claim takes each line once, a result is recorded once
and only by its holder, a done line is never claimed again, and reopening after a crash queues
again what was running (with its attempt counted)."""

from __future__ import annotations

from pathlib import Path

from tailguard.batch.records import BatchRecord
from tailguard.batch.sqlite import SqliteJournal


async def journal_with(tmp_path: Path, n: int) -> SqliteJournal:
    j = SqliteJournal(tmp_path / "j.sqlite3")
    await j.open()
    await j.add_batch(BatchRecord("batch_1", "o", "/v1/completions", "file-1", "24h", "validating", 0, 100))
    assert await j.start("batch_1", [(f"c{i}", b"{}") for i in range(n)], 1)
    return j


async def test_claims_results_and_reopening(tmp_path: Path) -> None:
    j = await journal_with(tmp_path, 5)
    a = await j.claim("batch_1", 2, "A", now=10.0, lease_s=5.0)
    b = await j.claim("batch_1", 10, "B", now=10.0, lease_s=5.0)
    assert [x.custom_id for x in a] == ["c0", "c1"] and [x.custom_id for x in b] == ["c2", "c3", "c4"]
    assert await j.claim("batch_1", 10, "B", now=11.0, lease_s=5.0) == []
    assert not await j.finish(a[0], "B", True, b"r0")  # not B's line
    assert await j.finish(a[0], "A", True, b"r0")
    assert not await j.finish(a[0], "A", True, b"again")  # recorded once
    await j.again(a[1], "A", not_before=20.0)
    assert await j.claim("batch_1", 10, "C", now=15.0, lease_s=5.0) == []  # not before 20, B's lease holds to 15
    taken = await j.claim("batch_1", 10, "C", now=20.5, lease_s=5.0)  # c1 due; B's lines' lease ended
    assert [(x.custom_id, x.attempts) for x in taken] == [("c1", 2), ("c2", 2), ("c3", 2), ("c4", 2)]
    await j.close()

    j = SqliteJournal(tmp_path / "j.sqlite3")
    await j.open()  # the crash's survivors: C's running lines are queued again at once
    again = await j.claim("batch_1", 10, "D", now=21.0, lease_s=5.0)
    assert [(x.custom_id, x.attempts) for x in again] == [("c1", 3), ("c2", 3), ("c3", 3), ("c4", 3)]
    await j.release("D")  # D stops on purpose: its lines are anyone's at once
    assert [x.custom_id for x in await j.claim("batch_1", 1, "E", now=21.0, lease_s=5.0)] == ["c1"]
    assert await j.close_open("batch_1", "batch_cancelled", "x") == 4
    rec = await j.get_batch("batch_1")
    assert rec is not None and (rec.total, rec.completed, rec.failed) == (5, 1, 4)
    assert [ok for ok, _ in await j.results("batch_1")] == [True, False, False, False, False]
    assert [cid for cid, _ in await j.failed_lines("batch_1")] == ["c1", "c2", "c3", "c4"]
    await j.close()


async def test_transitions_are_conditional(tmp_path: Path) -> None:
    j = await journal_with(tmp_path, 1)
    assert await j.transition("batch_1", ("validating",), "failed", 5) is None  # it is in_progress
    moved = await j.transition("batch_1", ("in_progress",), "cancelling", 6)
    assert moved is not None and moved.times["cancelling_at"] == 6
    assert await j.active_batches() == ["batch_1"]
    assert await j.start("batch_1", [], 7) is False
    await j.close()


async def test_enqueued_tokens_are_those_of_the_owners_active_batches(tmp_path: Path) -> None:
    j = SqliteJournal(tmp_path / "j.sqlite3")
    await j.open()
    for bid, owner in (("b1", "o"), ("b2", "o"), ("b3", "other")):
        await j.add_batch(BatchRecord(bid, owner, "/v1/completions", "file-1", "24h", "validating", 0, 100))
        assert await j.start(bid, [("c0", b"{}")], 1, enqueued_tokens=100)
    assert await j.enqueued_tokens("o") == 200
    await j.transition("b1", ("in_progress",), "cancelling", 2)
    assert await j.enqueued_tokens("o") == 200  # until it is cancelled
    await j.transition("b1", ("cancelling",), "cancelled", 3)
    await j.transition("b2", ("in_progress",), "completed", 3)
    assert await j.enqueued_tokens("o") == 0 and await j.enqueued_tokens("other") == 100
    await j.close()


async def test_a_line_refused_before_it_ran_gets_its_attempt_back(tmp_path: Path) -> None:
    j = await journal_with(tmp_path, 1)
    (a,) = await j.claim("batch_1", 1, "A", now=10.0, lease_s=5.0)
    await j.again(a, "A", not_before=11.0, attempted=False)
    (b,) = await j.claim("batch_1", 1, "A", now=11.0, lease_s=5.0)
    assert (a.attempts, b.attempts) == (1, 1)
    await j.close()
