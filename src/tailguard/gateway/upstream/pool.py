"""Keep-alive connections to the backends, by origin: the one most recently used is reused first
(it is the least likely to have been closed by the backend's idle timeout), one idle longer
than `keepalive_s` is closed instead, and one the backend closed while idle leaves at once.

    conn = await pool.connection(origin, connect_s=5.0, fresh=False)
    resp = await conn.request(origin.head("POST", path, headers, len(body)), body)
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

from tailguard.clock import Now
from tailguard.gateway.upstream.h1 import H1Connection


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a backend's URL points: what a connection needs, and the request line's prefix."""

    scheme: str
    host: str
    port: int
    base_path: str  # the URL's own path, which request paths extend
    host_header: str

    def head(self, method: str, path: str, headers: Mapping[str, str], length: int) -> bytes:
        """The request's head, encoded once: request line, Host, the given headers, the length."""
        lines = [f"{method} {self.base_path}{path} HTTP/1.1", f"Host: {self.host_header}"]
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        lines.append(f"Content-Length: {length}\r\n\r\n")
        return "\r\n".join(lines).encode("latin-1")


@lru_cache(maxsize=256)
def origin_of(url: str) -> Origin:
    """Parse a backend's URL once (the config validated it)."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    default = 443 if u.scheme == "https" else 80
    port = u.port or default
    host = u.hostname
    shown = f"[{host}]" if ":" in host else host
    return Origin(u.scheme, host, port, u.path.rstrip("/"), shown if port == default else f"{shown}:{port}")


class Pool:
    """Idle connections per origin (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Now, *, keepalive_s: float = 30.0) -> None:
        self.loop = loop
        self._clock = clock
        self.keepalive_s = keepalive_s
        self._idle: dict[Origin, list[H1Connection]] = {}
        self._origin: dict[H1Connection, Origin] = {}
        self._tls: ssl.SSLContext | None = None

    async def connection(self, origin: Origin, connect_s: float, *, fresh: bool = False) -> H1Connection:
        """An idle connection to `origin` (unless `fresh`), or a new one. Raises OSError
        (refused, unreachable) or TimeoutError (no new connection within `connect_s`)."""
        if not fresh:
            idle = self._idle.get(origin)
            stale_before = self._clock() - self.keepalive_s
            while idle:
                conn = idle.pop()
                if conn.idle_since >= stale_before and not conn.closed:
                    return conn
                conn.abort()
        return await self._connect(origin, connect_s)

    async def _connect(self, origin: Origin, connect_s: float) -> H1Connection:
        tls = None
        if origin.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        async with asyncio.timeout(connect_s):
            _, conn = await self.loop.create_connection(
                lambda: H1Connection(self.loop, self._idle_again, self._lost), origin.host, origin.port, ssl=tls)
        self._origin[conn] = origin
        return conn

    def _idle_again(self, conn: H1Connection) -> None:
        conn.idle_since = self._clock()
        origin = self._origin.get(conn)
        if origin is not None:
            self._idle.setdefault(origin, []).append(conn)

    def _lost(self, conn: H1Connection) -> None:
        origin = self._origin.pop(conn, None)
        idle = self._idle.get(origin) if origin is not None else None
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        """Close every connection, idle or not (at shutdown: what still runs is being cancelled)."""
        for conn in list(self._origin):
            conn.abort()
        self._idle.clear()
