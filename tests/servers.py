"""Run real aiohttp apps on loopback inside a test's event loop; every test server is torn down."""

from __future__ import annotations

import asyncio
import re
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from aiohttp import web


@asynccontextmanager
async def running(app: web.Application, **runner_kwargs: Any) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 at an ephemeral port; yields its base URL (no trailing slash).

    `runner_kwargs` go to `web.AppRunner` (e.g. `handler_cancellation=True`, which the gateway
    and the simulator need to notice a client that disconnects while nothing is being written)."""
    runner = web.AppRunner(app, handle_signals=False, **runner_kwargs)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def listening_url(proc: asyncio.subprocess.Process, who: str) -> str:
    """The base URL `who` (`tailguard sim`, or `gateway` in `tailguard serve`, which with `--sim`
    first says where its simulator listens) says it listens on, its process's stderr read up to
    that line; the caller bounds the wait."""
    assert proc.stderr is not None
    while True:
        line = (await proc.stderr.readline()).decode()
        assert line, "the process exited before listening"
        m = re.search(who + r" listening on (http://127\.0\.0\.1:\d+)", line)
        if m:
            return m.group(1)
