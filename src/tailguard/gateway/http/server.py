"""The gateway's listening side: what a client's connection may cost it, on top of aiohttp's
server. nginx closes what aiohttp keeps, so this does what nginx does by default:

- a header deadline (`client_header_timeout`): a connection whose request head is not in within
  `limits.header_timeout_s` of its opening, or of its next request's first byte, is closed; a
  socket that sends nothing is closed then too;
- idle keep-alive connections closed after `limits.keepalive_timeout_s` (`keepalive_timeout`);
- a cap on open connections (`worker_connections`): at the cap the longest-idle connection is
  closed for the new one; with none idle, the new one may ask only for `/health` and `/metrics`
  (`limits.reserved_connections` of them, so an operator still sees the gateway), and past that
  it is closed at once; the process's open-file limit is raised at start to fit;
- a request aiohttp's parser refuses (`Content-Length` with `Transfer-Encoding`, a bad chunk size)
  answered in OpenAI's error shape, without echoing the input, and counted
  (`tailguard_unclassified_requests_total{status}`); a head past its bounds (a line over 8190
  bytes, more than 128 headers, 64 KiB in all, counted as its bytes arrive: `inbound.MAX_HEAD_*`,
  the lean server's too) answered 431.

    runner = gateway_runner(app)   # instead of web.AppRunner(app, ...)
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.web_protocol import RequestHandler

from tailguard.clock import Now
from tailguard.errors import APIError
from tailguard.config import GatewayConfig, LimitsConfig
from tailguard.gateway.http.deadline import Deadline
from tailguard.gateway.http.inbound import MAX_HEAD_BYTES, Reply, head_too_large
from tailguard.gateway.http.lean import Answerer, LeanProtocol
from tailguard.gateway.http.lean_sink import reply_bytes
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.wire.openai import error_body

log = logging.getLogger("tailguard.gateway")

# What a connection kept above the cap may ask for.
RESERVED_PATHS = frozenset({"/health", "/metrics"})
_SAY_EVERY_S = 60.0  # a refused connection is logged at most this often (the metric counts each)
_FILES_BESIDES_CLIENTS = 256  # open files the gateway needs besides its clients' connections


class GatewayProtocol(RequestHandler):
    """aiohttp's request handler with a header deadline and a parser error in OpenAI's shape."""

    # aiohttp's handler has __slots__; these are this connection's own.
    __slots__ = ("reserve_only", "_deadline", "_header_timeout_s", "_gw", "_head_bytes", "_body")

    def __init__(self, server: GatewayServer, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self.reserve_only = False  # opened above the cap: /health and /metrics only
        self._deadline = Deadline(self._loop)  # the head's
        self._header_timeout_s = header_timeout_s
        self._gw = server
        self._head_bytes = 0  # of the head being received
        self._body: Any = None  # the last head's payload (a StreamReader) while its body comes

    @property
    def idle(self) -> bool:
        """No request in hand or parsed and waiting: a kept-alive connection, or one that has
        not sent a whole head yet (or anything at all)."""
        return self._current_request is None and not self._messages and not self._force_close

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._deadline.arm(self._header_timeout_s, self._header_late)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._deadline.disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head():  # bounded in all, up to its end when this read has it
            end = data.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end + 4
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse_head()
                return
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._head_bytes = 0
            self._body = self._messages[-1][1] if self._messages else None
            self._deadline.disarm()  # a whole head is in: the body has its own deadline
        elif self._current_request is None and not self._deadline.armed:
            # the first bytes of a kept-alive connection's next request
            self._deadline.arm(self._header_timeout_s, self._header_late)

    def _header_late(self) -> None:
        if self._current_request is None and self.transport is not None:
            self._gw.closed("header_timeout")
            self.force_close()

    def _in_head(self) -> bool:
        """The bytes coming are a head's: the last head's body (if any) has all come, and no
        refused one is being answered (the rest of its head is not counted twice)."""
        return self._keepalive and not self._force_close and (self._body is None or self._body.is_eof())

    def _refuse_head(self) -> None:
        """A head past its size: 431, counted, and the connection closed."""
        self._gw.malformed(431)
        if self.transport is not None:
            self.transport.write(reply_bytes(Reply.of_error(head_too_large()), {}, close=True))
        self.force_close()

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """aiohttp's own answer to a request it could not parse or handle, in OpenAI's shape,
        saying nothing of what was sent (aiohttp's text echoes the offending input); a line too
        long or too many headers is a 431, as the lean server answers them."""
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, LineTooLong) or (isinstance(exc, BadHttpMessage) and "Too many headers" in str(exc)):
            err = head_too_large()
        else:
            err = APIError("The request is not valid HTTP/1.1 (conflicting framing, a bad chunk or a malformed "
                           "line).", status=status, type="invalid_request_error", code="malformed_request")
        if self.transport is not None:  # (else refused already, by `_refuse_head`, and counted)
            self._gw.malformed(err.status)
        resp = web.Response(status=err.status, body=error_body(err), content_type="application/json")
        resp.force_close()
        return resp


class Connection(Protocol):
    """A client connection as the cap sees it: aiohttp's handler or a lean one."""

    reserve_only: bool

    @property
    def idle(self) -> bool: ...

    def force_close(self) -> None: ...


class GatewayServer(web.Server):
    """aiohttp's server making the gateway's connections, counting them against the live cap.

    With a `proxy`, each connection starts lean (`gateway.http.lean`): the hot routes are
    served by the proxy straight from llhttp, and a connection that asks for anything else is
    handed to a `GatewayProtocol`; without one, every connection is aiohttp's."""

    def __init__(self, *args: Any, live: Live, metrics: GatewayMetrics, clock: Now, proxy: Answerer | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._live = live
        self._metrics = metrics
        self._clock = clock
        self.proxy: Answerer | None = proxy
        self._said_at = -_SAY_EVERY_S
        # Open connections, oldest first; aiohttp's own table keeps closed ones until their
        # handler's task has ended, which would make the count and the search for an idle one slow.
        self._open: dict[Connection, None] = {}

    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]
        if self.proxy is not None:
            return LeanProtocol(self, self._loop)
        return self._aiohttp_protocol()

    def _aiohttp_protocol(self) -> GatewayProtocol:
        limits = self._live.cfg.limits
        return GatewayProtocol(self, loop=self._loop, keepalive_timeout=limits.keepalive_timeout_s,
                               header_timeout_s=limits.header_timeout_s, **self._kwargs)

    # -- what a lean connection asks of its server (`gateway.http.lean.Host`) --------------------

    @property
    def max_body_bytes(self) -> int:
        return self._live.cfg.max_body_bytes

    @property
    def config_hash(self) -> str:
        return self._live.hash

    def timeouts(self) -> tuple[float, float]:
        limits = self._live.cfg.limits
        return limits.header_timeout_s, limits.keepalive_timeout_s

    def hand_off(self, transport: asyncio.Transport, data: bytes, reserve_only: bool) -> None:
        """aiohttp's handler takes a lean connection over, starting with the bytes it has had."""
        handler = self._aiohttp_protocol()
        handler.reserve_only = reserve_only
        self._open[handler] = None  # counted already: `connection_made` does not admit it again
        transport.set_protocol(handler)
        handler.connection_made(transport)
        handler.data_received(data)

    def forget(self, conn: Connection) -> None:
        self._open.pop(conn, None)

    # -- the cap ----------------------------------------------------------------------------------

    def admit(self, conn: Connection) -> bool | None:
        """Count a new connection against the cap: True in, None in for `/health` and `/metrics`
        only, False refused (the caller closes it)."""
        limits = self._live.cfg.limits
        reserve = False
        if len(self._open) >= limits.max_connections and not self._evict_idle():
            if len(self._open) >= limits.max_connections + limits.reserved_connections:
                self.closed("over_cap")
                return False
            reserve = True
        self._open[conn] = None
        return None if reserve else True

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        assert isinstance(handler, GatewayProtocol)
        if handler in self._open:
            return  # a lean connection handed over
        admitted = self.admit(handler)
        if admitted is False:
            transport.abort()
        elif admitted is None:
            handler.reserve_only = True

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self._open.pop(handler, None)  # type: ignore[call-overload]
        super().connection_lost(handler, exc)

    def _evict_idle(self) -> bool:
        """Close the oldest idle connection to make room (nginx reuses idle keep-alive ones
        when it runs out); False when every connection is busy."""
        for h in self._open:
            if h.idle and not h.reserve_only:
                del self._open[h]
                self.closed("evicted_idle")
                h.force_close()
                return True
        return False

    def closed(self, reason: str) -> None:
        """A connection the gateway closed on its own (counted; the cap's refusals also logged,
        once a minute)."""
        self._metrics.connections_closed.labels(reason).inc()
        if reason != "header_timeout" and reason != "evicted_idle":
            now = self._clock()
            if now - self._said_at >= _SAY_EVERY_S:
                self._said_at = now
                log.warning("client connections at the cap (limits.max_connections %d + reserved %d): new ones are "
                            "refused (tailguard_connections_closed_total{reason=\"%s\"} counts them)",
                            self._live.cfg.limits.max_connections, self._live.cfg.limits.reserved_connections,
                            reason)

    def malformed(self, status: int) -> None:
        """A request the parser refused: it never had a class, so it is counted by its status."""
        self._metrics.unclassified.labels(str(status)).inc()

    # -- stopping -------------------------------------------------------------------------------

    def _lean(self) -> list[LeanProtocol]:
        return [c for c in self._open if isinstance(c, LeanProtocol)]

    def pre_shutdown(self) -> None:
        super().pre_shutdown()
        for conn in self._lean():
            if conn.idle:
                conn.force_close()

    async def shutdown(self, timeout: float | None = None) -> None:
        """As aiohttp's: requests being answered get `timeout` to end, then are cancelled."""
        busy = [t for c in self._lean() if (t := c.task) is not None]
        if busy:
            _, late = await asyncio.wait(busy, timeout=timeout)
            for t in late:
                t.cancel()
        for conn in self._lean():
            conn.force_close()
        await super().shutdown(timeout)

class GatewayRunner(web.AppRunner):
    """An `AppRunner` whose server is a `GatewayServer`; with `proxy` (called once the app has
    started, which makes it), its hot routes are served lean."""

    def __init__(self, app: web.Application, live: Live, metrics: GatewayMetrics, clock: Now,
                 proxy: Callable[[], Answerer] | None = None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._live, self._metrics, self._clock, self._proxy = live, metrics, clock, proxy

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()  # the app started, its handler's arguments gathered
        return GatewayServer(plain.request_handler, request_factory=plain.request_factory,
                             handler_cancellation=plain.handler_cancellation, loop=plain._loop,
                             live=self._live, metrics=self._metrics, clock=self._clock,
                             proxy=None if self._proxy is None else self._proxy(), **plain._kwargs)


@web.middleware
async def reserved_only(request: web.Request, handler: Any) -> web.StreamResponse:
    """A connection opened above the cap serves `/health` and `/metrics` only."""
    protocol = request.protocol
    if isinstance(protocol, GatewayProtocol) and protocol.reserve_only and request.path not in RESERVED_PATHS:
        raise APIError("The gateway has too many open connections; try again shortly.", status=503,
                       type="server_error", code="too_many_connections", retry_after_s=1.0,
                       headers={"Connection": "close"})
    resp: web.StreamResponse = await handler(request)
    return resp


def raise_file_limit(cfg: GatewayConfig) -> None:
    """Raise the open-file limit to what the gateway may use (its connection cap and reserve,
    its backends' connections, its files), as far as the hard limit allows; say so when that is
    short of it, since at the file limit `accept` fails and nothing else can answer."""
    need = _files_needed(cfg.limits, sum(b.max_concurrency for b in cfg.backends))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < need:
            log.warning("open-file limit %d is below the %d the gateway may use (limits.max_connections %d): "
                        "raise the hard limit (ulimit -Hn, LimitNOFILE=) or lower max_connections",
                        target, need, cfg.limits.max_connections)


def _files_needed(limits: LimitsConfig, backend_slots: int) -> int:
    return limits.max_connections + limits.reserved_connections + backend_slots + _FILES_BESIDES_CLIENTS
