"""One request's life in the gateway, apart from HTTP: made a record as it arrives, read (parsed,
classified, capped by the intake), queued in the front until it has a slot, run upstream by its
`Exchange`, and ended exactly once. Both ways in share it: an HTTP request (`gateway.http.proxy`
reads the client's side, then hands it here) and a request from inside the process (`run`: a
batch line, a test), which is counted, metered and logged the same.

The end is one `Ended` value, made once by `end` and handed to one chain of listeners in order:
the front (`Finished`: the slot freed), the metrics, the access log, the trace, and those the app
adds (the replicas' shared limits, whose hold is settled; the meter; a recording; the audit
trail). No other place ends a request.

Its input checks are here too, after the intake and before the front: the audit trail's
`when_full: refuse` and the content guards' input stage (`tailguard.guards`: a blocked request is
never queued, sent or charged), which also hand the exchange the screen its answer passes.

    line = lifecycle.arrived("chat", told.request_id, client, told.user_agent)
    try:
        ending = await lifecycle.serve(line, raw, told, sink)
    finally:
        lifecycle.end(line, "POST", "/v1/chat/completions")
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from tailguard.clock import Now
from tailguard.config import GatewayConfig
from tailguard.config.base import fingerprint
from tailguard.errors import APIError
from tailguard.front.identity import ProgramFinder
from tailguard.front.intake import Accepted, Asked, Refused
from tailguard.front.params import ClassSpec
from tailguard.gateway.classes import ClassTable, answer
from tailguard.gateway.dispatch import Dispatcher
from tailguard.gateway.exchange import Context, Ending, Exchange, Job
from tailguard.gateway.line import Line
from tailguard.gateway.ops.audit import key_fingerprint
from tailguard.gateway.ops.access import access_log
from tailguard.gateway.ops.tracing import Tracer
from tailguard.gateway.request import Ended, Request
from tailguard.gateway.shared.limits import SharedLimits
from tailguard.gateway.sink import Sink
from tailguard.gateway.upstream.client import UPSTREAM_PATHS
from tailguard.wire.headers import Told, told
from tailguard.wire.openai import CHUNKED, Endpoint, ParsedRequest, parse_request
from tailguard.wire.prefix import prefix_blocks

if TYPE_CHECKING:
    from tailguard.gateway.ops.audit import AuditLog
    from tailguard.guards.guard import GuardSet
    from tailguard.guards.output import OutputScreen

Listener = Callable[[Ended], None]


class Lifecycle:
    """Every request's way from arrival to its one end (see the module docstring)."""

    def __init__(self, cfg: GatewayConfig, classes: ClassTable, ctx: Context, dispatcher: Dispatcher,
                 clock: Now, tracer: Tracer | None = None) -> None:
        self._cfg = cfg
        self._classes = classes
        self._ctx = ctx
        self._dispatcher = dispatcher
        self._clock = clock
        self._tracer = tracer  # None: telemetry off, and no request carries a trace
        self._affine = _affine(cfg)
        self._programs = ProgramFinder(cfg.programs.params(), program_digest)  # who is whose program (docs/agents.md)
        self._ids = itertools.count()
        self._id_prefix = f"tg-{os.getpid():x}-{os.urandom(3).hex()}-"
        self.shared: SharedLimits | None = None  # limits shared by replicas (`gateway.shared`), set by the app
        self.guards: GuardSet | None = None  # content guards (`tailguard.guards`), set by the app and a reload
        self.audit: AuditLog | None = None  # the audit trail (`gateway.ops.audit`), set by the app
        self._log_text = _log_text(cfg)
        # Told each request's one end, in order: the front first (its slot goes to whoever waits),
        # then whatever counts or writes it down; the app adds the meter, the shared limits' hold,
        # a recording (`listen`).
        self.listeners: list[Listener] = [dispatcher.ended, ctx.metrics.ended, self._logged]
        if tracer is not None:
            self.listeners.append(self._traced)

    @property
    def classes(self) -> ClassTable:
        return self._classes

    def reconfigure(self, cfg: GatewayConfig, classes: ClassTable) -> None:
        """A live reload: requests that arrive from now on are read, classified and capped by
        `cfg`; those in flight keep the class and caps they were given."""
        self._cfg, self._classes = cfg, classes
        self._affine = _affine(cfg)
        self._log_text = _log_text(cfg)
        self._programs.reconfigure(cfg.programs.params())
        if self.shared is not None:
            self.shared.reconfigure(cfg.auth.callers())

    def new_id(self) -> str:
        """A gateway-made request id: unique in this process, and across processes in practice."""
        return f"{self._id_prefix}{next(self._ids):x}"

    def arrived(self, endpoint: Endpoint, request_id: str | None = None, client: str | None = None,
                user_agent: str | None = None, api_key: str | None = None) -> Line:
        """A request's record and its line, which `end` ends once. Its `id` is always the
        gateway's own (the front's key); `request_id` is the client's when it sent one. With the
        audit trail on, the record keeps the fingerprint of the key it presented (before the key
        is checked: a refused key is in the trail too), never the key."""
        rid = self.new_id()
        req = Request(rid, self._clock(), endpoint, request_id or rid, client, user_agent)
        if self.audit is not None:
            req.key = key_fingerprint(api_key)
        return self._dispatcher.line(req)

    async def run(self, body: bytes, endpoint: Endpoint, sink: Sink, headers: Mapping[str, str] | None = None,
                  api_key: str | None = None) -> Ending:
        """A request from inside the process (a batch runner, a test): the same way as an HTTP
        one (classified, capped, queued, counted and logged once), its output into `sink`. With
        `api_key` (the key that made a batch) it is that caller's request: its key's classes and
        models, its rate limits and reservations, its metering."""
        line = self.arrived(endpoint, api_key=api_key)
        try:
            return await self.serve(line, body, replace(told(headers or {}, endpoint), api_key=api_key), sink)
        except APIError as err:
            line.request.refused(err)
            return Ending(line.request.outcome, err.status, err.code, error=err)
        finally:
            self.end(line, "POST", UPSTREAM_PATHS[endpoint])

    async def serve(self, line: Line, raw: bytes, said: Told, sink: Sink) -> Ending:
        """Read, classify and cap the request (`said`: what its headers told), wait for its slot,
        run its exchange. Raises the `APIError` its client gets when it is refused before it runs."""
        req, endpoint = line.request, line.request.endpoint
        parsed = parse_request(raw, endpoint)
        req.model = parsed.model
        # Its prompt's text, only where it is kept (`log_prompts`) or hashed for prefix affinity.
        kept = self._cfg.log_prompts or self._cfg.audit.retain_text  # (redacted where it is written)
        text = parsed.prompt_text() if kept or self._affine else None
        if kept:
            req.prompt_text = text
        cls, accepted = self._classified(line, parsed, said)
        accepted, screen = await self._checked(req, accepted, endpoint, cls.name, parsed.stream)
        line.transcript = self._dispatcher.transcript(cls.name, accepted.resumable)
        # Hashed only where a choice between backends can use it: one backend needs no affinity.
        prefix = prefix_blocks(text) if text is not None and self._affine else ()
        req.program = self._programs.find(parsed, req.caller, said.session, said.agent, req.arrived_at, prefix or None,
                                          text)
        shared = self.shared
        try:
            verdict = None if shared is None else await shared.reserve_for(req, accepted.est_tokens)  # one round trip
            await self._dispatcher.admit(line, accepted.est_tokens, max_tokens=accepted.max_tokens, prefix=prefix,
                                         pin=self._ctx.homes.home(parsed.body.get("previous_response_id")),
                                         body_bytes=len(raw), shared=verdict)
        finally:  # let in or refused, the answer says where the caller's limits stand
            if req.caller is not None:
                over_all = None if shared is None else shared.standing(req.caller)  # over all replicas
                req.rate_headers = self._dispatcher.rate_headers(req.caller, over_all)
        assert req.bound_at is not None
        self._ctx.metrics.cls(cls.name).queue_wait.observe(req.bound_at - req.arrived_at)
        tier = self._classes.served_tier(parsed.body.get("service_tier"), cls) if endpoint in CHUNKED else None
        job = Job(req.request_id, endpoint, raw, parsed, accepted, cls, tier, said.passed, screen)
        ending = await Exchange(job, line, sink, self._ctx).run()
        req.end(ending.outcome, ending.status, ending.reason, ending.completion)
        return ending

    def _classified(self, line: Line, parsed: ParsedRequest, said: Told) -> tuple[ClassSpec, Accepted]:
        """Whose request it is, its class and what it may ask for: the intake's, a refusal answered
        as its client gets it (`gateway.classes.answer`)."""
        req, intake = line.request, self._classes.intake
        asked = Asked.of(parsed, said.class_name, said.api_key, said.ttft_slo_ms)
        req.caller = intake.caller(said.api_key)  # before its class: a class it may not use is its caller's refusal
        try:
            cls = intake.classify(asked)
            req.cls = cls.name
            if self._tracer is not None:
                line.trace = self._tracer.begin(req, said.trace or {}, parsed)
            req.prompt_tokens = parsed.prompt_tokens
            accepted = intake.accept(asked, cls, self._ctx.estimator.estimate(cls.name))
        except Refused as refused:
            raise answer(refused) from None
        req.model, req.slo = accepted.model, accepted.slo
        return cls, accepted

    async def _checked(self, req: Request, accepted: Accepted, endpoint: Endpoint, cls: str,
                       stream: bool) -> tuple[Accepted, OutputScreen | None]:
        """The input checks between the intake and the front: the audit trail's room (`when_full:
        refuse`), then the input guards, which may block (400 `content_policy_violation`), fail
        closed (503) or redact (the body sent upstream changes). Returns the request as it goes on
        and the screen its answer passes (None: no output guard applies)."""
        if self.audit is not None:
            self.audit.admit(self._ctx.metrics, cls)
        guards = self.guards
        if guards is None:
            return accepted, None
        req.verdicts = []
        body, screen = await guards.screen(accepted.body, endpoint, cls, accepted.model, stream, req.verdicts)
        if body is not None:
            accepted = replace(accepted, body=body, body_changed=True)
        return accepted, screen

    def end(self, line: Line, method: str, path: str) -> None:
        """The request's one end: its `Ended`, made once, handed to every listener in order."""
        req = line.request
        req.finish(self._clock())
        ended = Ended(req, method, path, line.trace)
        for listener in self.listeners:
            listener(ended)

    def listen(self, *listeners: Listener) -> None:
        """Listeners to every request's end, after the front and the shared limits, in order."""
        self.listeners.extend(listeners)

    def _logged(self, e: Ended) -> None:
        """Its access-log line, as the config in force says."""
        cfg = self._cfg
        if cfg.access_log:
            access_log(e.request, method=e.method, path=e.path, text=self._log_text)

    def _traced(self, e: Ended) -> None:
        """Its trace's last span ends, naming the backend's kind and model."""
        assert self._tracer is not None
        backend = self._ctx.backends.get(e.request.backend)
        self._tracer.end(e, None if backend is None else backend.kind, None if backend is None else backend.model)


def _log_text(cfg: GatewayConfig) -> Callable[[str], str] | None:
    """What the access log writes a request's text through (`log_prompts`): the personal data of
    `redaction:` redacted; None when no text is logged."""
    return cfg.redaction.finder().redact if cfg.log_prompts else None


def program_digest(name: str) -> str:
    """A program's id: its name keyed by this install's fingerprint key, so an id in the access log
    cannot be turned back into a user's or a session's id by hashing guesses (`config.base.fingerprint`)."""
    return fingerprint("program\n" + name).removeprefix("key:")


def _affine(cfg: GatewayConfig) -> bool:
    """Whether requests need their prompt's block hashes: prefix-affine routing over a choice."""
    return cfg.routing.policy == "prefix-affinity" and len(cfg.backends) > 1
