"""The HTTP side of one request: authenticate, read the body (bounded in size and time),
classify, cap, wait for a slot, hand it to its `Exchange` with the client's response as the
sink, answer with how it ended, and end it exactly once.

Every exit of `Proxy.handle` goes through one `finally` that releases the slot, counts the one
outcome and writes the access-log line, so no path can end a request twice or not at all.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from tailguard.clock import monotonic
from tailguard.errors import APIError
from tailguard.front.intake import NO_CLASS, Asked
from tailguard.config import GatewayConfig
from tailguard.config.base import fingerprint
from tailguard.front.identity import ProgramFinder
from tailguard.gateway.exchange import Context, Ending, Exchange, Job
from tailguard.gateway.http.classes import ClassTable
from tailguard.gateway.http.inbound import AiohttpInbound, Inbound, Reply
from tailguard.gateway.http.routes import anthropic_refusal, error_shape, passed_headers
from tailguard.gateway.ops.metering import Meter
from tailguard.gateway.ops.metrics import access_log, record_finish, response_headers
from tailguard.gateway.ops.tracing import Tracer
from tailguard.gateway.request import Request
from tailguard.gateway.sink import Sink
from tailguard.gateway.upstream.client import UPSTREAM_PATHS
from tailguard.types import Outcome, RejectReason
from tailguard.wire.openai import (
    CHUNKED, Endpoint, error_body, error_headers, parse_request,
)
from tailguard.wire.headers import agent_session, bearer_key, class_header, session_header
from tailguard.wire.prefix import prefix_blocks

if TYPE_CHECKING:
    from tailguard.gateway.shared.limits import SharedLimits

log = logging.getLogger("tailguard.gateway")

_MAX_REQUEST_ID = 128
_MAX_UA = 256
# What a client's X-Request-Id may carry into logs and upstream headers: the characters of UUIDs,
# OpenAI's `req_...` ids and the usual tracing ids; anything else is dropped.
_NOT_ID = re.compile(r"[^A-Za-z0-9._:+=/@-]")


def client_request_id(headers: Mapping[str, str]) -> str | None:
    """The client's `X-Request-Id`, bounded and sanitized; None when absent or nothing is left."""
    raw = headers.get("X-Request-Id")
    if not raw:
        return None
    return _NOT_ID.sub("", raw[: _MAX_REQUEST_ID * 2])[:_MAX_REQUEST_ID] or None


def program_digest(name: str) -> str:
    """A program's id: its name keyed by this install's fingerprint key, so an id in the access log
    cannot be turned back into a user's or a session's id by hashing guesses (`config.base.fingerprint`)."""
    return fingerprint("program\n" + name).removeprefix("key:")


def error_response(err: APIError, extra: dict[str, str] | None = None) -> web.Response:
    headers = error_headers(err)
    if extra:
        headers.update(extra)
    return web.Response(status=err.status, body=error_body(err), content_type="application/json", headers=headers)


class Proxy:
    """The request handler shared by `/v1/chat/completions` and `/v1/completions`."""

    def __init__(
        self, cfg: GatewayConfig, classes: ClassTable, ctx: Context, tracer: Tracer | None = None,
    ) -> None:
        self._cfg = cfg
        self._tracer = tracer  # None: telemetry off, and no request carries a trace
        self._affine = _affine(cfg)
        self._programs = ProgramFinder(cfg.programs.params(), program_digest)  # who is whose program (docs/agents.md)
        self._classes = classes
        self._ctx = ctx
        self._dispatcher = ctx.dispatcher
        self._metrics = ctx.metrics
        self._estimator = ctx.estimator
        self._ids = itertools.count()
        self._id_prefix = f"tg-{os.getpid():x}-{os.urandom(3).hex()}-"
        self.meter: Meter | None = None  # usage per caller, set by the app (`gateway.ops.metering`)
        self.shared: SharedLimits | None = None  # limits shared by replicas (`gateway.shared`), set by the app

    @property
    def classes(self) -> ClassTable:
        return self._classes

    def reconfigure(self, cfg: GatewayConfig, classes: ClassTable) -> None:
        """A live reload: requests that arrive from now on are read, classified and capped by
        `cfg`; those in flight keep the class and caps they were given."""
        self._cfg, self._classes = cfg, classes
        self._affine = _affine(cfg)
        self._programs.reconfigure(cfg.programs.params())
        if self.shared is not None:
            self.shared.reconfigure(cfg.auth.callers())

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        """A request aiohttp's server received."""
        inbound = AiohttpInbound(request)
        return inbound.response(await self.answer(inbound, endpoint))

    async def answer(self, inbound: Inbound, endpoint: Endpoint) -> Reply | None:
        """Serve a request from either server: None when its answer went through its sink."""
        t = self._arrived(endpoint, client_request_id(inbound.headers))
        inbound.named(t.request_id)
        t.client, t.user_agent = inbound.remote, inbound.headers.get("User-Agent", "")[:_MAX_UA] or None
        try:
            api_key = bearer_key(inbound.headers)
            if api_key is None and endpoint == "messages":  # Anthropic's SDK sends its key this way
                api_key = inbound.headers.get("x-api-key") or None
            self._classes.authenticate(api_key)  # before the body: a stranger's body is never read
            raw = await inbound.read_body(self._cfg.max_body_bytes, self._cfg.body_timeout_s)
            return self._reply(await self._serve(raw, endpoint, inbound.headers, api_key, inbound.sink(), t), t)
        except APIError as err:
            t.refused(err)
            return Reply.of_error(err, response_headers(t) if t.cls != NO_CLASS else None,
                                  close=inbound.body_unread(), body=error_shape(endpoint))
        except Exception:
            log.exception("internal error handling %s %s", inbound.method, inbound.path)
            t.end(Outcome.UPSTREAM_ERROR, 500, "internal_error")
            return Reply.of_error(APIError("Internal gateway error.", status=500, code="internal_error"),
                                  body=error_shape(endpoint))
        finally:
            self._account(t, inbound.method, inbound.path)

    async def run(
        self, body: bytes, endpoint: Endpoint, sink: Sink, headers: Mapping[str, str] | None = None,
        api_key: str | None = None,
    ) -> Ending:
        """A request from inside the process (a batch runner, a hedge): the same way as an HTTP
        one (classified, capped, queued, counted and logged once), its output into `sink`. With
        `api_key` (the key that made a batch) it is that caller's request: its key's classes and
        models, its rate limits and reservations, its metering."""
        t = self._arrived(endpoint)
        try:
            return await self._serve(body, endpoint, headers or {}, api_key, sink, t)
        except APIError as err:
            t.refused(err)
            return Ending(t.outcome, err.status, err.code, error=err)
        finally:
            self._account(t, "POST", UPSTREAM_PATHS[endpoint])

    def new_id(self) -> str:
        """A gateway-made request id: unique in this process, and across processes in practice."""
        return f"{self._id_prefix}{next(self._ids):x}"

    def _arrived(self, endpoint: Endpoint, request_id: str | None = None) -> Request:
        """A request's record, which `_account` counts and logs once. Its `id` is always the
        gateway's own (the front's key); `request_id` is the client's when it sent one."""
        rid = self.new_id()
        return Request(rid, monotonic(), endpoint, request_id or rid)

    def _account(self, t: Request, method: str, path: str) -> None:
        """The request left (the `finally` of every way in): counted and logged once. A plain
        call rather than a context manager, whose generator machinery costs more per request."""
        t.finish()
        record_finish(self._metrics, t)
        if self.meter is not None and (t.caller is not None or t.cls != NO_CLASS):
            self.meter.record(t)
        if self._dispatcher.recorder is not None:  # `--record`: its sizes and instants, for a what-if
            self._dispatcher.recorder.request(t)
        if self._cfg.access_log:
            access_log(t, method=method, path=path, logged_text=self._cfg.log_prompts)
        if self._tracer is not None:
            backend = self._ctx.backends.get(t.backend)
            self._tracer.end(t, None if backend is None else backend.kind, None if backend is None else backend.model)

    async def _serve(
        self, raw: bytes, endpoint: Endpoint, headers: Mapping[str, str], api_key: str | None, sink: Sink,
        t: Request,
    ) -> Ending:
        """Parse, classify, cap, wait for a slot, run the exchange; the slot is released once."""
        parsed = parse_request(raw, endpoint)
        t.model = parsed.model
        if self._cfg.log_prompts:
            t.prompt_text = parsed.prompt_text()
        intake = self._classes.intake
        asked = Asked.of(parsed, class_header(headers), api_key)
        t.caller = intake.caller(api_key)  # before its class: a class it may not use is its caller's refusal
        cls = intake.classify(asked)
        t.cls = cls.name
        if self._tracer is not None:
            self._tracer.begin(t, headers, parsed)
        t.prompt_tokens = parsed.prompt_tokens
        accepted = intake.accept(asked, cls, self._estimator.estimate(cls.name))
        t.model = accepted.model
        progress = self._dispatcher.progress(cls.name, accepted.resumable)
        # Hashed only where a choice between backends can use it: one backend needs no affinity.
        prefix = prefix_blocks(t.prompt_text or parsed.prompt_text()) if self._affine else ()  # (kept: log_prompts)
        t.program = self._programs.find(parsed, t.caller, session_header(headers), agent_session(headers),
                                        t.arrived_at, prefix or None)
        shared, verdict, held = self.shared, None, None
        try:
            if shared is not None and t.caller is not None:  # one Redis round trip (`gateway.shared.limits`)
                verdict, held = await shared.reserve(t.caller, accepted.est_tokens)
            await self._dispatcher.admit(t, accepted.est_tokens, progress=progress, max_tokens=accepted.max_tokens,
                                         prefix=prefix,
                                         pin=self._ctx.homes.home(parsed.body.get("previous_response_id")),
                                         body_bytes=len(raw), shared=verdict)
        except BaseException:
            if shared is not None and held is not None:  # never got in: the request and its tokens go back
                shared.settle(held, 0, admitted=False)
            raise
        finally:  # let in or refused, the answer says where the caller's limits stand
            if t.caller is not None:
                over_all = None if shared is None else shared.standing(t.caller)  # over all replicas
                t.rate_headers = self._dispatcher.rate_headers(t.caller, over_all)
        try:
            assert t.bound_at is not None
            self._metrics.cls(cls.name).queue_wait.observe(t.bound_at - t.arrived_at)
            tier = self._classes.served_tier(parsed.body.get("service_tier"), cls) if endpoint in CHUNKED else None
            job = Job(t.request_id, endpoint, raw, parsed, accepted, cls, tier, passed_headers(endpoint, headers))
            ending = await Exchange(job, t, sink, self._ctx).run()
            t.end(ending.outcome, ending.status, ending.reason, ending.completion)
            return ending
        finally:
            self._dispatcher.release(t, t.outcome, t.used_tokens())
            if shared is not None and held is not None:
                shared.settle(held, t.used_tokens(), admitted=True)

    def _reply(self, ending: Ending, t: Request) -> Reply | None:
        """The answer for how the exchange ended when its sink did not send it: a backend's own
        answer passed through, or the error to send."""
        if ending.passthrough is not None:
            us = ending.passthrough
            body = anthropic_refusal(us.status, us.body) if t.endpoint == "messages" else us.body
            return Reply(us.status, body, {"Content-Type": us.content_type, **response_headers(t)})
        if ending.error is not None:
            return Reply.of_error(ending.error, response_headers(t), body=error_shape(t.endpoint))
        return None


def _affine(cfg: GatewayConfig) -> bool:
    """Whether requests need their prompt's block hashes: prefix-affine routing over a choice."""
    return cfg.routing.policy == "prefix-affinity" and len(cfg.backends) > 1
