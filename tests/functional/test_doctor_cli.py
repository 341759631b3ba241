"""`tailguard doctor` as a user runs it, on what is not a run: the error names the folder and what to give."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TAILGUARD = str(Path(sys.executable).with_name("tailguard"))


def test_doctor_on_a_folder_that_is_no_run_says_what_to_give(tmp_path: Path) -> None:
    done = subprocess.run([TAILGUARD, "doctor", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().endswith(f"{tmp_path} is not a bench output folder: requests.jsonl is missing (give "
                                        "the folder a `tailguard bench --out DIR` run wrote)"), done.stderr


def test_doctor_on_a_folder_of_runs_names_them(tmp_path: Path) -> None:
    """`tailguard doctor runs/demo`: the demo's folder holds two runs; doctor names them."""
    for run in ("before", "after"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "requests.jsonl").write_text("")
    done = subprocess.run([TAILGUARD, "doctor", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().endswith(f"it holds the runs {tmp_path / 'after'}, {tmp_path / 'before'}: "
                                        f"e.g. tailguard doctor {tmp_path / 'after'}"), done.stderr
