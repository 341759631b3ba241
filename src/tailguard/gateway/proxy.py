"""One request's way through the gateway: authenticate, read the body (bounded in size and time),
classify, cap, wait for a slot, relay (retrying once on another backend if nothing reached the
client), and end exactly once.

Every exit of `Proxy.handle` goes through one `finally` that releases the slot, counts the one
outcome and writes the access-log line, so no path can end a request twice or not at all.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Any

from aiohttp import web
from aiohttp.hdrs import CONTENT_ENCODING, CONTENT_TYPE

from tailguard.errors import APIError, BadRequest, Overloaded, PayloadTooLarge
from tailguard.gateway.caps import Capped, OutputEstimator, apply_caps
from tailguard.gateway.classes import ClassTable
from tailguard.gateway.config import BackendConfig, ClassConfig, GatewayConfig
from tailguard.gateway.dispatch import Dispatcher, Ticket
from tailguard.gateway.metrics import GatewayMetrics, RequestTimes, access_log, record_finish, response_headers
from tailguard.gateway.assemble import Assembler
from tailguard.gateway.stream import StreamRelay
from tailguard.gateway.tally import Tally
from tailguard.gateway.upstream import ClientGone, RelayError, Suspended, Upstream, UpstreamStatus, upstream_body
from tailguard.gateway.watchdog import Watchdog
from tailguard.gateway.resume import Progress, continuation_body, resumable
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


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization")
    if auth is None:
        return None
    scheme, _, token = auth.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class _Exit:
    """How the request ended: filled in along the way, read once in `handle`'s finally."""

    __slots__ = ("outcome", "status", "reason", "completion")

    def __init__(self) -> None:
        self.outcome = Outcome.CLIENT_GONE  # if nothing else is recorded, the task was cancelled
        self.status = 499
        self.reason: str | None = None
        self.completion: str | None = None


class Proxy:
    """The request handler shared by `/v1/chat/completions` and `/v1/completions`."""

    def __init__(
        self, cfg: GatewayConfig, classes: ClassTable, backends: dict[str, BackendConfig], dispatcher: Dispatcher,
        upstream: Upstream, metrics: GatewayMetrics, estimator: OutputEstimator,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._cfg = cfg
        self._classes = classes
        self._dispatcher = dispatcher
        self._upstream = upstream
        self._metrics = metrics
        self._estimator = estimator
        self._loop = loop
        self._backends = backends  # by name, each with its kind resolved (app.py updates it on detection)
        self._ids = itertools.count()
        self._id_prefix = f"tg-{os.getpid():x}-{os.urandom(3).hex()}-"
        self._timeouts = cfg.timeouts

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        # Timings use perf_counter (sub-ms); the policies get loop time, as every driver of them does.
        t = RequestTimes(arrived_at=time.perf_counter(), cls=NO_CLASS)
        req_id = f"{self._id_prefix}{next(self._ids):x}"
        ex = _Exit()
        ticket: Ticket | None = None
        parsed: ParsedRequest | None = None
        try:
            api_key = _bearer(request)
            self._classes.authenticate(api_key)  # before the body: a stranger's body is never read
            raw = await self._read_body(request)
            parsed = parse_request(raw, endpoint)
            cls = self._classes.classify(request.headers, parsed.body, api_key)
            t.cls = cls.name
            t.prompt_tokens = parsed.prompt_tokens
            capped = apply_caps(parsed, cls, self._estimator.estimate(cls.name))
            progress = None
            if self._dispatcher.may_suspend(cls.name) and resumable(capped.body, endpoint):
                progress = Progress()
            ticket = await self._dispatcher.admit(req_id, cls.name, capped.est_tokens, progress=progress,
                                                  max_tokens=capped.max_tokens)
            t.bound_at = time.perf_counter()
            self._metrics.cls(cls.name).queue_wait.observe(t.bound_at - t.arrived_at)
            return await self._relay(request, endpoint, raw, parsed, capped, cls, ticket, t, req_id, ex)
        except APIError as err:
            if isinstance(err, Overloaded):
                ex.outcome, ex.reason = Outcome.REJECTED, err.code
            else:
                ex.outcome, ex.reason = Outcome.CLIENT_ERROR, err.code
            ex.status = err.status
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
            now = time.perf_counter()
            if t.finished_at is None:
                t.finished_at = now
            if ticket is not None:
                self._dispatcher.release(ticket, ex.outcome)
            record_finish(self._metrics, t, ex.outcome)
            if self._cfg.access_log:
                prompt = parsed.prompt_text() if (self._cfg.log_prompts and parsed is not None) else None
                access_log(t, req_id=req_id, method=request.method, path=request.path, status=ex.status,
                           outcome=ex.outcome, reason=ex.reason, prompt=prompt,
                           completion=ex.completion if self._cfg.log_prompts else None)

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

    async def _relay(
        self, request: web.Request, endpoint: Endpoint, raw: bytes, parsed: ParsedRequest, capped: Capped,
        cls: ClassConfig, ticket: Ticket, t: RequestTimes, req_id: str, ex: _Exit,
    ) -> web.StreamResponse:
        loop = self._loop
        to = self._timeouts
        clock = time.perf_counter
        assert t.bound_at is not None
        wd = Watchdog(loop, total_at=t.bound_at + to.total_s, idle_s=to.idle_s)
        tally = Tally(t, wd, self._metrics.cls(cls.name).itl)  # kept across attempts and runs
        stream: StreamRelay | None = None
        asm: Assembler | None = None  # kept across the runs of a preemptible request
        sent: web.StreamResponse | None = None  # a non-stream response already being written
        progress = ticket.progress
        resumed: dict[str, Any] | None = None  # the continuation body after a suspension
        retried = False  # the last attempt failed: this one goes on a new connection
        tier = self._classes.served_tier(parsed.body.get("service_tier"), cls)
        try:
            while True:
                backend = self._backends[ticket.backend]
                t.backend = backend.name
                t.attempts += 1
                body = upstream_body(
                    raw, capped.body if resumed is None else resumed, client_stream=parsed.stream,
                    client_usage=parsed.include_usage, body_changed=capped.body_changed or resumed is not None,
                    backend=backend, rank=cls.rank, count_tokens=progress is not None,
                )
                wd.start_attempt(clock() + to.first_token_s)
                up = None
                try:
                    up = await self._upstream.open(backend, endpoint, body, req_id, fresh=retried)
                    t.upstream_headers_at = clock()
                    if progress is not None:
                        self._dispatcher.upstream_open(ticket, up.close)
                    if parsed.stream:
                        if stream is None:
                            stream = StreamRelay(request, endpoint, tally, parsed.include_usage,
                                                 lambda: response_headers(t), progress=progress,
                                                 service_tier=tier.encode() if tier is not None else None)
                        await stream.run(up)
                        self._finish_tokens(t, tally.usage.prompt_tokens, tally.usage.completion_tokens)
                        up.release()
                        if stream.upstream_error:
                            self._metrics.upstream_errors.labels(backend.name, "stream_error").inc()
                            ex.outcome, ex.status, ex.reason = Outcome.UPSTREAM_ERROR, 200, "stream_error"
                        else:
                            self._ok(cls.name, t, ex, 200)
                        t.finished_at = clock()
                        return stream.response  # type: ignore[return-value]
                    if asm is None:
                        asm = Assembler(endpoint, tally, progress=progress, service_tier=tier)
                    payload = await asm.run(up)
                    up.release()
                    self._finish_tokens(t, tally.usage.prompt_tokens, tally.usage.completion_tokens)
                    if self._cfg.log_prompts:
                        ex.completion = asm.text()
                    sent = web.Response(body=payload, content_type="application/json", headers=response_headers(t))
                    try:
                        await sent.prepare(request)
                        await sent.write_eof()
                    except ConnectionError:
                        raise ClientGone() from None
                    self._ok(cls.name, t, ex, 200)
                    t.finished_at = clock()
                    return sent
                except Suspended:
                    assert progress is not None
                    ticket = await self._suspended(ticket, progress, t, wd)
                    resumed = continuation_body(capped.body, endpoint, progress)
                    retried = False
                    continue
                except RelayError as err:
                    self._metrics.upstream_errors.labels(backend.name, err.kind).inc()
                    if err.retryable and self._dispatcher.failed(ticket, err.kind):
                        retried = True
                        continue  # nothing reached the client: the front sends it again
                    raise
                except UpstreamStatus as us:
                    # The backend understood and refused (e.g. context too long): the client's error.
                    self._dispatcher.probe(backend.name, True)  # it answered: it is alive
                    ex.outcome, ex.status, ex.reason = Outcome.CLIENT_ERROR, us.status, "upstream_4xx"
                    return web.Response(status=us.status, body=us.body, headers={
                        "Content-Type": us.content_type, **response_headers(t)})
                except asyncio.CancelledError:
                    kind = wd.take_expiry()
                    if kind is None:
                        raise
                    self._metrics.upstream_errors.labels(backend.name, kind).inc()
                    if up is None and kind == "timeout_first_token" and self._dispatcher.failed(
                            ticket, "timeout_headers"):
                        retried = True
                        continue  # it never answered at all (a hung server): another may
                    timeout = RelayError(kind, _TIMEOUT_TEXT[kind].format(backend=backend.name), status=504)
                    if stream is not None and stream.response is not None:
                        ex.outcome, ex.status, ex.reason = Outcome.TIMEOUT, 200, kind
                        try:
                            await stream.fail(timeout)
                        except ClientGone:
                            ex.outcome = Outcome.CLIENT_GONE
                        t.finished_at = clock()
                        return stream.response
                    raise timeout from None
                finally:
                    ticket.on_suspend = None  # closed below: a suspension has nothing to stop
                    if up is not None:
                        up.close()  # no-op after release(); otherwise aborts the engine's request
        except Overloaded as err:
            # Suspended, then expired in the queue (or the gateway shut down): a stream the client
            # already reads ends with an error event; otherwise the 503 goes out as usual.
            if stream is not None and stream.response is not None:
                ex.outcome, ex.status, ex.reason = Outcome.REJECTED, 200, err.code
                try:
                    await stream.fail(RelayError(err.code or "queue_timeout", err.message, status=503))
                except ClientGone:
                    ex.outcome = Outcome.CLIENT_GONE
                return stream.response
            raise
        except RelayError as err:
            if stream is not None and stream.response is not None:
                # Broken after the client got bytes: end the stream with an error event.
                ex.outcome, ex.status, ex.reason = Outcome.UPSTREAM_ERROR, 200, err.kind
                try:
                    await stream.fail(err)
                except ClientGone:
                    ex.outcome = Outcome.CLIENT_GONE
                return stream.response
            ex.outcome = Outcome.TIMEOUT if err.is_timeout else Outcome.UPSTREAM_ERROR
            ex.status, ex.reason = err.status, err.kind
            return error_response(err.api_error(), response_headers(t))
        except ClientGone:
            ex.outcome, ex.status, ex.reason = Outcome.CLIENT_GONE, 499, "client_gone"
            if stream is not None and stream.response is not None:
                return stream.response
            return sent if sent is not None else web.Response(status=499)
        finally:
            wd.stop()
            if t.output_tokens == 0 and t.content_chunks:
                self._meter_unfinished(t, tally, progress)

    async def _suspended(self, ticket: Ticket, progress: Progress, t: RequestTimes, wd: Watchdog) -> Ticket:
        """The dispatcher preempted this request: wait, with no deadline running and the
        client's response open, until it has a slot again; then the caller sends the
        continuation. Raises `Overloaded` when it expires in the queue."""
        t.preemptions += 1
        wd.stop()
        suspended_at = time.perf_counter()
        await self._dispatcher.resume(ticket)
        progress.suspended = False
        wd.total_at += time.perf_counter() - suspended_at
        t.attempts -= 1  # a resumed run is not a retry
        return ticket

    def _finish_tokens(self, t: RequestTimes, prompt: int | None, completion: int | None) -> None:
        if prompt is not None:
            t.prompt_tokens = prompt
        t.output_tokens = completion if completion is not None else t.content_chunks

    def _meter_unfinished(self, t: RequestTimes, tally: Tally, progress: Progress | None) -> None:
        """What a request that did not finish generated is charged all the same (client gone,
        timeout, upstream error, expired while suspended): the tokens a preemptible request
        tracked over its runs, else the engine's count when it sent one, else its content chunks,
        marked as an estimate in the access log."""
        if progress is not None and progress.tokens:
            t.output_tokens = progress.tokens  # counted over every run, as the engine reported them
        elif tally.usage.completion_tokens is not None:
            t.output_tokens = tally.usage.completion_tokens
        else:
            t.output_tokens = t.content_chunks
            t.extra["output_tokens_estimated"] = True

    def _ok(self, cls: str, t: RequestTimes, ex: _Exit, status: int) -> None:
        ex.outcome, ex.status = Outcome.SUCCESS, status
        self._estimator.observe(cls, t.output_tokens)


_TIMEOUT_TEXT = {
    "timeout_first_token": "Backend '{backend}' produced no token within the first-token deadline.",
    "timeout_idle": "Backend '{backend}' stalled longer than the idle deadline between chunks.",
    "timeout_total": "The request to backend '{backend}' exceeded the total deadline.",
}

