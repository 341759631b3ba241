"""The HTTP side of one generation request, from either server (aiohttp's or the lean one): who
sent it (its key, before its body is read), its body (bounded in size and time), then its life
in the gateway (`gateway.lifecycle`, HTTP-free), and the answer its client gets when nothing was
streamed (a backend's own refusal passed through, or an error in the route's shape); a stream an
error inside the gateway cut short ends with the route's error event.

Every exit of `Proxy.answer` goes through one `finally`: the lifecycle's one end, so no path can
end a request twice or not at all.
"""

from __future__ import annotations

import contextlib
import logging

from aiohttp import web

from tailguard.config import GatewayConfig
from tailguard.errors import APIError
from tailguard.front.intake import NO_CLASS
from tailguard.gateway.exchange import Ending
from tailguard.gateway.http.inbound import AiohttpInbound, Inbound, Reply
from tailguard.gateway.http.routes import anthropic_refusal, error_shape
from tailguard.gateway.lifecycle import Lifecycle
from tailguard.gateway.ops.headers import response_headers
from tailguard.gateway.request import Request
from tailguard.gateway.sink import ClientGone, Sink
from tailguard.types import Outcome
from tailguard.wire.framing import FRAMINGS, OPENAI
from tailguard.wire.headers import told
from tailguard.wire.openai import Endpoint, error_body, error_headers

log = logging.getLogger("tailguard.gateway")


def error_response(err: APIError, extra: dict[str, str] | None = None) -> web.Response:
    headers = error_headers(err)
    if extra:
        headers.update(extra)
    return web.Response(status=err.status, body=error_body(err), content_type="application/json", headers=headers)


class Proxy:
    """The handler of every generation route: the client's side of each request."""

    def __init__(self, cfg: GatewayConfig, lifecycle: Lifecycle) -> None:
        self._cfg = cfg
        self.lifecycle = lifecycle

    def reconfigure(self, cfg: GatewayConfig) -> None:
        """A live reload: the body bounds of requests that arrive from now on."""
        self._cfg = cfg

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        """A request aiohttp's server received."""
        inbound = AiohttpInbound(request)
        return inbound.response(await self.answer(inbound, endpoint))

    async def answer(self, inbound: Inbound, endpoint: Endpoint) -> Reply | None:
        """Serve a request from either server: None when its answer went through its sink."""
        said = told(inbound.headers, endpoint)
        line = self.lifecycle.arrived(endpoint, said.request_id, inbound.remote, said.user_agent, said.api_key)
        req = line.request
        inbound.named(req.request_id)
        sink = inbound.sink()
        try:
            self.lifecycle.classes.authenticate(said.api_key)  # before the body: a stranger's body is never read
            raw = await inbound.read_body(self._cfg.max_body_bytes, self._cfg.body_timeout_s)
            ending = await self.lifecycle.serve(line, raw, said, sink)
            return _reply(ending, req)
        except APIError as err:
            req.refused(err)
            return Reply.of_error(err, response_headers(req) if req.cls != NO_CLASS else None,
                                  close=inbound.body_unread(), body=error_shape(endpoint))
        except Exception:
            log.exception("internal error handling %s %s", inbound.method, inbound.path)
            req.end(Outcome.UPSTREAM_ERROR, 500, "internal_error")
            internal = APIError("Internal gateway error.", status=500, code="internal_error")
            if sink.started:  # its answer had begun: the stream ends with the route's error event
                await _fail(sink, endpoint, internal)
                return None
            return Reply.of_error(internal, body=error_shape(endpoint))
        finally:
            self.lifecycle.end(line, inbound.method, inbound.path)


async def _fail(sink: Sink, endpoint: Endpoint, err: APIError) -> None:
    """End an answer an error inside the gateway left open after its first bytes with the route's
    error event, as a backend failing mid-stream ends it (`StreamRelay.fail`): without it the
    client would see a stream that ends cleanly, short and without its last event."""
    if sink.ended:
        return
    with contextlib.suppress(ClientGone):
        await sink.end(FRAMINGS.get(endpoint, OPENAI).error_event(err))


def _reply(ending: Ending, req: Request) -> Reply | None:
    """The answer for how the exchange ended when its sink did not send it: a backend's own
    answer passed through, or the error to send."""
    if ending.passthrough is not None:
        us = ending.passthrough
        body = anthropic_refusal(us.status, us.body) if req.endpoint == "messages" else us.body
        return Reply(us.status, body, {"Content-Type": us.content_type, **response_headers(req)})
    if ending.error is not None:
        return Reply.of_error(ending.error, response_headers(req), body=error_shape(req.endpoint))
    return None
