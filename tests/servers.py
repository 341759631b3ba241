"""Run real aiohttp apps on loopback inside a test's event loop; every test server is torn down."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

from aiohttp import web


@asynccontextmanager
async def running(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 at an ephemeral port; yields its base URL (no trailing slash)."""
    runner = web.AppRunner(app, handle_signals=False)
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
