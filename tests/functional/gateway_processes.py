"""`tailguard serve --config FILE` as real processes on 127.0.0.1: replicas of one gateway, as a
deployment runs them behind a load balancer. Each one's stderr is kept (its log lines) and every
process is killed when its test ends."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.functional.sim_processes import reap


@dataclass
class GatewayProcess:
    url: str
    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)  # its stderr so far

    def kill(self) -> None:
        """SIGKILL: the replica dies at once, holding whatever it held."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    def logged(self, text: str) -> int:
        return sum(text in line for line in self.lines)


@asynccontextmanager
async def gateway_process(folder: Path, cfg: dict[str, Any]) -> AsyncIterator[GatewayProcess]:
    """One gateway running `cfg` (written to a file in `folder`), once it listens."""
    path = folder / "tailguard.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "serve", "--config", str(path), "--port", "0",
        "--state-dir", str(folder / "state"), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    gw: GatewayProcess | None = None
    drain: asyncio.Task[None] | None = None
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        async with asyncio.timeout(30):
            while True:
                line = (await proc.stderr.readline()).decode()
                assert line, f"tailguard serve exited before listening: {''.join(lines)}"
                lines.append(line)
                m = re.search(r"gateway listening on (http://127\.0\.0\.1:\d+)", line)
                if m:
                    break
        gw = GatewayProcess(m.group(1), proc, lines)
        drain = asyncio.create_task(_keep(proc.stderr, lines))  # a full pipe must never stall it
        yield gw
    finally:
        await reap(proc, drain)


async def replicas(stack: AsyncExitStack, folder: Path, cfg: dict[str, Any], n: int = 2) -> list[GatewayProcess]:
    """`n` gateways running `cfg`, each with a folder of its own under `folder`, in `stack`."""
    out = []
    for i in range(n):
        own = folder / f"gw{i}"
        own.mkdir()
        out.append(await stack.enter_async_context(gateway_process(own, cfg)))
    return out


async def _keep(stream: asyncio.StreamReader, lines: list[str]) -> None:
    while line := await stream.readline():
        lines.append(line.decode())
