"""A real PostgreSQL server for a test: Debian's binaries (deploy/postgresql/install.sh puts them
under /usr/lib/postgresql/<version>/bin), a cluster made by `initdb` in a temporary folder,
`pg_ctl` serving it on 127.0.0.1 at a free port; stopped (immediate) when the test ends. As root,
the server runs as the `postgres` user the package creates (PostgreSQL refuses to run as root)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str], timeout: float) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)} failed: {done.stdout}{done.stderr}"


@contextmanager
def postgres_server() -> Iterator[str]:
    """A running server; yields its URL (`postgresql://postgres@127.0.0.1:PORT/postgres`). Its
    folder is a fresh one under /tmp (pytest's own is private to root, which `postgres` cannot enter)."""
    bindir = pg_bin()
    if bindir is None:
        pytest.fail("PostgreSQL's server is not installed: run `make postgresql` (deploy/postgresql/install.sh)")
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="tailguard-pg-"))
    try:
        if os.geteuid() == 0:
            as_user = ["runuser", "-u", "postgres", "--"]
            pw = pwd.getpwnam("postgres")
            shutil.chown(root, pw.pw_uid, pw.pw_gid)
        data, port = root / "data", _free_port()
        _run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"], 120)
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
        _run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"), "-w", "-t", "60",
              "start"], 90)
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                           capture_output=True, timeout=60)
    finally:
        shutil.rmtree(root, ignore_errors=True)
