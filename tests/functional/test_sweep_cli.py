"""`tailguard sweep` as a user runs it, on the discrete-event simulator (seconds): the table shows
what the SLO judges beside E2E, progress goes to stderr with what is left, values that cannot
bind are named, and the knee is either found or explained."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

TAILGUARD = str(Path(sys.executable).with_name("tailguard"))


def test_a_sweep_says_what_it_judges_how_far_it_is_and_what_cannot_bind(tmp_path: Path) -> None:
    done = subprocess.run(
        [TAILGUARD, "sweep", "--setting", "max_concurrency", "--values", "2,4,8,16", "--concurrency", "8",
         "--requests", "60", "--slo", "chat:ttft_s=0.5", "--min-repeats", "1", "--max-repeats", "1",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=60, env={"COLUMNS": "200", "PATH": ""})
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if "value" in line)
    assert "chat P99 E2E (s)" in header and "chat P99 TTFT (s)" in header  # the unit of every figure
    assert "P99 in seconds" in done.stdout and "On the discrete-event simulator" in done.stdout
    progress = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert [line.split()[1] for line in progress] == [f"max_concurrency={v}" for v in (2, 4, 8, 16)]
    assert all(" s left" in line for line in progress)
    warning = "warning: max_concurrency 8, 16: at or above the 8 clients sent, such a cap never binds"
    assert warning in done.stderr and warning in " ".join(done.stdout.split())
    res = orjson.loads((tmp_path / "sweep.json").read_bytes())
    knee = next(line for line in done.stdout.splitlines() if "knee" in line)
    assert knee.startswith(f"knee: {res['knee']};") if res["knee"] is not None else knee.startswith("no knee: ")
    assert "None" not in knee

