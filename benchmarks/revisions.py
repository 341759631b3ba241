"""The project's source at another git revision, for benchmarks that run today's code and an
earlier one side by side in one run (the same venv, the other tree first on PYTHONPATH)."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def baseline_tree(rev: str) -> Iterator[Path]:
    """The gateway's source at `rev`, unpacked apart, so the same venv runs it (PYTHONPATH first)."""
    with tempfile.TemporaryDirectory(prefix="tailguard-baseline-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        yield Path(tmp) / "src"
