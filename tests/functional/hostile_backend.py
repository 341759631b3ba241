"""A hostile backend in a process of its own: `python -m tests.functional.hostile_backend CASE`
listens on a free loopback port, prints it, and answers every POST (CASE `post-*`) or every GET
(CASE `get-*`) endlessly, the other requests with a small 200. Out of the gateway's process, so
the flood costs the gateway's event loop nothing but what the gateway itself does with it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

from tests.functional.raw_servers import SSE_HEAD, TOK_EVENT, chunk, read_request

MODELS_OK = b'{"object":"list","data":[]}'
Flood = Callable[[asyncio.StreamWriter], Awaitable[None]]


async def _forever(w: asyncio.StreamWriter, piece: bytes) -> None:
    while True:
        w.write(piece)
        await w.drain()


async def endless_content(w: asyncio.StreamWriter) -> None:
    w.write(SSE_HEAD)
    await _forever(w, chunk(TOK_EVENT * 400))


async def endless_comments(w: asyncio.StreamWriter) -> None:
    w.write(SSE_HEAD)
    await _forever(w, chunk(b": keep-alive\n\n" * 4000))


async def endless_header(w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Endless: ")
    await _forever(w, b"a" * 65536)


async def endless_event(w: asyncio.StreamWriter) -> None:
    w.write(SSE_HEAD + chunk(b"data: {"))
    await _forever(w, chunk(b"x" * 65536))


async def endless_event_after_content(w: asyncio.StreamWriter) -> None:
    w.write(SSE_HEAD + chunk(TOK_EVENT) + chunk(b"data: {"))
    await _forever(w, chunk(b"x" * 65536))


async def endless_body(w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunk(b'{"object":"list","data":['))
    await _forever(w, chunk(b'{"id":"m","object":"model"},' * 2000))


CASES: dict[str, tuple[str, Flood]] = {
    "post-content": ("POST", endless_content), "post-comments": ("POST", endless_comments),
    "post-header": ("POST", endless_header), "post-event": ("POST", endless_event),
    "post-event-after-content": ("POST", endless_event_after_content), "get-body": ("GET", endless_body),
}


async def main(case: str) -> None:
    method, flood = CASES[case]

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await read_request(r)
                if head.startswith(method.encode()):
                    await flood(w)
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                        % (len(MODELS_OK), MODELS_OK))
                await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
