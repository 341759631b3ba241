"""The project's source at another git revision, for benchmarks that run today's code and an
earlier one side by side in one run (the same venv, the other tree first on PYTHONPATH)."""

from __future__ import annotations

import contextlib
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def baseline_tree(rev: str) -> Iterator[Path]:
    """The gateway's source at `rev`, unpacked apart, so the same venv runs it (PYTHONPATH first),
    with its C extension built in place as the venv's own was: without it the baseline would run
    the relay's Python fallback, and every before/after would compare C with Python."""
    with tempfile.TemporaryDirectory(prefix="tailguard-baseline-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        src = Path(tmp) / "src"
        build_speedups(src / "tailguard")
        yield src


def build_speedups(package: Path) -> None:
    """`package`/_speedups.c compiled beside it with this interpreter's own flags (what setuptools
    runs for `setup.py`'s extension), when the revision has one."""
    source = package / "_speedups.c"
    if not source.exists():
        return
    var = sysconfig.get_config_var
    with tempfile.TemporaryDirectory() as tmp:
        obj = Path(tmp) / "_speedups.o"
        subprocess.run([*var("CC").split(), *var("CFLAGS").split(), *var("CCSHARED").split(),
                        f"-I{sysconfig.get_paths()['include']}", "-c", str(source), "-o", str(obj)], check=True)
        subprocess.run([*var("LDSHARED").split(), str(obj), "-o", str(package / f"_speedups{var('EXT_SUFFIX')}")],
                       check=True)
