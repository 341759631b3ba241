"""A real `redis-server` (Debian's, installed by `make redis`) on a free 127.0.0.1 port, in a
temporary folder, with no persistence: started and killed by the test that uses it, and startable
again on the same port (a test of Redis dying and coming back)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One `redis-server` process; `url` stays the same across `kill` and `start`."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port = folder, port
        self.url = f"redis://127.0.0.1:{port}"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        assert REDIS_SERVER is not None and self.proc is None
        self.proc = await asyncio.create_subprocess_exec(
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        async with asyncio.timeout(10):
            while True:  # listening once it answers PING
                try:
                    r, w = await asyncio.open_connection("127.0.0.1", self.port)
                except OSError:
                    assert self.proc.returncode is None, "redis-server exited at start"
                    await asyncio.sleep(0.02)
                    continue
                w.write(b"PING\r\n")
                line = await r.readline()
                w.close()
                await w.wait_closed()
                if line.startswith(b"+PONG"):
                    return
                await asyncio.sleep(0.02)

    async def kill(self) -> None:
        """SIGKILL: Redis dies mid-whatever (no persistence: it comes back empty)."""
        if self.proc is not None:
            if self.proc.returncode is None:
                self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
            self.proc = None


@asynccontextmanager
async def redis_server(folder: Path) -> AsyncIterator[RedisServer]:
    """A running redis-server for one test, killed when it ends (skipped where none is installed,
    except in CI, where .ci/run installs it with `make redis`)."""
    if REDIS_SERVER is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing: .ci/run installs it with `make redis`")
        pytest.skip("redis-server is missing (make redis)")
    server = RedisServer(folder, free_port())
    try:
        await server.start()
        yield server
    finally:
        await server.kill()
