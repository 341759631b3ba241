"""Servers on loopback that speak just enough HTTP/1.1 by hand to misbehave exactly: the raw
backends of the fault tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

# The head of a streamed answer, and one content event as an OpenAI-compatible server sends it.
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
TOK_EVENT = (b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
             b'"delta":{"content":" tok"},"finish_reason":null}]}\n\n')
DONE_END = b"%x\r\n%b\r\n0\r\n\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n")  # [DONE], then the body's end


def chunk(data: bytes) -> bytes:
    """`data` as one frame of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


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
