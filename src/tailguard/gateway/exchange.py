"""One request's upstream life, apart from HTTP: open it on the backend the front named, relay its
chunks (or assemble a non-stream answer), retry an attempt that failed before any byte went out,
wait while suspended and send the continuation, continue it on another backend when its own
died or stalled mid-answer (a migration: the same continuation), and end with one `Ending`.

It talks to the front through the request's `Line` (`gateway.line`), in event values and the
decisions that come back, the shape of httpx's auth flow: a failed attempt is told as `Failed`
and goes again as the `Start` that answers it says (`retry`: the same body on a new connection;
`migrate`, `continue`: the continuation of the text so far), waits for it after a `Wait` or a
`Suspend`, or ends after a `GiveUp`; it works none of that out itself.

Its output goes to a `Sink` (`gateway.sink`): the HTTP handler passes the client's response, and
code inside the process can pass a `ChunkQueue` and read the chunks itself. Every way it ends is
one `return Ending(...)` (or one of the three handlers in `run`), so a request's outcome is
decided in one place, not by whichever assignment ran last.

    ending = await Exchange(job, line, sink, context).run()
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from tailguard.clock import Now
from tailguard.errors import APIError, Overloaded
from tailguard.front.intake import Accepted, OutputEstimator
from tailguard.front.params import ClassSpec
from tailguard.config import BackendConfig
from tailguard.front.events import Decision, Failed, FirstContent, GiveUp, GiveUpReason, Opened, Start, Wait
from tailguard.front.front import Front
from tailguard.gateway.hedge import Race
from tailguard.gateway.line import Line
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.headers import response_headers
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.gateway.sink import ClientGone, Sink
from tailguard.gateway.stored import ResponseHomes
from tailguard.gateway.upstream.assemble import Assembler
from tailguard.gateway.upstream.bound import AnswerBound
from tailguard.gateway.upstream.client import RelayError, Suspended, Upstream, UpstreamStatus, upstream_body
from tailguard.gateway.upstream.h1 import H1Response
from tailguard.gateway.upstream.kinds import get_kind
from tailguard.gateway.upstream.refusals import added_fields, refused_field
from tailguard.gateway.upstream.resume import continuation_body
from tailguard.gateway.upstream.stream import StreamRelay
from tailguard.gateway.upstream.tally import Tally
from tailguard.gateway.upstream.watchdog import DeadlineWatch
from tailguard.types import FailureKind, Outcome
from tailguard.gateway.upstream.whole import read_whole
from tailguard.wire.framing import FRAMINGS
from tailguard.wire.openai import CHUNKED, POOLING, Endpoint, ParsedRequest

if TYPE_CHECKING:
    from tailguard.guards.output import OutputScreen

log = logging.getLogger("tailguard.gateway")

_TIMEOUT_TEXT = {
    FailureKind.TIMEOUT_HEADER: "Backend '{backend}' sent no response head within its deadline.",
    FailureKind.TIMEOUT_FIRST_TOKEN: "Backend '{backend}' produced no token within the first-token deadline.",
    FailureKind.TIMEOUT_IDLE: "Backend '{backend}' stalled longer than the idle deadline between chunks.",
    FailureKind.TIMEOUT_TOTAL: "The request to backend '{backend}' exceeded the total deadline.",
}
# Why a stream that broke after the client got bytes was not continued elsewhere.
_NOT_CONTINUED = (" The answer cannot be continued on another backend: a request with tools, response_format, "
                  "n > 1 or logprobs cannot be continued from its text.")


def _next_step(decisions: list[Decision]) -> Start | Wait | GiveUp | None:
    """What the front decided of a failed attempt: it goes again (`Start`), waits for a backend
    (`Wait`) or ends (`GiveUp`); None while its hedge's other attempt goes on (a `Drop`)."""
    return next((d for d in decisions if isinstance(d, (Start, Wait, GiveUp))), None)


def _refused_continuation(backend: str, us: UpstreamStatus) -> RelayError:
    """A backend refused a continuation (e.g. prompt + text so far past its context) while the
    client's stream is open: the stream ends with the refusal as its error event, not with a
    second answer after the first (LiteLLM let a refused continuation's 400 replace the real
    failure: BerriAI/litellm#27967)."""
    said = us.body[:500].decode("utf-8", "replace")
    try:  # an OpenAI error body: its message alone
        said = str(orjson.loads(us.body)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    return RelayError(FailureKind.STATUS, f"Backend '{backend}' refused to continue the answer ({us.status}): {said}")


# What a hedged request's race may hold of an attempt before its first content (a preamble of
# comments or role chunks), as the relay's own preamble bound.
_RACE_LIMIT = 1 << 20


@dataclass(frozen=True, slots=True)
class Ending:
    """How an exchange ended. With nothing sent yet, `error` (or the backend's own refusal,
    `passthrough`) is what the consumer answers; once bytes went out, the sink has its end."""

    outcome: Outcome
    status: int
    reason: str | None = None
    error: APIError | None = None
    passthrough: UpstreamStatus | None = None
    completion: str | None = None  # the assembled text, for the access log when asked


@dataclass(frozen=True, slots=True)
class Job:
    """The request as the gateway sends it: parsed, classified and capped."""

    req_id: str
    endpoint: Endpoint
    raw: bytes
    parsed: ParsedRequest
    capped: Accepted
    cls: ClassSpec
    tier: str | None = None  # the service tier to report, when the request named one
    headers: tuple[tuple[str, str], ...] = ()  # client headers the route passes on (`anthropic-version`)
    screen: OutputScreen | None = None  # its output guards (`tailguard.guards.output`), when any apply


@dataclass(frozen=True, slots=True)
class Context:
    """What every exchange of one gateway shares."""

    front: Front  # its views only (is a class hedged; does a backend learn from TTFTs)
    clock: Now  # the gateway's one clock
    upstream: Upstream
    backends: dict[str, BackendConfig]  # by name, kinds resolved (app.py updates it on detection)
    metrics: GatewayMetrics
    live: Live  # deadlines are read from it as each request starts (a reload changes them)
    estimator: OutputEstimator
    loop: asyncio.AbstractEventLoop
    keep_text: bool = False  # keep the assembled text (log_prompts)
    homes: ResponseHomes = field(default_factory=ResponseHomes)  # where each stored Response is


class Exchange:
    """Runs one admitted request to its `Ending` (see the module docstring)."""

    def __init__(self, job: Job, line: Line, sink: Sink, ctx: Context) -> None:
        self.job, self.line, self.sink, self.ctx = job, line, sink, ctx
        self.req = req = line.request
        assert req.bound_at is not None
        self._to = to = ctx.live.cfg.timeouts  # kept for every attempt: a reload meanwhile changes nothing here
        self._limits = ctx.live.cfg.limits
        self._wd = line.watchdog = DeadlineWatch(ctx.loop, ctx.clock, total_at=req.bound_at + to.total_s,
                                                 idle_s=to.idle_s)
        bound = AnswerBound.of(job.capped.max_tokens, job.parsed.n, len(job.raw), self._limits)
        # Across attempts and runs.
        self._tally = Tally(req, self._wd, ctx.metrics.cls(job.cls.name).itl, ctx.clock, line.trace is not None, bound)
        if line.transcript is not None:  # its text so far counts no more than the request allows
            line.transcript.most_tokens = bound.charged
        self._stream: StreamRelay | None = None
        self._asm: Assembler | None = None  # kept across the runs of a preemptible request
        self._resumed: dict[str, Any] | None = None  # the continuation body after a suspension
        self._endpoint: Endpoint = job.endpoint  # where attempts go (a continuation by ids: completions)
        self._retried = False  # the last attempt failed: this one goes on a new connection
        self._dropped_here: set[str] = set()  # added fields this request went again without
        self._gave_up: GiveUp | None = None  # why the front tried its last failed attempt no more
        # Relayed as one body: a route that answers once, or a non-stream call of a typed-event route.
        self._whole = job.endpoint in POOLING or (job.endpoint not in CHUNKED and not job.parsed.stream)

    async def run(self) -> Ending:
        try:
            return await self._attempts()
        except Overloaded as err:
            # Suspended, then expired in the queue (or the gateway shut down).
            return await self._broken(Outcome.REJECTED, err.code, err)
        except RelayError as err:
            outcome = Outcome.TIMEOUT if err.is_timeout else Outcome.UPSTREAM_ERROR
            if self.sink.started and self._gave_up is not None and self._gave_up.reason is GiveUpReason.NOT_CONTINUABLE:
                err.message += _NOT_CONTINUED  # say why this one was not, where others would be
            return await self._broken(outcome, err.kind, err.api_error())
        except ClientGone:
            return Ending(Outcome.CLIENT_GONE, 499, "client_gone")
        finally:
            self._wd.stop()
            req = self.req
            if req.output_tokens == 0 and req.content_chunks:
                self._meter_unfinished()
            req.finish(self.ctx.clock())

    async def _broken(self, outcome: Outcome, reason: str | None, error: APIError) -> Ending:
        """The request failed: a stream the consumer already reads ends with an error event;
        otherwise the consumer answers with the error."""
        if not self.sink.started:
            return Ending(outcome, error.status, reason, error=error)
        assert self._stream is not None
        try:
            await self._stream.fail(error)
        except ClientGone:
            return Ending(Outcome.CLIENT_GONE, 200, reason)
        return Ending(outcome, 200, reason)

    async def _attempts(self) -> Ending:
        job, req, line, ctx = self.job, self.req, self.line, self.ctx
        while True:
            backend = ctx.backends[req.backend]
            body = self._body(backend)
            now = ctx.clock()
            head_late = get_kind(backend.kind).head_with_first_token
            if self._whole:  # the head comes with the whole answer: only its own deadline applies
                self._wd.start_attempt(now + self._to.first_token_s if job.endpoint in POOLING else self._wd.total_at)
            else:
                self._wd.start_attempt(now + self._to.first_token_s, None if head_late else now + self._to.header_s)
            up = None
            try:
                up = await ctx.upstream.open(backend, self._endpoint, body, job.req_id, self._to.connect_s,
                                             self._limits, fresh=self._retried,
                                             traceparent=None if line.trace is None else line.trace.traceparent(),
                                             headers=job.headers)
                self._wd.answered()
                req.upstream_headers_at = ctx.clock()
                if self._hedged():
                    up, backend = await self._race(up, backend)
                elif self._tally.on_first is None and req.first_content_at is None \
                        and ctx.front.wants_first_content(job.cls.name, backend.name):
                    self._tally.on_first = self._first_content
                if line.transcript is not None and not line.transcript.lazy:
                    line.attempting(up.close)  # a suspension from now stops it at once
                    line.tell(Opened(req.id))
                if self._whole:
                    return await self._answer_whole(up)
                return await (self._relay(up, backend) if job.parsed.stream else self._assemble(up))
            except Suspended:
                await self._suspended()
            except RelayError as err:
                ctx.metrics.upstream_errors.labels(backend.name, err.kind).inc()
                if err.kind == FailureKind.PROTOCOL:
                    ctx.upstream.said_once(backend.name, err)
                if not await self._again(err.kind, answered=up is not None):
                    raise
            except UpstreamStatus as us:
                if self._refused_field(backend, us):
                    continue  # once more, without the field the engine does not take
                if self.sink.started:
                    raise _refused_continuation(backend.name, us) from None
                # The backend understood and refused (e.g. context too long): the client's error,
                # which also tells the front the backend is alive.
                return Ending(Outcome.CLIENT_ERROR, us.status, "upstream_4xx", passthrough=us)
            except asyncio.CancelledError:
                if not await self._deadline(backend, answered=up is not None):
                    raise  # not ours: the consumer left
            finally:
                line.attempting(None)  # closed below: a suspension has nothing to stop
                if up is not None:
                    up.close()  # no-op after release(); otherwise aborts the engine's request

    def _first_content(self, now: float) -> None:
        """The request's first content came (a TTFT sample of its adaptive backend)."""
        self._tally.on_first = None
        self.line.tell(FirstContent(self.req.id, self.req.backend))

    def _hedged(self) -> bool:
        """A first attempt of a hedged class: it races for its first content (`gateway.hedge`)."""
        return (self._resumed is None and not self._retried and not self.sink.started
                and self.ctx.front.hedges(self.job.cls.name))

    async def _race(self, up: H1Response, backend: BackendConfig) -> tuple[H1Response, BackendConfig]:
        ctx, job = self.ctx, self.job

        async def open_hedge(other: BackendConfig) -> H1Response:
            async with asyncio.timeout(self._to.connect_s + self._to.header_s):
                return await ctx.upstream.open(other, self._endpoint, self._body(other), job.req_id, self._to.connect_s,
                                             self._limits)

        return await Race(self.line, ctx.backends, open_hedge, _RACE_LIMIT).run(up, backend)

    def _body(self, backend: BackendConfig) -> bytes:
        job = self.job
        resumed = self._resumed
        transcript = self.line.transcript
        if transcript is not None:  # whether this run's token ids are kept, and hidden
            transcript.run_on(get_kind(backend.kind).continues_by_ids, job.capped.body.get("return_token_ids") is True)
        return upstream_body(
            job.raw, job.capped.body if resumed is None else resumed, client_stream=job.parsed.stream,
            client_usage=job.parsed.include_usage, body_changed=job.capped.body_changed or resumed is not None,
            backend=backend, rank=job.cls.rank, count_tokens=transcript is not None, endpoint=job.endpoint,
            dropped=self.ctx.upstream.refusals.dropped(backend.name), own_priority=job.capped.own_priority,
        )

    def _refused_field(self, backend: BackendConfig, us: UpstreamStatus) -> bool:
        """True when `us` refuses a field the gateway added itself (vLLM's `priority` without
        priority scheduling): the field is dropped for that backend from now on (logged once) and
        this request goes again without it, at most once per field."""
        added = added_fields(get_kind(backend.kind), count_tokens=self.line.transcript is not None)
        field = refused_field(us.status, us.body, (f for f in added if f not in self._dropped_here))
        if field is None:
            return False
        self._dropped_here.add(field)
        if self.ctx.upstream.refusals.learn(backend.name, field):
            log.warning("backend %s refuses the field %r the gateway adds (%s); it is no longer sent there "
                        "(shown in /health as dropped_fields)", backend.name, field,
                        us.body[:200].decode("utf-8", "replace"))
        return True

    async def _deadline(self, backend: BackendConfig, answered: bool) -> bool:
        """A cancellation arrived. False when it is not a deadline of ours (the consumer left);
        True when the front sends the request again (a server that never even answered); else
        the deadline raises `RelayError`."""
        kind = self._wd.take_expiry()
        if kind is None:
            return False
        self.ctx.metrics.upstream_errors.labels(backend.name, kind).inc()
        if await self._again(kind, answered):
            return True
        raise RelayError(kind, _TIMEOUT_TEXT[kind].format(backend=backend.name), status=504)

    async def _again(self, kind: FailureKind, answered: bool) -> bool:
        """Tell the front the attempt failed; True when it goes again as its `Start` says: the
        same body on a new connection (a retry), or the continuation from the text the consumer
        already has (a migration). With no backend free for it now, it first waits for one
        (`Wait`), as a suspension does. False: the front gave it up (`GiveUp`, kept to word the
        error), or its hedge's other attempt goes on."""
        line, req = self.line, self.req
        line.attempting(None)
        if line.trace is not None:
            line.trace.failed(kind, self.ctx.clock())
        decision = _next_step(line.tell(Failed(req.id, kind, self._delivered(), answered)))
        if decision is None or isinstance(decision, GiveUp):
            self._gave_up = decision
            return False
        start = await self._waiting() if isinstance(decision, Wait) else decision
        if start.mode.continues:
            self._continue()
        else:
            self._retried = True
        return True

    async def _waiting(self) -> Start:
        """Wait, holding no slot and with no deadline running, until the front gives it a
        backend again (`Overloaded` past its wait bound): its `Start`. A stream's client keeps
        its response meanwhile."""
        clock = self.ctx.clock
        self._wd.stop()
        waited_at = clock()
        start = await self.line.next()
        self._wd.total_at += clock() - waited_at
        return start

    def _continue(self) -> None:
        """The next attempt continues the generation from its text so far (after a suspension or
        a migration), on a connection from the pool."""
        transcript = self.line.transcript
        assert transcript is not None  # the front continues only requests whose text is kept (`tracks`)
        by_ids = get_kind(self.ctx.backends[self.req.backend].kind).continues_by_ids
        self._resumed, self._endpoint = continuation_body(self.job.capped.body, self.job.endpoint, transcript, by_ids)
        self._retried = False

    def _delivered(self) -> bool:
        """Some of the answer was taken: sent to the consumer, or joined into a non-stream body
        (a retry would then splice two answers)."""
        return self.sink.started or self.req.first_content_at is not None

    async def _relay(self, up: H1Response, backend: BackendConfig) -> Ending:
        job, req = self.job, self.req
        if self._stream is None:
            tier = job.tier.encode() if job.tier is not None else None
            self._stream = StreamRelay(self.sink, job.endpoint, self._tally, job.parsed.include_usage,
                                       lambda: response_headers(req), self._limits, transcript=self.line.transcript,
                                       service_tier=tier, framing=FRAMINGS[job.endpoint], screen=job.screen)
        await self._stream.run(up)
        self._finish_tokens()
        up.release()
        if self._stream.upstream_error:
            self.ctx.metrics.upstream_errors.labels(backend.name, FailureKind.STREAM_ERROR).inc()
            return Ending(Outcome.UPSTREAM_ERROR, 200, FailureKind.STREAM_ERROR)
        return self._ok()

    async def _assemble(self, up: H1Response) -> Ending:
        if self._asm is None:
            self._asm = Assembler(self.job.endpoint, self._tally, self._limits, transcript=self.line.transcript,
                                  service_tier=self.job.tier, screen=self.job.screen)
        payload = await self._asm.run(up)
        up.release()
        self._finish_tokens()
        await self.sink.answer(payload, response_headers(self.req))
        return self._ok(self._asm.text() if self.ctx.keep_text else None)

    async def _answer_whole(self, up: H1Response) -> Ending:
        payload = await read_whole(up, self.job.endpoint, self._tally)
        up.release()
        self._finish_tokens()
        await self.sink.answer(payload, response_headers(self.req))
        return self._ok()

    async def _suspended(self) -> None:
        """The front preempted this request: wait, with no deadline running and the consumer's
        response open, until it has a slot again; the loop then sends the continuation. Raises
        `Overloaded` when it expires in the queue."""
        transcript = self.line.transcript
        assert transcript is not None
        await self._waiting()  # its Start continues it
        transcript.suspended = False
        self._continue()

    def _finish_tokens(self) -> None:
        req, usage = self.req, self._tally.usage
        if usage.prompt_tokens is not None:
            req.prompt_tokens = usage.prompt_tokens
        req.output_tokens = usage.completion_tokens if usage.completion_tokens is not None else req.content_chunks

    def _meter_unfinished(self) -> None:
        """What a request that did not finish generated is charged all the same (client gone,
        timeout, upstream error, expired while suspended): the tokens a preemptible request
        tracked over its runs, else the engine's count when it sent one, else its content chunks,
        marked as an estimate in the access log."""
        req, transcript = self.req, self.line.transcript
        if transcript is not None:
            transcript.decode(self.job.endpoint == "chat")  # a lazy stream's count is in its raw chunks
        if transcript is not None and transcript.tokens:
            req.output_tokens = transcript.tokens  # counted over every run, as the engine reported them
        elif self._tally.usage.completion_tokens is not None:
            req.output_tokens = self._tally.usage.completion_tokens
        else:
            req.output_tokens = req.content_chunks
            req.output_estimated = True

    def _ok(self, completion: str | None = None) -> Ending:
        self.ctx.estimator.observe(self.job.cls.name, self.req.output_tokens)
        made = self._tally.usage.answer_id
        if made is not None and self.req.backend is not None:
            self.ctx.homes.remember(made, self.req.backend)  # its follow-ups go where its state is
        screen = self.job.screen  # `content_filter` when its output guards withheld the answer
        return Ending(Outcome.SUCCESS, 200, None if screen is None else screen.reason, completion=completion)
