"""The HTTP side of one request: authenticate, read the body (bounded in size and time),
classify, cap, wait for a slot, hand it to its `Exchange` with the client's response as the
sink, answer with how it ended, and end it exactly once.

Every exit of `Proxy.handle` goes through one `finally` that releases the slot, counts the one
outcome and writes the access-log line, so no path can end a request twice or not at all.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Mapping

from aiohttp import web
from aiohttp.hdrs import CONTENT_ENCODING, CONTENT_TYPE

from tailguard.errors import APIError, BadRequest, Overloaded, PayloadTooLarge
from tailguard.gateway.caps import apply_caps
from tailguard.gateway.classes import ClassTable
from tailguard.gateway.config import GatewayConfig
from tailguard.gateway.exchange import Context, Ending, Exchange, Job
from tailguard.gateway.metrics import RequestTimes, access_log, record_finish, response_headers
from tailguard.gateway.resume import Progress, resumable
from tailguard.gateway.sink import ResponseSink, Sink
from tailguard.gateway.upstream import UPSTREAM_PATHS
from tailguard.types import Outcome
from tailguard.wire.openai import (
    Endpoint, ParsedRequest, error_body, error_headers, is_json_media_type, parse_request,
)

NO_CLASS = "none"  # metrics label of a request rejected before it had a class

log = logging.getLogger("tailguard.gateway")


def error_response(err: APIError, extra: dict[str, str] | None = None) -> web.Response:
    headers = error_headers(err)
    if extra:
        headers.update(extra)
    return web.Response(status=err.status, body=error_body(err), content_type="application/json", headers=headers)


def bearer(request: web.Request) -> str | None:
    """The key of `Authorization: Bearer <key>`, or None."""
    auth = request.headers.get("Authorization")
    if auth is None:
        return None
    scheme, _, token = auth.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class _Exit:
    """How the request ended: set once along the way, read once when it is counted and logged."""

    __slots__ = ("req_id", "outcome", "status", "reason", "prompt", "completion")

    def __init__(self, req_id: str) -> None:
        self.req_id = req_id
        self.outcome = Outcome.CLIENT_GONE  # if nothing else is recorded, the task was cancelled
        self.status = 499
        self.reason: str | None = None
        self.prompt: str | None = None
        self.completion: str | None = None

    def ended(self, ending: Ending) -> None:
        self.outcome, self.status, self.reason, self.completion = (
            ending.outcome, ending.status, ending.reason, ending.completion)

    def refused(self, err: APIError) -> None:
        self.outcome = Outcome.REJECTED if isinstance(err, Overloaded) else Outcome.CLIENT_ERROR
        self.status, self.reason = err.status, err.code


class Proxy:
    """The request handler shared by `/v1/chat/completions` and `/v1/completions`."""

    def __init__(
        self, cfg: GatewayConfig, classes: ClassTable, ctx: Context,
    ) -> None:
        self._cfg = cfg
        self._classes = classes
        self._ctx = ctx
        self._dispatcher = ctx.dispatcher
        self._metrics = ctx.metrics
        self._estimator = ctx.estimator
        self._ids = itertools.count()
        self._id_prefix = f"tg-{os.getpid():x}-{os.urandom(3).hex()}-"

    @property
    def classes(self) -> ClassTable:
        return self._classes

    def reconfigure(self, cfg: GatewayConfig, classes: ClassTable) -> None:
        """A live reload: requests that arrive from now on are read, classified and capped by
        `cfg`; those in flight keep the class and caps they were given."""
        self._cfg, self._classes = cfg, classes

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        t, ex = self._arrived()
        try:
            api_key = bearer(request)
            self._classes.authenticate(api_key)  # before the body: a stranger's body is never read
            raw = await self._read_body(request)
            sink = ResponseSink(request)
            return self._reply(await self._serve(raw, endpoint, request.headers, api_key, sink, t, ex), sink, t)
        except APIError as err:
            ex.refused(err)
            resp = error_response(err, response_headers(t) if t.cls != NO_CLASS else None)
            if not request.content.is_eof():
                # Refused before its body was read (or the body is broken): aiohttp drains what
                # follows for a while, then closes; the client must not reuse the connection.
                resp.force_close()
            return resp
        except Exception:
            log.exception("internal error handling %s %s", request.method, request.path)
            ex.outcome, ex.status, ex.reason = Outcome.UPSTREAM_ERROR, 500, "internal_error"
            return error_response(APIError("Internal gateway error.", status=500, code="internal_error"))
        finally:
            self._account(t, ex, request.method, request.path)

    async def run(
        self, body: bytes, endpoint: Endpoint, sink: Sink, headers: Mapping[str, str] | None = None,
    ) -> Ending:
        """A request from inside the process (a batch runner, a hedge): the same way as an HTTP
        one (classified, capped, queued, counted and logged once), its output into `sink`."""
        t, ex = self._arrived()
        try:
            return await self._serve(body, endpoint, headers or {}, None, sink, t, ex)
        except APIError as err:
            ex.refused(err)
            return Ending(ex.outcome, err.status, err.code, error=err)
        finally:
            self._account(t, ex, "POST", UPSTREAM_PATHS[endpoint])

    def _arrived(self) -> tuple[RequestTimes, _Exit]:
        """A request's times and its one exit, which `_account` counts and logs once."""
        # Timings use perf_counter (sub-ms); the front gets loop time, as every driver of it does.
        return RequestTimes(arrived_at=time.perf_counter(), cls=NO_CLASS), _Exit(f"{self._id_prefix}{next(self._ids):x}")

    def _account(self, t: RequestTimes, ex: _Exit, method: str, path: str) -> None:
        """The request left (the `finally` of every way in): counted and logged once. A plain
        call rather than a context manager, whose generator machinery costs more per request."""
        if t.finished_at is None:
            t.finished_at = time.perf_counter()
        record_finish(self._metrics, t, ex.outcome)
        if self._dispatcher.recorder is not None:  # `--record`: its sizes and instants, for a what-if
            self._dispatcher.recorder.request(ex.req_id, t, ex.outcome)
        if self._cfg.access_log:
            logged = self._cfg.log_prompts
            access_log(t, req_id=ex.req_id, method=method, path=path, status=ex.status, outcome=ex.outcome,
                       reason=ex.reason, prompt=ex.prompt if logged else None,
                       completion=ex.completion if logged else None)

    async def _serve(
        self, raw: bytes, endpoint: Endpoint, headers: Mapping[str, str], api_key: str | None, sink: Sink,
        t: RequestTimes, ex: _Exit,
    ) -> Ending:
        """Parse, classify, cap, wait for a slot, run the exchange; the slot is released once."""
        parsed = parse_request(raw, endpoint)
        if self._cfg.log_prompts:
            ex.prompt = parsed.prompt_text()
        cls = self._classes.classify(headers, parsed.body, api_key)
        t.cls, t.caller = cls.name, self._classes.caller(api_key)
        t.prompt_tokens = parsed.prompt_tokens
        capped = apply_caps(parsed, cls, self._estimator.estimate(cls.name))
        progress = Progress() if self._dispatcher.may_suspend(cls.name) and resumable(capped.body, endpoint) else None
        try:
            ticket = await self._dispatcher.admit(ex.req_id, cls.name, capped.est_tokens, progress=progress,
                                                  max_tokens=capped.max_tokens, caller=t.caller)
        finally:  # let in or refused, the answer says where the caller's limits stand
            if t.caller is not None:
                t.rate_headers = self._dispatcher.rate_headers(t.caller)
        try:
            t.bound_at = time.perf_counter()
            self._metrics.cls(cls.name).queue_wait.observe(t.bound_at - t.arrived_at)
            tier = self._classes.served_tier(parsed.body.get("service_tier"), cls)
            job = Job(ex.req_id, endpoint, raw, parsed, capped, cls, tier)
            ending = await Exchange(job, ticket, t, sink, self._ctx).run()
            ex.ended(ending)
            return ending
        finally:
            self._dispatcher.release(ticket, ex.outcome, t.used_tokens())

    async def _read_body(self, request: web.Request) -> bytes:
        """The whole body, within `max_body_bytes` and `body_timeout_s`. A body too large is
        refused at its Content-Length, before it is read; a slow one cannot hold a handler open
        for ever. The queue is not involved yet: nothing is admitted before its body is in."""
        length = request.content_length
        if length is not None and length > self._cfg.max_body_bytes:
            raise self._too_large()
        if CONTENT_TYPE in request.headers and not is_json_media_type(request.content_type):
            raise BadRequest(
                f"Content-Type must be application/json, got {request.content_type!r}.", status=415,
                param="Content-Type", code="unsupported_media_type",
            )
        try:
            if length is not None and request.content.total_bytes == length and CONTENT_ENCODING not in request.headers:
                return await request.read()  # all here already (the usual case): no timer to arm
            async with asyncio.timeout(self._cfg.body_timeout_s):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise self._too_large() from None
        except TimeoutError:
            raise BadRequest(
                f"The request body did not arrive within {self._cfg.body_timeout_s:g} s.", status=408,
                code="body_timeout",
            ) from None
        except web.RequestPayloadError:
            raise BadRequest("The request body could not be decoded: its Content-Encoding or chunked framing "
                             "is broken.", code="invalid_body") from None

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"Request body is larger than the limit of {self._cfg.max_body_bytes} bytes.",
                               code="body_too_large")

    def _reply(self, ending: Ending, sink: ResponseSink, t: RequestTimes) -> web.StreamResponse:
        """The HTTP answer for how the exchange ended: what it sent, or the error to send."""
        if ending.passthrough is not None:
            us = ending.passthrough
            return web.Response(status=us.status, body=us.body, headers={
                "Content-Type": us.content_type, **response_headers(t)})
        if ending.error is not None:
            return error_response(ending.error, response_headers(t))
        return sink.response if sink.response is not None else web.Response(status=499)

