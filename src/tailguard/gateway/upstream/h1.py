"""The gateway's HTTP/1.1 client for its backends: one `asyncio.Protocol` per connection, parsed by
llhttp (`httptools`), with the body handed out in two ways.

    resp = await conn.request(head, body)     the response's status and headers
    data = await resp.readany()               pull: the next bytes of the body, b"" at its end
    ended = await resp.push(on_data)          push: `on_data(bytes) -> bool` is called from
                                              `data_received` itself, until it returns False

Push is why this exists: a relayed stream's chunk goes from the backend's socket to the client's
in one callback, with no task woken and no await chain resumed per chunk, which is most of what a
general client (aiohttp's `StreamReader`) costs a relay that moves tens of thousands of chunks a
second. Pull serves everything else (a preemptible request's parsed relay, a non-stream answer).

Flow control both ways: while nobody reads (pull) the socket is paused past `_HIGH_WATER`
buffered bytes; `on_data` returning False (the consumer must wait, e.g. for its client to drain)
pauses it until the next `readany` or `push`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httptools

from tailguard.errors import GatewayError

_HIGH_WATER = 64 * 1024
# Most of the body `readany` hands out at once. A backend that floods fills a 256 KiB socket read
# at a time, and a reader that parses every event of it (a non-stream answer, a preamble) would
# hold the event loop for tens of milliseconds; in slices, with the loop run between them, every
# other request and `/health` keep being served.
_SLICE = 16 * 1024
MAX_HEAD = 64 * 1024  # the default bound of a response's head (`limits.max_response_head_bytes`)


class UpstreamBroke(GatewayError):
    """The connection ended before the response did. `answered`: the status line had come."""

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


class H1Response:
    """One response being received on an `H1Connection`."""

    __slots__ = ("conn", "status", "headers", "_chunks", "_size", "_ended", "_error", "_waiter", "_push", "_sliced")

    def __init__(self, conn: H1Connection) -> None:
        self.conn = conn
        self.status = 0
        self.headers: dict[str, str] = {}  # names lowercased
        self._chunks: list[bytes] = []
        self._size = 0
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._push: Callable[[bytes], bool] | None = None
        self._sliced = False  # the last `readany` left bytes it had: the loop runs before the next

    # -- the protocol's side -------------------------------------------------------------------

    def _end(self, error: BaseException | None = None) -> None:
        if error is None:
            self._ended = True
        elif self._error is None:
            self._error = error
        self._push = None
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- the consumer's side -------------------------------------------------------------------

    async def _wait(self) -> None:
        self.conn.resume()
        self._waiter = self.conn.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def readany(self) -> bytes:
        """The body's next bytes (all that has arrived), or b"" once it ended. Raises
        `UpstreamBroke` when the connection ended before it."""
        if self._sliced:
            self._sliced = False
            await asyncio.sleep(0)
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._ended:
                return b""
            await self._wait()
        if self._size > _SLICE:
            return self._slice()
        data = b"".join(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
        self._chunks.clear()
        self._size = 0
        return data

    def _slice(self) -> bytes:
        """The first `_SLICE` bytes of a large buffer (whole pieces where they fit); the rest
        stays for the next `readany`, after the loop has run."""
        chunks = self._chunks
        out: list[bytes] = []
        n = 0
        while n < _SLICE:
            piece = chunks[0]
            if n + len(piece) > _SLICE:
                cut = _SLICE - n
                out.append(piece[:cut])
                chunks[0] = piece[cut:]
                n = _SLICE
            else:
                out.append(chunks.pop(0))
                n += len(piece)
        self._size -= n
        self._sliced = True
        return b"".join(out)

    async def read(self, limit: int) -> bytes:
        """The body up to `limit` bytes (an error answer's)."""
        out = bytearray()
        while len(out) < limit and (data := await self.readany()):
            out += data
        return bytes(out[:limit])

    async def push(self, on_data: Callable[[bytes], bool]) -> bool:
        """Hand each arriving piece of the body to `on_data` as it comes, from the protocol's own
        callback, until `on_data` returns False (True is returned then, if the body also ended)
        or the body ends (True). What had arrived before goes first. Raises what `on_data`
        raised, or `UpstreamBroke`."""
        chunks = self._chunks
        while chunks:
            data = chunks.pop(0)
            self._size -= len(data)
            if not on_data(data):
                return self._ended and not chunks
        if self._error is not None:
            raise self._error
        if self._ended:
            return True
        self._push = on_data
        try:
            await self._wait()
        finally:
            self._push = None
        if self._error is not None:
            raise self._error
        return self._ended and not self._chunks

    def unread(self, data: bytes) -> None:
        """Put back `data`, read already, to be read (or pushed) again first: a hedge's race
        reads each attempt up to its first content before the winner is relayed."""
        if data:
            self._chunks.insert(0, data)
            self._size += len(data)

    def release(self) -> None:
        """Done with the response: its connection goes back to the pool if the response ended
        and the connection may be kept, else it is closed."""
        self.conn.done(self)

    def close(self) -> None:
        """Abort, unless released already: the connection is closed (the backend sees its client
        leave and stops), and a reader waiting on it gets `UpstreamBroke`."""
        self.conn.abort(self)


class H1Connection(asyncio.Protocol):
    """One connection to a backend, sending one request at a time. `pool` gets it back after a
    response that ended and left the connection reusable (`done`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_idle: Callable[[H1Connection], None],
                 on_lost: Callable[[H1Connection], None]) -> None:
        self.loop = loop
        self._on_idle, self._on_lost = on_idle, on_lost
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._resp: H1Response | None = None
        self._head: asyncio.Future[H1Response] | None = None
        self._complete = False
        self._delimited = False  # the body has a length or is chunked (else: until the close)
        self._keep = False  # the connection may carry another request after this response
        self._head_size = 0  # bytes of this response's header lines so far
        self._read_in_head = 0  # bytes of the reads that ended with the head still incomplete
        self._max_head = MAX_HEAD
        self._paused = False

    async def request(self, head: bytes, body: bytes, *, keep: bool = True, max_head: int = MAX_HEAD) -> H1Response:
        """Send one request (`keep`: it did not ask for the connection's close); returns once
        the response's headers are in. Raises `UpstreamBroke` when the connection ends first,
        `httptools.HttpParserError` on a malformed answer or one whose head passes `max_head`
        bytes (counted as they arrive: llhttp keeps a header value it has not seen the end of,
        so a value that never ends would grow without bound)."""
        assert self.transport is not None and self._resp is None
        if self.closed:
            raise UpstreamBroke("Connection closed", answered=False)
        self._resp = H1Response(self)
        self._complete = self._delimited = False
        self._keep = keep
        self._head_size = self._read_in_head = 0
        self._max_head = max_head
        self._head = self.loop.create_future()
        self.transport.write(head + body)
        try:
            return await self._head
        finally:
            self._head = None

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        resp = self._resp
        if resp is None or self._complete:
            # Bytes on an idle connection, or after the answer ended (a server's 408 before it
            # closes one, say), answer nothing: the connection is not trusted with another request.
            if resp is None:
                self.abort()
            self._keep = False
            return
        try:
            self._parser.feed_data(data)
            if not resp.status:  # still in the head: what llhttp holds of it grows with each read
                self._read_in_head += len(data)
                self._check_head(self._read_in_head)
        except httptools.HttpParserError as e:
            answered = bool(resp.status)  # past the head: the body is what broke
            self._fail(UpstreamBroke(f"Malformed response body: {e}", answered=True) if answered else e)
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self._resp
        if resp is not None and not self._complete:
            if resp.status and not self._delimited:
                self._complete = True  # a body that runs until the close has ended
                resp._end()
            else:
                self._fail(UpstreamBroke(f"Server disconnected{f': {exc}' if exc else ''}",
                                         answered=bool(resp.status)))
        self._on_lost(self)

    # -- llhttp's callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:  # a second message after the answer, in the same read: never reused
            self._keep = False

    def _check_head(self, size: int) -> None:
        if size > self._max_head:  # a runaway backend must not grow the gateway's memory
            raise httptools.HttpParserError(f"response head over {self._max_head} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        resp = self._resp
        if resp is not None and not self._complete:
            self._head_size += len(name) + len(value)
            self._check_head(self._head_size)
            key = name.decode("latin-1").lower()
            resp.headers[key] = value.decode("latin-1")
            if key in ("content-length", "transfer-encoding"):
                self._delimited = True

    def on_headers_complete(self) -> None:
        resp = self._resp
        if resp is None or self._complete:
            return
        resp.status = self._parser.get_status_code()
        if resp.status < 200:  # 100 Continue and the like: the real answer follows
            resp.status = 0
            resp.headers.clear()
            return
        if self._head is not None and not self._head.done():
            self._head.set_result(resp)

    def on_body(self, body: bytes) -> None:
        """A piece of the body: to the response's push consumer, or into its buffer for
        `readany`. The response's side, written here rather than as a method of the response so
        that a relayed chunk costs one Python call before the consumer's (`H1Response.push`)."""
        resp = self._resp
        if resp is None or self._complete:
            return
        push = resp._push
        if push is not None:
            try:
                if push(body):
                    return
            except Exception as e:  # the consumer's failure (its client left): raised by push()
                resp._error = e
            resp._push = None
            self.pause()
            resp._wake()
            return
        resp._chunks.append(body)
        resp._size += len(body)
        if resp._size > _HIGH_WATER:
            self.pause()
        resp._wake()

    def on_message_complete(self) -> None:
        resp = self._resp
        if resp is not None and resp.status and not self._complete:
            self._complete = True
            self._keep = self._keep and self._parser.should_keep_alive()
            resp._end()

    # -- the response's side ------------------------------------------------------------------

    def _fail(self, err: BaseException) -> None:
        if self._head is not None and not self._head.done():
            self._head.set_exception(err)
        elif self._resp is not None:
            self._resp._end(err)

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def done(self, resp: H1Response) -> None:
        """The response's consumer is done with it: reuse the connection or close it."""
        if self._resp is not resp:
            return
        if self._complete and self._keep and not self.closed:
            self._resp = None
            self.resume()
            self._on_idle(self)  # the pool notes since when it is idle
        else:
            self.abort(resp)

    def abort(self, resp: H1Response | None = None) -> None:
        """Close the connection, failing what waits on it; with `resp`, only while that response
        is the one on it (a response released earlier must not close its successor's)."""
        if resp is not None and self._resp is not resp:
            return
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        current = self._resp
        self._fail(UpstreamBroke("Connection closed", answered=current is not None and bool(current.status)))
        self._resp = None
