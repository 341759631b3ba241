"""Where an exchange's output goes. The HTTP handler's is `ResponseSink` (an aiohttp response);
`ChunkQueue` hands the same bytes to code inside the process (a batch runner, a hedge, a test),
which reads them as an async iterator. Both raise `ClientGone` once their consumer has left.

    sink.begin(first, headers, eof=False)   the stream opens with its first bytes
    sink.write(data) ... sink.end(data)      the rest, and its end in the same send
    sink.write_nowait(data) or await drain() the relay's per-chunk form of write
    sink.answer(body, headers)               or a whole non-stream JSON answer at once
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from aiohttp import web

from tailguard.errors import GatewayError

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(GatewayError):
    """Writing to the consumer failed: the client disconnected."""


class Sink(Protocol):
    @property
    def started(self) -> bool:
        """Bytes have gone out: from here a failure ends the stream instead of being retried."""
        ...

    @property
    def ended(self) -> bool:
        """The answer is whole: its last bytes have gone out (or were queued)."""
        ...

    async def begin(self, first: bytes, headers: Mapping[str, str], *, eof: bool) -> None: ...

    async def write(self, data: bytes) -> None: ...

    def write_nowait(self, data: bytes) -> bool:
        """Write without waiting; False when the caller should `await drain()` before the next."""
        ...

    @property
    def direct(self) -> tuple[object, asyncio.Transport] | None:
        """Where the relay's C step (`tailguard.speedups`) may write a chunk's frame itself, as
        `write_nowait` would: the connection whose `closing` and `paused` it reads, and the
        transport; None: each chunk through `write_nowait`."""
        ...

    async def drain(self) -> None: ...

    async def end(self, data: bytes) -> None: ...

    async def answer(self, body: bytes, headers: Mapping[str, str]) -> None: ...


class _SSEResponse(web.StreamResponse):
    """Sends its headers together with the first chunk (one write instead of two), as aiohttp's
    own `web.Response` does; the relay always writes a chunk right after `prepare`."""

    _send_headers_immediately = False


# Bytes buffered toward a client before a write waits for them to drain (aiohttp's own limit).
_HIGH_WATER = 64 * 1024


class ResponseSink:
    """The client's HTTP response: an SSE stream, or one JSON body.

    Once the stream's headers and first bytes are out, each further write is one chunked frame
    handed to the transport (`write_nowait`): aiohttp's writer would take two coroutine frames
    and its bookkeeping per chunk for the same bytes, and a relay writes tens of thousands of
    chunks a second. The end still goes through aiohttp (`write_eof`), which writes the last
    frame and the terminator and keeps the connection's state right."""

    __slots__ = ("request", "response", "_transport", "ended")
    direct = None  # its writes keep aiohttp's checks (`write_nowait`)

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self._transport: asyncio.Transport | None = None
        self.ended = False

    @property
    def started(self) -> bool:
        return self.response is not None

    async def begin(self, first: bytes, headers: Mapping[str, str], *, eof: bool) -> None:
        resp = _SSEResponse(status=200, headers={**SSE_HEADERS, **headers})
        self.response = resp
        self.ended = eof
        try:
            await resp.prepare(self.request)
            if eof:
                await resp.write_eof(first)
            else:
                await resp.write(first)
        except ConnectionError:
            raise ClientGone() from None
        self._transport = self.request.transport

    def write_nowait(self, data: bytes) -> bool:
        """Hand one chunk to the client's transport; False when the client reads slower than we
        write and the caller should `await drain()`. Raises `ClientGone` once it has left."""
        t = self._transport
        if t is None or t.is_closing():
            raise ClientGone()
        t.write(b"%x\r\n%b\r\n" % (len(data), data))
        return t.get_write_buffer_size() < _HIGH_WATER

    async def drain(self) -> None:
        try:
            await self.request.writer.drain()
        except ConnectionError:
            raise ClientGone() from None

    async def write(self, data: bytes) -> None:
        if not self.write_nowait(data):
            await self.drain()

    async def end(self, data: bytes) -> None:
        self.ended = True
        try:
            await self.response.write_eof(data)  # type: ignore[union-attr]
        except ConnectionError:
            raise ClientGone() from None

    async def answer(self, body: bytes, headers: Mapping[str, str]) -> None:
        resp = web.Response(body=body, content_type="application/json", headers=headers)
        self.response = resp
        self.ended = True
        try:
            await resp.prepare(self.request)
            await resp.write_eof()
        except ConnectionError:
            raise ClientGone() from None


class ChunkQueue:
    """An exchange's output for a consumer in the same process: `headers` once it began, then
    `async for chunk in queue` until the end. `close()` is the consumer leaving: the exchange's
    next write raises `ClientGone`, which ends it (and aborts the engine's request) at once."""

    def __init__(self, maxsize: int = 0) -> None:
        self.headers: dict[str, str] = {}
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize)
        self._started = False
        self._closed = False
        self._waiting: bytes | None = None  # a chunk `write_nowait` found no room for
        self.direct = None  # (no transport: each chunk is queued)
        self.ended = False

    @property
    def started(self) -> bool:
        return self._started

    async def _put(self, data: bytes | None) -> None:
        if self._closed:
            raise ClientGone()
        await self._queue.put(data)

    async def begin(self, first: bytes, headers: Mapping[str, str], *, eof: bool) -> None:
        self._started = True
        self.headers = dict(headers)
        self.ended = eof
        await self._put(first)
        if eof:
            await self._put(None)

    async def write(self, data: bytes) -> None:
        await self._put(data)

    def write_nowait(self, data: bytes) -> bool:
        if self._closed:
            raise ClientGone()
        try:
            self._queue.put_nowait(data)
        except asyncio.QueueFull:
            self._waiting = data
            return False
        return True

    async def drain(self) -> None:
        if self._waiting is not None:
            data, self._waiting = self._waiting, None
            await self._put(data)

    async def end(self, data: bytes) -> None:
        self.ended = True
        await self.drain()
        await self._put(data)
        await self._put(None)

    async def answer(self, body: bytes, headers: Mapping[str, str]) -> None:
        await self.begin(body, headers, eof=True)

    def close(self) -> None:
        """The consumer is gone: what is queued is dropped (a bounded queue's writer waiting for
        room gets it, and its next write raises `ClientGone`)."""
        self._closed = True
        while not self._queue.empty():
            self._queue.get_nowait()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (data := await self._queue.get()) is not None:
            if data:
                yield data
