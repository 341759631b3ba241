"""The asyncio driver of the front (`tailguard.front.front.Front`): every event the gateway sees goes
into the front here, told the gateway's clock, and every decision that comes out is carried out
here, each by its method in `CARRIED` (a request's start delivered to its line, a suspension that
stops its attempt, a refusal worded and raised, a gauge moved, a log line).

There is no dispatcher task: each event calls the front synchronously and applies what it
decides, so an idle gateway binds a request in the same loop iteration it arrives. One timer,
armed at the front's `next_wakeup`, delivers `Tick` for queue deadlines. A request's exchange
talks to the front through its `Line` (`gateway.line`), in event values and decisions; the fleet's
side (probes, leases, the shared fair-share counters) through `tell`. What the front weighs in a
preemption (each running preemptible request's tokens so far) it is told as `Generated` just
before any event after which a preemption may follow (requests wait, or the event may queue one):
the front never asks its driver, and nothing is sent per chunk. What the decisions say of a request is written into its record as they are carried out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tailguard.clock import Now
from tailguard.front.events import (
    Arrive, Close, Decision, Drop, Ejected, Event, Failed, Finished, Generated, GiveUp, HealthChanged, Readmitted,
    Reconfigure, Reject, Retired, SharedVerdict, Start, StartMode, Suspend, Tick, Wait,
)
from tailguard.front.front import Front
from tailguard.front.limits import Standing
from tailguard.front.params import FrontParams
from tailguard.front.samples import sample
from tailguard.front.tracked import State
from tailguard.gateway.line import Line
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.gateway.ops.recorder import Recorder
from tailguard.gateway.rejection import rejection
from tailguard.gateway.request import Ended, Request
from tailguard.gateway.upstream.resume import Transcript
from tailguard.wire.openai import ratelimit_headers

log = logging.getLogger("tailguard.gateway")

# How the dispatcher carries out each decision: every one of them (the contract test holds every
# driver to its table), by the method named.
CARRIED: dict[type, str] = {
    Start: "_start", Suspend: "_suspend", Wait: "_wait", GiveUp: "_give_up", Drop: "_drop", Reject: "_reject",
    HealthChanged: "_health", Ejected: "_health", Readmitted: "_health", Retired: "_retired",
}
NOT_APPLICABLE: dict[type, str] = {}
# The events that may queue a request (an arrival; a failure whose retry waits), and so lead to a
# preemption even while none waited before them.
_MAY_QUEUE = frozenset({Arrive, Failed})


def _adaptive(params: FrontParams) -> frozenset[str]:
    return frozenset(b.name for b in params.backends if b.adaptive is not None)


class Dispatcher:
    """Carries events into the front and its decisions out.

        line = dispatcher.line(req)
        await dispatcher.admit(line, est_tokens)   # raises the front's refusal; cancel = client left
        ...its exchange, through `line`...
        dispatcher.ended(ended)                    # one `Finished`, from the request's one end
    """

    def __init__(self, params: FrontParams, metrics: GatewayMetrics, loop: asyncio.AbstractEventLoop, clock: Now,
                 recorder: Recorder | None = None) -> None:
        self.front = Front(params)
        # `tailguard serve --record`: every event, its `now` and its decisions (None: not recording).
        self.recorder = recorder
        # Each backend's health as the front's `HealthChanged` decisions said: what probes follow.
        self.healthy: dict[str, bool] = {b.name: b.healthy for b in self.front.backends()}
        self._metrics = metrics
        self._loop = loop
        self._clock = clock
        self._adaptive = _adaptive(params)  # backends whose cap learns from their requests' latency
        self._lines: dict[str, Line] = {}
        self._weighed: dict[str, Line] = {}  # preemptible ones: their tokens are what a preemption weighs
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._carry: dict[type, Callable[[Any], None]] = {kind: getattr(self, name) for kind, name in CARRIED.items()}

    def __len__(self) -> int:
        """Requests waiting for a slot."""
        return len(self.front)

    def line(self, req: Request) -> Line:
        """A new request's line, not yet in the front (`admit` puts it there)."""
        return Line(req, self.tell, self._loop)

    async def admit(self, line: Line, est_tokens: int, *, max_tokens: int | None = None, prefix: tuple[int, ...] = (),
                    pin: str | None = None, body_bytes: int = 0, shared: SharedVerdict | None = None) -> Start:
        """Queue the request (its class, caller and model are on its record) and wait for its
        first start. Raises the front's refusal as the client's error (`gateway.rejection`).
        With a transcript on its line (its text is kept) it may be continued elsewhere, and
        suspended if the transcript is not lazy; `prefix` is its prompt's block hashes; `pin` the
        backend that holds its state (`Arrive.pin`); `body_bytes` its body's size; `shared` the
        replicas' verdict on its caller (`gateway.shared.limits`)."""
        req, transcript = line.request, line.transcript
        self._lines[req.id] = line
        if transcript is not None and not transcript.lazy:
            self._weighed[req.id] = line
        program = None if req.program is None else req.program.id
        self.tell(Arrive(req.id, req.cls, est_tokens, transcript is not None, max_tokens, req.caller, req.model,
                         prefix, pin, body_bytes, shared, program, req.prompt_tokens,
                         None if req.slo is None else req.slo.ttft_s))
        return await line.next()  # a done future (an idle gateway) returns here without yielding

    def transcript(self, cls: str, resumable: bool) -> Transcript | None:
        """Where the request's text is kept, if it may be continued (`Front.tracks`): parsed
        chunk by chunk if it may be suspended (its relay stops between chunks), else kept raw
        and parsed only if its backend dies mid-answer (`Transcript.lazy`), so the relay's
        zero-parse path serves it; None if it cannot be continued."""
        if not self.front.tracks(cls, resumable):
            return None
        return Transcript(lazy=not self.front.may_suspend(cls))

    def rate_headers(self, caller: str, shared: tuple[Standing | None, Standing | None] | None = None,
                     ) -> dict[str, str] | None:
        """OpenAI's `x-ratelimit-*` headers for where `caller`'s limits stand now, or None: over
        all replicas when `shared` says so (`gateway.shared.limits`), else in this front."""
        headers: dict[str, str] = {}
        for kind, s in zip(("requests", "tokens"), shared or self.front.standing(caller, self._clock())):
            if s is not None:
                headers.update(ratelimit_headers(kind, s.limit, s.remaining, s.reset_s))
        return headers or None

    def ended(self, e: Ended) -> None:
        """The request's one end (`gateway.lifecycle`): the front is told it ended having used
        what it used (and, for an adaptive backend, what it showed of its latency between
        chunks). Once: a request the front refused itself has left already."""
        req = e.request
        line = self._lines.pop(req.id, None)
        if line is None or line.ended:
            return
        self._weighed.pop(req.id, None)
        line.leave()
        if req.backend in self._adaptive:
            seen = sample(req.backend, req.first_content_at, req.last_content_at, req.content_chunks, req.counts)
            if seen is not None:
                self.tell(seen)
        self.tell(Finished(req.id, req.outcome, req.used_tokens()))

    def delivered_since(self, backend: str, since: float) -> bool:
        """Whether `backend` sent bytes to any request in flight since `since`: evidence that
        it is alive, asked when its health probe timed out."""
        for line in self._lines.values():
            wd = line.watchdog
            if wd is not None and line.request.backend == backend and wd.last_at >= since:
                return True
        return False

    def hedges(self, cls: str) -> bool:
        """Whether requests of `cls` may be hedged (their exchange races for the first content)."""
        return self.front.hedges(cls)

    def take_served(self) -> dict[str, float]:
        """This replica's fair-share service since the last call, for the others."""
        return self.front.take_served()

    def running_waiting(self, backend: str) -> tuple[int, int]:
        """Requests running on `backend` and waiting here for any slot: what a lease asks for."""
        try:
            in_flight = self.front.backend(backend).in_flight
        except KeyError:  # not (or no longer) one of the front's: a reload is under way
            in_flight = 0
        return in_flight, len(self.front)

    def reconfigure(self, params: FrontParams) -> None:
        """A live reload: the front takes the new parameters (raising `ConfigError`, nothing
        changed, when they need a restart) and whoever they let in starts now."""
        self.tell(Reconfigure(params))
        self._adaptive = _adaptive(params)
        for b in self.front.backends():
            self.healthy.setdefault(b.name, b.healthy)

    def close(self) -> None:
        """Refuse new requests and answer every queued one with 503."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        self.tell(Close())

    def export_gauges(self) -> None:
        """Queue lengths and in-flight counts, read from the front when /metrics is scraped
        (cheaper than moving gauges on every request)."""
        m, front = self._metrics, self.front
        for spec in front.params.classes:
            m.queue_length.labels(spec.name).set(front.queue_len(spec.name))
        for b in front.backends():
            m.inflight_of(b.name).set(b.in_flight)
            m.concurrency_limit.labels(b.name).set(b.cap)

    # --- the one way in -------------------------------------------------------------------------

    def tell(self, event: Event) -> Sequence[Decision]:
        """The one way an event reaches the front: told now (after the tokens a preemption would
        weigh, when one may follow: requests wait, or this event may queue one), its decisions
        recorded and carried out."""
        now = self._clock()
        if self._weighed and (len(self.front) or type(event) in _MAY_QUEUE):
            self._weigh(now)
        return self._handle(event, now)

    def _handle(self, event: Event, now: float) -> Sequence[Decision]:
        decisions = self.front.handle(event, now)
        if self.recorder is not None:
            self.recorder.event(event, now, True, decisions)
        carry = self._carry
        for d in decisions:
            carry[type(d)](d)
        self._arm()
        return decisions

    def _weigh(self, now: float) -> None:
        """Each running preemptible request's tokens so far, where they changed since the front
        was last told them: what it weighs when it picks a request to suspend."""
        front = self.front
        for rid, line in self._weighed.items():
            t = line.transcript
            assert t is not None
            if t.tokens != line.told_tokens and not t.suspended and rid in front and front.state(rid) is State.RUNNING:
                line.told_tokens = t.tokens
                self._handle(Generated(rid, t.tokens), now)

    # --- decisions ------------------------------------------------------------------------------

    def _start(self, d: Start) -> None:
        """A start of any mode, counted on the record (`front.counts`) and in the metrics by the
        failure it follows; a hedge's backend goes to the racing exchange, any other start to
        whoever waits for the request's next one."""
        line = self._lines[d.id]
        req = line.request
        req.counts.apply(d)
        mode = d.mode
        if mode is StartMode.HEDGE:
            self._metrics.hedges.labels(req.cls, "sent").inc()
            line.hedge(d.backend)
            return
        if mode is StartMode.RETRY:
            self._metrics.retries.labels(d.failed_on, d.after).inc()
        elif mode is StartMode.MIGRATE:
            self._metrics.migrations.labels(req.cls, d.after).inc()
        now = self._clock()
        req.started(d.backend, now)
        if line.trace is not None:
            line.trace.started(d.backend, mode.continues, now)
        line.deliver(d)

    def _suspend(self, d: Suspend) -> None:
        line = self._lines[d.id]
        assert line.transcript is not None
        line.request.counts.apply(d)
        self._metrics.preemptions.labels(line.request.cls).inc()
        line.expect()
        line.transcript.suspended = True
        line.stop()
        if line.trace is not None:
            line.trace.suspended(self._clock())

    def _wait(self, d: Wait) -> None:
        self._lines[d.id].expect()

    def _give_up(self, d: GiveUp) -> None:
        """Its exchange ends the request (the decision came back to it); counted here."""
        self._lines[d.id].request.counts.apply(d)
        if d.reason.denied:
            self._metrics.retries_denied.labels(d.backend, d.kind).inc()

    def _drop(self, d: Drop) -> None:
        """A hedge is over: the winner's attempt is the request's from now on (its racing
        exchange stops the loser's)."""
        line = self._lines[d.id]
        req = line.request
        req.counts.apply(d)
        outcome = "failed" if d.failed else "won" if d.winner == line.hedged else "lost"
        self._metrics.hedges.labels(req.cls, outcome).inc()
        req.backend, line.hedged = d.winner, None

    def _reject(self, d: Reject) -> None:
        """The front refused or dropped the request: whoever waits for it gets the one wording
        of the refusal (`gateway.rejection`), and it has left the front."""
        line = self._lines.pop(d.id)
        self._weighed.pop(d.id, None)
        req = line.request
        self._metrics.rejected.labels(req.cls, d.reason).inc()
        served: Iterable[str] = (m for b in self.front.backends() if not b.retiring for m in (b.models or ()))
        line.refuse(rejection(d, caller=req.caller, model=req.model, waited_s=self._clock() - req.arrived_at,
                              served=served))
        line.leave()

    def _health(self, d: HealthChanged | Ejected | Readmitted) -> None:
        """A change of a backend's health: said once in the log with its reason, counted, and
        its gauge moved (it takes requests while healthy and not ejected)."""
        m, name = self._metrics, d.backend
        if isinstance(d, HealthChanged):
            self.healthy[name] = d.healthy
            to = "healthy" if d.healthy else "unhealthy"
            log.warning("backend %s is %s", name, "healthy again: a probe succeeded" if d.healthy
                        else "unhealthy: its health probes failed (see the probe's error above)")
        elif isinstance(d, Ejected):
            to = "ejected"
            m.ejections.labels(name, d.kind).inc()
            log.warning("backend %s ejected for %g s: %d failed requests in a row (the last: %s); ejection "
                        "number %d", name, d.for_s, d.failures, d.kind, d.times)
        else:
            to = "readmitted"
            log.warning("backend %s takes requests again: its ejection is over", name)
        m.health_changes.labels(name, to).inc()
        view = self.front.backend(name) if name in self.healthy else None
        m.backend_healthy.labels(name).set(1 if view is not None and view.healthy and not view.ejected else 0)

    def _retired(self, d: Retired) -> None:
        self.healthy.pop(d.backend, None)
        self._metrics.forget_backend(d.backend)
        log.warning("backend %s removed: its last request has ended", d.backend)

    # --- the timer ------------------------------------------------------------------------------

    def _arm(self) -> None:
        at = self.front.next_wakeup()
        if at is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = self._timer_at = None
            return
        if self._timer is not None and self._timer_at is not None and self._timer_at <= at:
            return  # fires no later than needed; it re-arms itself
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_later(max(0.0, at - self._clock()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        self.tell(Tick())
