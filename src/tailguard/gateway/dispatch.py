"""The asyncio driver of the front (`tailguard.front.front.Front`): request handlers wait here for
a slot; every event the gateway sees goes into the front, and every decision that comes out is
carried out here (resolve a waiting handler, suspend a running one, refuse one, flip a gauge).

There is no dispatcher task: each event calls the front synchronously and applies what it
decides, so an idle gateway binds a request in the same loop iteration it arrives. One timer,
armed at the front's `next_wakeup`, delivers `Tick` for queue deadlines. The front is told the
gateway's one clock (`tailguard.clock.monotonic`), never reads a clock itself. What the decisions
say of a request (its backend, attempts, preemptions, when it was bound) is written into its
record (`gateway.request.Request`) here, as they are applied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from tailguard.clock import monotonic
from tailguard.front.events import (
    Allotted, Arrive, Close, Decision, Drop, Ejected, Event, Failed, Finished, FirstContent, Generated, GiveUp,
    HealthChanged, KindLearned, Loaded, LocalShare, Opened, Probed, Readmitted, Reconfigure, Reject, Retired, Served,
    ServedElsewhere, SharedVerdict, Start, StartMode, Suspend, Tick, Wait,
)
from tailguard.front.front import Front
from tailguard.front.limits import Standing
from tailguard.front.params import FrontParams
from tailguard.front.samples import sample
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.gateway.ops.recorder import Recorder
from tailguard.gateway.rejection import rejection
from tailguard.gateway.request import Request
from tailguard.gateway.upstream.resume import Transcript
from tailguard.types import FailureKind, Outcome
from tailguard.wire.openai import ratelimit_headers

log = logging.getLogger("tailguard.gateway")

# How the dispatcher carries out each decision: every one of them (the contract test holds every
# driver to its table), by the method named.
CARRIED: dict[type, str] = {
    Start: "_start", Suspend: "_suspend", Wait: "_wait", GiveUp: "_give_up", Drop: "_drop", Reject: "_reject",
    HealthChanged: "_health", Ejected: "_health", Readmitted: "_health", Retired: "_retired",
}
NOT_APPLICABLE: dict[type, str] = {}


def _adaptive(params: FrontParams) -> frozenset[str]:
    return frozenset(b.name for b in params.backends if b.adaptive is not None)


class Dispatcher:
    """Carries events into the front and its decisions out.

        await dispatcher.admit(rec, est_tokens)   # raises Overloaded; cancel = client left
        try:
            ...relay to rec.backend...
        finally:
            dispatcher.release(rec, outcome)
    """

    def __init__(self, params: FrontParams, metrics: GatewayMetrics, loop: asyncio.AbstractEventLoop,
                 recorder: Recorder | None = None) -> None:
        self.front = Front(params)
        # `tailguard serve --record`: every event, its `now` and its decisions (None: not recording).
        self.recorder = recorder
        # Each backend's health as the front's `HealthChanged` decisions said: what probes follow.
        self.healthy: dict[str, bool] = {b.name: b.healthy for b in self.front.backends()}
        self._metrics = metrics
        self._loop = loop
        self._adaptive = _adaptive(params)  # backends whose cap learns from their requests' latency
        self._tickets: dict[str, Request] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._carry: dict[type, Callable[[Any], None]] = {kind: getattr(self, name) for kind, name in CARRIED.items()}

    def __len__(self) -> int:
        """Requests waiting for a slot."""
        return len(self.front)

    async def admit(self, ticket: Request, est_tokens: int, *, progress: Transcript | None = None,
                    max_tokens: int | None = None, prefix: tuple[int, ...] = (), pin: str | None = None,
                    body_bytes: int = 0, shared: SharedVerdict | None = None) -> Start:
        """Queue the request (its class, caller and model are on its record) and wait for its
        slot. Raises `Overloaded` when it is refused or expires (`RateLimited` over its caller's
        limits), `NotFound` when no backend serves its model. With `progress` (its text is
        tracked) it may be suspended while it runs; `prefix` is its prompt's block hashes; `pin` the
        backend that holds its state (`Arrive.pin`)."""
        waiter: asyncio.Future[Start] = self._loop.create_future()
        ticket.waiter = waiter
        ticket.progress = progress
        self._tickets[ticket.id] = ticket
        if progress is not None:
            progress.on_tokens = partial(self.generated, ticket)
        program = ticket.program
        self._handle(Arrive(ticket.id, ticket.cls, est_tokens, progress is not None, max_tokens, ticket.caller,
                            ticket.model, prefix, pin, body_bytes, shared, None if program is None else program.id))
        try:
            # A future that is already done (idle gateway) returns here without yielding.
            return await waiter
        except asyncio.CancelledError:
            self.release(ticket, Outcome.CLIENT_GONE)  # left while queued (or as it was bound)
            raise

    async def resume(self, ticket: Request) -> Start:
        """Wait until the suspended (or waiting) request has a slot again: its `Start`, whose
        mode says what to send (`ticket.backend` is then its new backend). Raises `Overloaded`
        if it expired in the queue or the gateway shuts down."""
        assert ticket.waiter is not None
        return await ticket.waiter

    def progress(self, cls: str, resumable: bool) -> Transcript | None:
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
        for kind, s in zip(("requests", "tokens"), shared or self.front.standing(caller, monotonic())):
            if s is not None:
                headers.update(ratelimit_headers(kind, s.limit, s.remaining, s.reset_s))
        return headers or None

    def upstream_open(self, ticket: Request, on_suspend: Callable[[], None]) -> None:
        """The relay has an upstream open: a preemptible request can be suspended from now on."""
        if ticket.progress is None or ticket.ended:
            return
        ticket.upstream_opened(on_suspend)
        self._handle(Opened(ticket.id))

    def failed(self, ticket: Request, kind: FailureKind, *, delivered: bool,
               answered: bool) -> Start | Wait | GiveUp | None:
        """An attempt failed; the front's decision about it: a `Start` (`ticket.backend` then
        names where; its mode says whether to send the same body again or the continuation), a
        `Wait` (`resume` then returns its `Start` once a backend has room), or a `GiveUp` (the
        caller ends the request). None: its hedge's other attempt goes on."""
        ticket.upstream_closed()
        ticket.attempt_failed(kind)
        decisions = self._handle(Failed(ticket.id, kind, delivered, answered))
        return next((d for d in decisions if isinstance(d, (Start, Wait, GiveUp)) and d.id == ticket.id), None)

    def hedges(self, cls: str) -> bool:
        """Whether requests of `cls` may be hedged (their exchange races for the first content)."""
        return self.front.hedges(cls)

    def first_content(self, ticket: Request, backend: str) -> str | None:
        """The first content came from `backend`. The backend whose attempt must stop now (the
        hedge's other one), or None."""
        decisions = self._handle(FirstContent(ticket.id, backend))
        return next((d.loser for d in decisions if isinstance(d, Drop) and d.id == ticket.id), None)

    def hedge_failed(self, ticket: Request, backend: str, kind: FailureKind, *, answered: bool) -> None:
        """One attempt of a hedged request failed (or was abandoned) while the other goes on."""
        if ticket.hedged is not None and not ticket.ended:
            self._handle(Failed(ticket.id, kind, False, answered, backend))

    def generated(self, ticket: Request, tokens: int) -> None:
        """A running preemptible request's generated tokens so far (what a preemption weighs)."""
        if not ticket.ended and ticket.progress is not None and not ticket.progress.suspended:
            self._handle(Generated(ticket.id, tokens))

    def release(self, ticket: Request, outcome: Outcome, tokens: int = 0) -> None:
        """The request ended having used `tokens` (prompt and generated): tell the front, once."""
        if ticket.ended:
            return
        ticket.ended = True
        ticket.upstream_closed()
        del self._tickets[ticket.id]
        if ticket.waiter is not None and not ticket.waiter.done():
            ticket.waiter.cancel()
        if ticket.backend in self._adaptive:
            self._observe(ticket)
        self._handle(Finished(ticket.id, outcome, tokens))

    def _observe(self, t: Request) -> None:
        """What the ended request showed of its backend's latency between chunks, for its
        adaptive cap (`front.samples`, as the DES works it out); its TTFT went in as it came
        (`first_content`)."""
        seen = sample(t.backend, t.first_content_at, t.last_content_at, t.content_chunks, t.counts)
        if seen is not None:
            self._handle(seen)

    def probe(self, backend: str, ok: bool, *, busy: bool = False) -> None:
        self._handle(Probed(backend, ok, busy))

    def delivered_since(self, backend: str, since: float) -> bool:
        """Whether `backend` sent bytes to any request in flight since `since`: evidence that
        it is alive, asked when its health probe timed out."""
        for t in self._tickets.values():
            wd = t.watchdog
            if wd is not None and t.backend == backend and wd.last_at >= since:
                return True
        return False

    def set_kind(self, backend: str, continues: bool) -> None:
        self._handle(KindLearned(backend, continues))

    def served(self, backend: str, models: tuple[str, ...] | None) -> None:
        """What the backend's /v1/models lists (None: it could not be read)."""
        self._handle(Served(backend, models))

    def loaded(self, backend: str, queued: int) -> None:
        """The engine's own count of requests running and waiting, just read."""
        self._handle(Loaded(backend, queued))

    def local_share(self, replicas: int | None) -> None:
        """Redis is unavailable under `on_unavailable: local` (the front keeps 1/`replicas` of each
        caller's limits), or (None) back (`gateway.shared.limits`)."""
        self._handle(LocalShare(replicas))

    def allot(self, backend: str, slots: int | None) -> None:
        """This replica's part of `backend`'s slots, leased in Redis (`gateway.shared.slots`)."""
        self._handle(Allotted(backend, slots))

    def served_elsewhere(self, service: dict[str, float]) -> None:
        """Other replicas' fair-share service to each caller (`gateway.shared.fair`)."""
        self._handle(ServedElsewhere(service))

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
        self._handle(Reconfigure(params))
        self._adaptive = _adaptive(params)
        for b in self.front.backends():
            self.healthy.setdefault(b.name, b.healthy)

    def close(self) -> None:
        """Refuse new requests and answer every queued one with 503."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        self._handle(Close())

    def export_gauges(self) -> None:
        """Queue lengths and in-flight counts, read from the front when /metrics is scraped
        (cheaper than moving gauges on every request)."""
        m, front = self._metrics, self.front
        for spec in front.params.classes:
            m.queue_length.labels(spec.name).set(front.queue_len(spec.name))
        for b in front.backends():
            m.inflight_of(b.name).set(b.in_flight)
            m.concurrency_limit.labels(b.name).set(b.cap)

    # --- decisions ----------------------------------------------------------------------------

    def _handle(self, event: Event) -> Sequence[Decision]:
        """The one way an event reaches the front: told now, its decisions carried out (and
        recorded first, so an event a decision leads to is written after it)."""
        now = monotonic()
        decisions = self.front.handle(event, now)
        if self.recorder is not None:
            self.recorder.event(event, now, True, decisions)
        self._apply(decisions)
        return decisions

    def _apply(self, decisions: Sequence[Decision]) -> None:
        carry = self._carry
        for d in decisions:
            carry[type(d)](d)
        self._arm()

    def _wait(self, d: Wait) -> None:
        self._tickets[d.id].waiter = self._loop.create_future()  # `resume` waits on it

    def _give_up(self, d: GiveUp) -> None:
        """Its exchange ends the request (`failed` returned the decision); counted here."""
        self._tickets[d.id].counts.apply(d)
        if d.reason.denied:
            self._metrics.retries_denied.labels(d.backend, d.kind).inc()

    def _retired(self, d: Retired) -> None:
        self.healthy.pop(d.backend, None)
        self._metrics.forget_backend(d.backend)
        log.warning("backend %s removed: its last request has ended", d.backend)

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

    def _start(self, d: Start) -> None:
        """A start of any mode, counted on the record (`front.counts`) and in the metrics by the
        failure it follows; a hedge's backend goes to the racing exchange, any other start to the
        request's waiting handler."""
        t = self._tickets[d.id]
        t.counts.apply(d)
        mode = d.mode
        if mode is StartMode.HEDGE:
            t.hedged = d.backend
            self._metrics.hedges.labels(t.cls, "sent").inc()
            w = t.hedge_waiter
            if w is not None and not w.done():
                w.set_result(d.backend)
            return
        if mode is StartMode.RETRY:
            self._metrics.retries.labels(d.failed_on, d.after).inc()
        elif mode is StartMode.MIGRATE:
            self._metrics.migrations.labels(t.cls, d.after).inc()
        t.started(d.backend, mode, monotonic())
        if t.waiter is not None and not t.waiter.done():
            t.waiter.set_result(d)

    def _drop(self, d: Drop) -> None:
        """A hedge is over: the winner's attempt is the request's from now on (the racing exchange
        stops the loser's)."""
        t = self._tickets[d.id]
        t.counts.apply(d)
        outcome = "failed" if d.failed else "won" if d.winner == t.hedged else "lost"
        self._metrics.hedges.labels(t.cls, outcome).inc()
        t.backend, t.hedged = d.winner, None

    def _suspend(self, d: Suspend) -> None:
        t = self._tickets[d.id]
        assert t.on_suspend is not None and t.progress is not None
        t.counts.apply(d)
        self._metrics.preemptions.labels(t.cls).inc()
        t.waiter = self._loop.create_future()
        t.progress.suspended = True
        t.suspended()

    def _reject(self, d: Reject) -> None:
        """The front refused or dropped the request: its handler gets the one wording of the
        refusal (`gateway.rejection`), and it is counted once."""
        t = self._tickets.pop(d.id)
        self._metrics.rejected.labels(t.cls, d.reason).inc()
        t.ended = True
        if t.waiter is not None and not t.waiter.done():
            served = (m for b in self.front.backends() if not b.retiring for m in (b.models or ()))
            t.waiter.set_exception(rejection(d, caller=t.caller, model=t.model, waited_s=monotonic() - t.arrived_at,
                                             served=served))

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
        self._timer = self._loop.call_later(max(0.0, at - monotonic()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        self._handle(Tick())
