"""The lean server of the hot routes: `POST /v1/chat/completions` and `POST /v1/completions` read
by the gateway's own `asyncio.Protocol` on llhttp (`httptools`, as uvicorn's `httptools_impl`
and the gateway's own upstream client `gateway.upstream.h1`), served by the proxy, answered
straight into the transport (`gateway.http.lean_sink`).

Every connection starts here. A request that is not a plain HTTP/1.1 request for a hot route (any
other route or method, HTTP/1.0, an upgrade, `Content-Encoding`, an `Expect` other than
`100-continue`, a head llhttp refuses, a connection opened above the cap) is handed, with every
byte received of it, to aiohttp's handler (`GatewayProtocol`), which keeps the connection from
then on: one server answers everything exactly as before, and the lean one only takes what it
does the same way at a third of the cost. A head past the bounds of either (`inbound.MAX_HEAD_*`:
a line, the headers' count, 64 KiB in all, counted as its bytes arrive) is answered 431 here and
the connection closed.

Per connection, what `gateway.http.server` does for aiohttp's: the header deadline, the
keep-alive timeout, the connection cap (the server counts both kinds). Per request: the body
bounded in size (at its `Content-Length`, else as it arrives) and in time (the proxy's
`body_timeout_s`), `100 Continue` sent when the proxy first reads the body, a client that leaves
cancels its handler (so its upstream request), and a request sent before the previous answer
ended (pipelining) is not read: that answer is the connection's last. (A request sent after the
answer's last byte, while its handler still counts and logs it, is read once the handler ends.)
"""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol, cast

import httptools
from multidict import CIMultiDict

from tailguard.errors import APIError
from tailguard.gateway.http.deadline import Deadline
from tailguard.gateway.http.inbound import (
    MAX_HEAD_BYTES, MAX_HEAD_LINE, MAX_HEADERS, Inbound, Reply, body_broken, body_late, check_media_type,
    head_too_large, too_large,
)
from tailguard.gateway.http.lean_sink import HIGH_WATER, LeanSink, reply_bytes
from tailguard.gateway.sink import ClientGone
from tailguard.wire.openai import Endpoint

HOT: dict[bytes, Endpoint] = {b"/v1/chat/completions": "chat", b"/v1/completions": "completions"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Answerer(Protocol):
    """The proxy, as the lean server calls it."""

    async def answer(self, inbound: Inbound, endpoint: Endpoint) -> Reply | None: ...


class Host(Protocol):
    """The server a lean connection belongs to (`gateway.http.server.GatewayServer`)."""

    @property
    def proxy(self) -> Answerer | None: ...

    @property
    def max_body_bytes(self) -> int: ...

    @property
    def config_hash(self) -> str: ...

    def admit(self, conn: LeanProtocol) -> bool | None: ...  # True in, False refused, None: reserve only

    def forget(self, conn: LeanProtocol) -> None: ...

    def closed(self, reason: str) -> None: ...

    def malformed(self, status: int) -> None: ...  # a request refused before it had a class

    def hand_off(self, transport: asyncio.Transport, data: bytes, reserve_only: bool) -> None: ...

    def timeouts(self) -> tuple[float, float]: ...  # header_timeout_s, keepalive_timeout_s


class _Pipelined(Exception):
    """A request began before the previous one was answered: stop parsing."""


def _pipelined(e: Exception) -> bool:
    """llhttp stopped because a callback raised `_Pipelined` (it wraps what a callback raises)."""
    return isinstance(e, httptools.HttpParserCallbackError) and isinstance(e.__context__, _Pipelined)


class LeanRequest:
    """One hot request on a lean connection: the proxy's `Inbound`."""

    __slots__ = ("conn", "method", "path", "endpoint", "headers", "keep_alive", "expect_continue", "length",
                 "limit", "body", "complete", "error", "always", "sink_", "_waiter")

    def __init__(self, conn: LeanProtocol, path: str, endpoint: Endpoint, headers: CIMultiDict[str],
                 keep_alive: bool, limit: int, config_hash: str) -> None:
        self.conn = conn
        self.method = "POST"
        self.path = path
        self.endpoint = endpoint
        self.headers = headers
        self.keep_alive = keep_alive
        self.expect_continue = headers.get("Expect", "").lower() == "100-continue"
        length = headers.get("Content-Length")
        self.length = int(length) if length is not None else None  # llhttp checked it is a number
        self.limit = limit
        self.body = bytearray()
        self.complete = False
        self.error: APIError | None = None
        self.always = {"X-Tailguard-Config": config_hash, "x-request-id": ""}
        self.sink_: LeanSink | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- the parser's side ---------------------------------------------------------------------

    def add(self, data: bytes) -> None:
        if self.error is not None:
            return
        if len(self.body) + len(data) > self.limit:
            self.fail(too_large(self.limit))  # a chunked body past the limit: not kept
            return
        self.body += data

    def finish(self) -> None:
        self.complete = True
        self._wake()

    def fail(self, err: APIError) -> None:
        if self.error is None:
            self.error = err
        self.conn.pause_reading()  # the connection closes after the answer: read nothing more
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- the proxy's side (`Inbound`) ----------------------------------------------------------

    @property
    def remote(self) -> str | None:
        return self.conn.remote

    def named(self, request_id: str) -> None:
        self.always["x-request-id"] = request_id

    async def read_body(self, max_bytes: int, timeout_s: float) -> bytes:
        if self.length is not None and self.length > max_bytes:
            raise too_large(max_bytes)
        ctype = self.headers.get("Content-Type")
        check_media_type(None if ctype is None else ctype.partition(";")[0].strip().lower())
        if not self.complete and self.error is None:
            if self.expect_continue:  # the client waits for this before it sends the body
                self.expect_continue = False
                self.conn.write(_CONTINUE)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._waiter
            except TimeoutError:
                raise body_late(timeout_s) from None
            finally:
                self._waiter = None
        if self.error is not None:
            raise self.error
        if len(self.body) > max_bytes:  # the limit was lowered by a reload while it arrived
            raise too_large(max_bytes)
        return bytes(self.body)

    def body_unread(self) -> bool:
        return not self.complete or self.error is not None

    def sink(self) -> LeanSink:
        self.sink_ = LeanSink(self.conn, self.always)
        return self.sink_


class LeanProtocol(asyncio.Protocol):
    """One client connection, served lean until a request needs aiohttp (then handed to it)."""

    __slots__ = ("_host", "_loop", "_parser", "transport", "reserve_only", "remote", "_raw", "_url", "_headers",
                 "_head_done", "_req", "_task", "_deadline", "closing", "_pipelined", "_kept", "_early", "paused", "_writable", "_foreign",
                 "_head_over", "_head_size")

    def __init__(self, host: Host, loop: asyncio.AbstractEventLoop) -> None:
        self._host = host
        self._loop = loop
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.reserve_only = False
        self.remote: str | None = None
        self._raw = bytearray()  # the current request's bytes until it is served lean (for a hand-off)
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_done = False
        self._foreign = False  # the current request goes to aiohttp
        self._head_over = False  # a line, the count or the size of its head passed its bound
        self._head_size = 0  # bytes of its request line and headers
        self._req: LeanRequest | None = None
        self._task: asyncio.Task[None] | None = None
        self._deadline = Deadline(loop)  # the head's, or keep-alive's while kept between requests
        self.closing = False  # the client left, or the connection ends: nothing more is written
        self._pipelined = False
        self._kept = False  # answered and kept alive: no byte of the next request yet
        # Bytes of the next request that came after the answer's last byte went out but before
        # its handler had ended (it still counts and logs): read once it has.
        self._early = bytearray()
        self.paused = False  # the client's socket buffer is full: writers wait
        self._writable: asyncio.Future[None] | None = None

    # -- the connection ------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No request being served: a kept-alive connection, or one still sending its head."""
        return self._task is None and not self.closing

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    @property
    def closes_after(self) -> bool:
        req = self._req
        return self._pipelined or req is None or not req.keep_alive or req.body_unread()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t = cast(asyncio.Transport, transport)
        admitted = self._host.admit(self)
        if admitted is False:
            self.closing = True
            t.abort()
            return
        self.reserve_only = admitted is None
        sock = t.get_extra_info("socket")
        if sock is not None:  # as aiohttp's handler: chunks go out as written, dead peers are found
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        t.set_write_buffer_limits(high=HIGH_WATER)
        peer = t.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) else None
        self._deadline.arm(self._host.timeouts()[0], self._header_late)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._deadline.disarm()
        if not self.closing:
            self.closing = True
            self._host.forget(self)
        self.closing = True
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client left: its handler (and its upstream request) ends now
        w = self._writable
        if w is not None and not w.done():
            w.set_exception(ClientGone())
            w.exception()  # retrieved: nobody may be waiting on it

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        w = self._writable
        if w is not None and not w.done():
            w.set_result(None)

    async def writable(self) -> None:
        if self.closing:
            raise ClientGone()
        if self.paused:
            self._writable = self._loop.create_future()
            try:
                await self._writable
            finally:
                self._writable = None

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closing:
            self.transport.write(data)

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closing:
            self.transport.pause_reading()

    def force_close(self) -> None:
        """Close it now (an idle connection evicted for a new one, or the server stopping)."""
        if self.transport is not None:
            self.transport.close()

    # -- bytes in ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self._task is not None:  # a request being served
            req = self._req
            if req is not None and not req.complete and req.error is None:
                self._feed_body(data)
            elif req is not None and req.sink_ is not None and req.sink_.ended:
                self._early += data  # the next request, sent once its answer was whole: read after
                self.pause_reading()
            else:
                self._refuse_pipelined()
            return
        if self.reserve_only:
            self._hand_off(data)
            return
        if self._kept:  # a kept-alive connection's next request: its header deadline starts now
            self._kept = False
            self._deadline.arm(self._host.timeouts()[0], self._header_late)
        self._raw += data
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            if not _pipelined(e):  # its head (or a body that came with it) is refused, or an upgrade:
                self._hand_off(bytes(self._raw))  # aiohttp answers exactly as it always has
                return
            self._pipelined = True
        if not self._head_done:
            if len(self._raw) > MAX_HEAD_BYTES:  # (what llhttp holds of an unfinished head grows with it)
                self._refuse_head()
            return
        if self._head_over:
            self._refuse_head()
            return
        if self._foreign:
            self._hand_off(bytes(self._raw))
            return
        self._serve()

    def _feed_body(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            if _pipelined(e):
                self._refuse_pipelined()
            elif self._req is not None:
                self._req.fail(body_broken())

    def _refuse_pipelined(self) -> None:
        """Bytes of a next request while this one is answered: not read; this answer is the last."""
        self._pipelined = True
        self.pause_reading()

    # -- llhttp's callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._task is not None or self._head_done:
            raise _Pipelined()
        self._url = b""
        self._headers = []
        self._head_over = False
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        self._head_over = self._head_over or len(self._url) > MAX_HEAD_LINE

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        line = len(name) + len(value)
        self._head_size += line + 4  # ": " and CRLF
        if line > MAX_HEAD_LINE or len(self._headers) > MAX_HEADERS or self._head_size > MAX_HEAD_BYTES:
            self._head_over = True

    def on_headers_complete(self) -> None:
        self._head_done = True
        p = self._parser
        path, _, _ = self._url.partition(b"?")
        endpoint = HOT.get(path)
        headers = CIMultiDict([(n.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
                               for n, v in self._headers])  # a list: one frame, not one resumed per header
        expect = headers.get("Expect")
        if (endpoint is None or p.get_method() != b"POST" or p.get_http_version() != "1.1" or p.should_upgrade()
                or "Content-Encoding" in headers or (expect is not None and expect.lower() != "100-continue")):
            self._foreign = True
            return
        self._req = LeanRequest(self, path.decode(), endpoint, headers, p.should_keep_alive(),
                                self._host.max_body_bytes, self._host.config_hash)

    def on_body(self, body: bytes) -> None:
        if self._req is not None:
            self._req.add(body)

    def on_message_complete(self) -> None:
        if self._req is not None:
            self._req.finish()

    # -- serving -------------------------------------------------------------------------------

    def _serve(self) -> None:
        """The head is in: the request's handler starts (the body, if still coming, it awaits)."""
        self._deadline.disarm()
        self._raw = bytearray()
        req = self._req
        assert req is not None
        self._task = self._loop.create_task(self._run(req))

    async def _run(self, req: LeanRequest) -> None:
        try:
            proxy = self._host.proxy
            assert proxy is not None  # a host without one makes no lean connections
            reply = await proxy.answer(req, req.endpoint)
        except asyncio.CancelledError:
            return  # the client left (or the server stops): nothing more to send
        sink = req.sink_
        if reply is not None and (sink is None or not sink.started):
            self.write(reply_bytes(reply, req.always, close=reply.close or self.closes_after))
            self._answered(reply.close)
        elif sink is not None and sink.started:
            sink.finish()
            self._answered(False)
        else:
            self._answered(True)  # nothing was sent: the client is gone

    def _answered(self, close: bool) -> None:
        """The answer is out: the connection waits for the next request, or closes."""
        if close or self.closes_after:
            self.closing = True
            self._host.forget(self)
            self.force_close()
            return
        self._task = self._req = None
        self._head_done = self._foreign = False
        self._kept = True
        self._deadline.arm(self._host.timeouts()[1], self._keepalive_late)
        if self._early:
            early, self._early = bytes(self._early), bytearray()
            self.transport.resume_reading()  # type: ignore[union-attr]
            self.data_received(early)

    def _refuse_head(self) -> None:
        """A head past its bounds: 431, counted, and the connection closed (the rest of what the
        client sends is not read)."""
        self._deadline.disarm()
        self._host.malformed(431)
        self.write(reply_bytes(Reply.of_error(head_too_large()), {}, close=True))
        self.closing = True
        self._host.forget(self)
        self.force_close()

    def _hand_off(self, data: bytes) -> None:
        """From here aiohttp's handler owns the connection, starting with `data`."""
        self._deadline.disarm()
        self.closing = True
        self._host.forget(self)  # the handler takes its place in the count
        assert self.transport is not None
        self._host.hand_off(self.transport, data, self.reserve_only)

    # -- clocks --------------------------------------------------------------------------------

    def _header_late(self) -> None:
        if self._task is None and not self.closing:
            self._host.closed("header_timeout")
            self.closing = True
            self._host.forget(self)
            self.force_close()

    def _keepalive_late(self) -> None:
        if self._kept and not self.closing:
            self.closing = True
            self._host.forget(self)
            self.force_close()

