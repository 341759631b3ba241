"""Servers on loopback that speak just enough HTTP/1.1 by hand to misbehave exactly: the raw
backends of the fault tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handle: Handler) -> AsyncIterator[str]:
    """A TCP server on loopback speaking just enough HTTP/1.1 by hand to misbehave exactly."""
    tasks: set[asyncio.Task[None]] = set()

    async def tracked(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handle(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # torn down below; ending normally keeps asyncio's stream callback quiet
        finally:
            w.close()
            tasks.discard(task)

    server = await asyncio.start_server(tracked, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


async def read_request(r: asyncio.StreamReader) -> bytes:
    """One request: its head and its Content-Length body."""
    head = await r.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await r.readexactly(length)


async def never_answers(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await read_request(r)
    await asyncio.sleep(3600)
