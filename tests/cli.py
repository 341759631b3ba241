"""The `tailguard` command run as a user runs it: a real process, its output captured, every
wait bounded, and never left running after a test."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

TAILGUARD = str(Path(sys.executable).with_name("tailguard"))


async def start(*args: str, columns: int = 80) -> asyncio.subprocess.Process:
    """`tailguard ARGS` with stdout and stderr on one pipe, in a terminal `columns` wide."""
    return await asyncio.create_subprocess_exec(TAILGUARD, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT,
                                                env={**os.environ, "COLUMNS": str(columns)})


async def finish(proc: asyncio.subprocess.Process, limit_s: float = 60.0) -> tuple[int, str]:
    """Exit code and output of a started process; killed if it outlives `limit_s`."""
    try:
        async with asyncio.timeout(limit_s):
            out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def run(*args: str, columns: int = 80, limit_s: float = 60.0) -> tuple[int, str]:
    return await finish(await start(*args, columns=columns), limit_s)
