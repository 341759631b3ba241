"""`tailguard sim` as real processes on 127.0.0.1, for tests that must kill one (SIGKILL) or run
several with different speeds and models; every process is killed when its test ends."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass


@dataclass
class SimProcess:
    url: str
    proc: asyncio.subprocess.Process

    def kill(self) -> None:
        """SIGKILL: the engine dies mid-whatever, its sockets reset by the kernel."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)


@asynccontextmanager
async def sim_process(*args: str, time_scale: float = 0.02,
                      model: str | None = "tailguard-sim") -> AsyncIterator[SimProcess]:
    """One `tailguard sim --port 0` with `args`, once it listens (a hung one too: it is not
    asked for its health). It serves `model` only (another is a 404), or with None any model."""
    named = ("--model-name", model) if model is not None else ()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "sim", "--port", "0", "--time-scale", str(time_scale),
        *named, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    drain: asyncio.Task[None] | None = None
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            line = (await proc.stderr.readline()).decode()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert m, f"tailguard sim did not start: {line!r}"
        drain = asyncio.create_task(_drain(proc.stderr))  # a full pipe must never stall the simulator
        yield SimProcess(m.group(1), proc)
    finally:
        await reap(proc, drain)


async def reap(proc: asyncio.subprocess.Process, drain: asyncio.Task[None] | None) -> None:
    """Kill `proc` if it still runs, wait for it, and stop reading its stderr."""
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
    if drain is not None:
        drain.cancel()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass
