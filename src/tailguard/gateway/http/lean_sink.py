"""The lean server's answers: HTTP/1.1 heads and chunked frames written straight to the client's
transport, a stream's head together with its first chunk in one write (nginx's `sendfile`-less
proxy path does the same: one `writev` of head and first buffer).

    sink = LeanSink(conn, always)      `always`: the headers every answer carries
    await sink.begin(first, headers, eof=False); sink.write_nowait(data) ...; await sink.end(b"")
    conn.write(reply_bytes(reply, always, close=...))   an answer that did not stream
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol

from tailguard.gateway.http.inbound import Reply
from tailguard.gateway.sink import SSE_HEADERS, ClientGone

# Bytes buffered toward a client before a write waits for them to drain (as `ResponseSink`).
HIGH_WATER = 64 * 1024
LAST_CHUNK = b"0\r\n\r\n"


class Connection(Protocol):
    """What a sink needs of the lean connection it answers on."""

    @property
    def transport(self) -> asyncio.Transport | None: ...

    @property
    def closes_after(self) -> bool: ...  # this answer is the connection's last

    # Plain attributes, read per chunk: the client has left (or the connection is ending), and
    # its socket buffer is past `HIGH_WATER` (`pause_writing` came, `resume_writing` not yet).
    closing: bool
    paused: bool

    async def writable(self) -> None: ...  # raises ClientGone once the client has left


_date_at = 0
_date = ""


def _http_date() -> str:
    """The `Date` header, made once a second (aiohttp and nginx cache it the same way)."""
    global _date_at, _date
    now = int(time.time())
    if now != _date_at:
        _date_at, _date = now, formatdate(now, usegmt=True)
    return _date


# Each status line once (an `HTTPStatus(status)` lookup is an enum call per answer).
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n" for s in HTTPStatus}


def head(status: int, headers: Mapping[str, str], always: Mapping[str, str], framing: str, close: bool) -> bytes:
    """A response head: status line, the answer's headers, then those every answer carries."""
    lines = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n"]
    lines += [f"{k}: {v}\r\n" for k, v in headers.items()]
    lines += [f"{k}: {v}\r\n" for k, v in always.items()]
    lines.append(f"Date: {_http_date()}\r\nServer: tailguard\r\n{framing}\r\n")
    if close:
        lines.append("Connection: close\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("utf-8")


def reply_bytes(reply: Reply, always: Mapping[str, str], *, close: bool) -> bytes:
    return head(reply.status, reply.headers, always, f"Content-Length: {len(reply.body)}", close) + reply.body


def frame(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data) if data else b""


class LeanSink:
    """The client's answer on a lean connection: an SSE stream, or one JSON body."""

    __slots__ = ("_conn", "_always", "_t", "started", "ended")

    def __init__(self, conn: Connection, always: Mapping[str, str]) -> None:
        self._conn = conn
        self._always = always
        self._t: asyncio.Transport | None = None  # the stream's transport, once it has begun
        self.started = False
        self.ended = False

    def _transport(self) -> asyncio.Transport:
        t = self._conn.transport
        if t is None or t.is_closing():
            raise ClientGone()
        return t

    async def begin(self, first: bytes, headers: Mapping[str, str], *, eof: bool) -> None:
        t = self._transport()
        self.started = True
        h = head(200, {**SSE_HEADERS, **headers}, self._always, "Transfer-Encoding: chunked", self._conn.closes_after)
        t.write(h + frame(first) + (LAST_CHUNK if eof else b""))
        self.ended = eof
        self._t = t

    @property
    def direct(self) -> tuple[Connection, asyncio.Transport] | None:
        """The connection and transport `write_nowait` writes to, for the relay's C step: it does
        the same with them (`tailguard.speedups`); None before the stream has begun."""
        return None if self._t is None else (self._conn, self._t)

    def write_nowait(self, data: bytes) -> bool:
        """Hand one chunk to the client's transport; False when the client reads slower than we
        write and the caller should `await drain()`. Raises `ClientGone` once it has left.

        The relay's per-chunk call: the connection's flags are attributes, not the transport's
        methods (`is_closing`, `get_write_buffer_size`), which cost a call each."""
        conn, t = self._conn, self._t
        if conn.closing or t is None:
            raise ClientGone()
        t.write(b"%x\r\n%b\r\n" % (len(data), data))
        return not conn.paused

    async def drain(self) -> None:
        await self._conn.writable()

    async def write(self, data: bytes) -> None:
        if not self.write_nowait(data):
            await self.drain()

    async def end(self, data: bytes) -> None:
        self._transport().write(frame(data) + LAST_CHUNK)
        self.ended = True

    async def answer(self, body: bytes, headers: Mapping[str, str]) -> None:
        t = self._transport()
        self.started = self.ended = True
        t.write(head(200, {"Content-Type": "application/json", **headers}, self._always,
                     f"Content-Length: {len(body)}", self._conn.closes_after) + body)

    def finish(self) -> None:
        """End a stream its exchange left open (it failed after its first bytes), as aiohttp
        ends a prepared response its handler returned."""
        t = self._conn.transport
        if self.started and not self.ended and t is not None and not t.is_closing():
            t.write(LAST_CHUNK)
            self.ended = True
