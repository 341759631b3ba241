"""The batch ETA: open lines over this process's pace of ended lines between its first and last sample."""

from __future__ import annotations

from pathlib import Path

from tailguard.batch.files import FileStore
from tailguard.batch.runner import Answer, Runner
from tailguard.batch.records import Line
from tailguard.batch.sqlite import SqliteJournal
from tailguard.config import BatchesConfig


class NoFront:
    def room(self) -> int:
        return 0

    async def run(self, line: Line, endpoint: str) -> Answer:
        raise AssertionError("not run")


def test_eta_is_open_lines_over_the_pace(tmp_path: Path) -> None:
    r = Runner(SqliteJournal(tmp_path / "j"), FileStore(tmp_path), NoFront(), BatchesConfig())
    assert r.eta_s() is None
    r._rate_samples.extend([(100.0, 0), (110.0, 50)])  # 5 lines a second
    r.lines_by_state = {"queued": 90, "running": 10, "done": 400}
    assert r.eta_s() == 20.0
    r._rate_samples.append((120.0, 50))  # none ended since: 50 lines over 20 s, 2.5 a second
    assert r.eta_s() == 40.0
