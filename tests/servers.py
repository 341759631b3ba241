"""Run real aiohttp apps on loopback inside a test's event loop; every test server is torn down."""

from __future__ import annotations

import socket
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from aiohttp import web


@asynccontextmanager
async def running(app: web.Application, runner: web.AppRunner | None = None, sock: socket.socket | None = None,
                  **runner_kwargs: Any) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 at an ephemeral port, or on `sock` (bound to one already, so its
    address was known and held before); yields its base URL (no trailing slash).

    `runner_kwargs` go to `web.AppRunner` (e.g. `handler_cancellation=True`, which the gateway
    and the simulator need to notice a client that disconnects while nothing is being written),
    unless a `runner` is given (the gateway's own, `gateway.http.app.gateway_runner`)."""
    runner = runner or web.AppRunner(app, handle_signals=False, **runner_kwargs)
    await runner.setup()
    site: web.BaseSite = web.TCPSite(runner, "127.0.0.1", 0) if sock is None else web.SockSite(runner, sock)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
