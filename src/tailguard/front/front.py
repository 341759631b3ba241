"""The front: every decision about a request, as one state machine with no I/O; told the time.

Events go in through one chokepoint, `handle(event, now)`, which returns the decisions that event
led to (the events and decisions are typed values in `front.events`). The gateway's asyncio driver
(`tailguard.gateway.dispatch`), the discrete-event simulator (`tailguard.sim.des`) and a replay of a
recording (`tailguard.recording.replay`) drive the same object, so whatever the gateway decides can be
replayed on virtual time, and tested without a socket (h11's shape: the protocol is a state
machine its callers drive, and a wrong event is a named error: python-hyper/h11, `h11/_state.py`). The
front never calls back into its driver: what it needs to know arrives as an event.

A request is QUEUED, RUNNING on a backend, SUSPENDED (preempted, or its retry waits for a
backend: queued again, holding no slot, its client still waiting) or FAILED (given up after a
failure: holding its slot until the driver ends it). Which events each state takes is one table,
`TRANSITIONS` (h11's `EVENT_TRIGGERED_TRANSITIONS`), checked before anything changes: a wrong
event is a `WrongEvent`, a decision or anything else handed in a `NotAnEvent`, a `now` earlier
than the last a `ClockWentBack`, each with the front unchanged. A handler that fails past its
checks leaves the front broken (`FrontBroken` on every later call), never half-changed and
going on. A request leaves the front exactly once: by `Finished`, or by a `Reject` the front
itself decided (refused on arrival, expired in the queue, shut down), after which the driver
must not finish it.

    front = Front(params)
    for d in front.handle(Arrive("r1", "interactive", 300), now): ...   # Start("r1", "b1")
    front.handle(Finished("r1", Outcome.SUCCESS, tokens=320), later)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from tailguard.errors import ConfigError
from tailguard.front.ejection import Ejector
from tailguard.front.events import (
    Allotted, Arrive, ClockWentBack, Close, Decision, Drop, Event, Failed, Finished, FirstContent, FrontBroken,
    Generated, HealthChanged, KindLearned, Loaded, LocalShare, NotAnEvent, Observed, Opened, Probed, Readmitted,
    Reconfigure,
    Reject, Served, ServedElsewhere, Start, StartMode, Tick, WrongEvent,
)
from tailguard.front.hedging import Hedger
from tailguard.front.latency import Coefficients, Latency
from tailguard.front.limits import CallerLimits, Standing
from tailguard.front.pacing import Pacer
from tailguard.front.params import ClassSpec, FrontParams
from tailguard.front.preemption import PreemptionPolicy
from tailguard.front.programs import ProgramBook
from tailguard.front.queue import Pending
from tailguard.front.recovery import Recovery
from tailguard.front.retry import retry_budget
from tailguard.front.router import NO_ROUTE, PREFIX_BLOCK_TOKENS, Route, Router
from tailguard.front.schedulers import carry_over, make_scheduler
from tailguard.front.slots import BackendPool
from tailguard.front.tracked import BackendView, State, Tracked
from tailguard.types import Outcome, RejectReason

NOTHING: Sequence[Decision] = ()

# The transition table: the events about one request, by the state it is in (None: not in the
# front), and the handler each pair goes to. Any other pair is a `WrongEvent`, before anything
# changes. A request in any state may end (`Finished`); only a running one has an attempt that
# can open, generate, fail or stream.
TRANSITIONS: dict[tuple[State | None, type], str] = {
    (None, Arrive): "_arrive",
    (State.RUNNING, Opened): "_opened",
    (State.RUNNING, Generated): "_generated",
    (State.RUNNING, Failed): "_failed",
    (State.RUNNING, FirstContent): "_first_content",
    **{(state, Finished): "_finished" for state in State},
}
# The events about the fleet or the front itself, taken in any state. A late probe, sample or
# reading of a backend that has left is not wrong (one can be in flight as it leaves): its
# handler lets it pass.
FRONT_EVENTS: dict[type, str] = {
    Probed: "_probed", Observed: "_observed", KindLearned: "_kind_learned", Served: "_served", Loaded: "_loaded",
    Tick: "_tick", Close: "_close", Reconfigure: "_reconfigure", Allotted: "_allotted",
    ServedElsewhere: "_served_elsewhere", LocalShare: "_local_share",
}
_REQUEST_EVENTS = frozenset(event for _, event in TRANSITIONS)


def _predicts(params: FrontParams) -> bool:
    """Whether the front predicts TTFT (`front.latency`): a class has a TTFT target, or routing
        goes by the prediction. Then drivers tell every first content (`wants_first_content`)."""
    return params.routing.policy == "predicted-ttft" or any(
        c.slo is not None and c.slo.ttft_s is not None for c in params.classes)


def _weights(params: FrontParams) -> dict[str, float]:
    """Each caller's fair-share weight (`front.fairshare`)."""
    return {c.name: c.weight for c in params.callers if c.weight != 1.0}


class Front(Recovery):
    """Queue, slot ledger, routing, health, preemption, retries, shedding and callers' limits
    in one object, changed only through `handle`; drivers read it through the views below."""

    def __init__(self, params: FrontParams) -> None:
        self._params = params
        self._classes = {c.name: c for c in params.classes}
        self._queue = make_scheduler(params.queue, params.classes, _weights(params))
        self._slots = BackendPool(params.backends, params.classes, params.health)
        self._ejector = Ejector(params.ejection)
        self._programs = ProgramBook(params.programs)  # agent programs: service received, home backend
        self._latency = Latency()  # each backend's TTFT fit (`front.latency`), kept across reloads
        self._router = Router(params.routing, self._ejector, self._latency, self._programs)
        self._predicts = _predicts(params)
        self._hedger = Hedger(params.hedging)
        self._policy = PreemptionPolicy.from_params(params.preemption, params.queue.policy)
        self._budget = retry_budget(params.retry)
        self._max_attempts = params.retry.max_attempts
        self._limits = CallerLimits(params.callers)
        self._pacer = Pacer(params.classes)
        self._reqs: dict[str, Tracked] = {}
        self._candidates: dict[str, Tracked] = {}  # running preemptible requests
        self._out: list[Decision] = []
        self._may_preempt = True
        self._closed = False
        self._now = -math.inf  # the last instant it was told
        self._queued_bytes = 0  # the bodies of the requests not yet started (`Arrive.body_bytes`)
        self._broken: FrontBroken | None = None
        # The tables as bound methods: one dict lookup per event, not a chain of isinstance.
        self._transitions: dict[tuple[State | None, type], Callable[[Any, float], None]] = {
            key: getattr(self, name) for key, name in TRANSITIONS.items()}
        self._front_events: dict[type, Callable[[Any, float], None]] = {
            event: getattr(self, name) for event, name in FRONT_EVENTS.items()}
        # What an event must satisfy beyond its state's row, checked before anything changes.
        self._checks: dict[type, Callable[[Any, Tracked | None], None]] = {
            Arrive: self._check_arrive, FirstContent: self._check_attempt, Failed: self._check_attempt}

    # --- the chokepoint ---------------------------------------------------------------------

    def handle(self, event: Event, now: float, *, preempt: bool = True) -> Sequence[Decision]:
        """Apply one event at `now`; the decisions it led to, in the order to carry them out.
        `preempt=False` defers any preemption it would cause to the next event (the simulator's
        engine cannot abort mid-step). Raises a `ProtocolError` (`WrongEvent`, `NotAnEvent`,
        `ClockWentBack`) with the front unchanged, or `FrontBroken` once a handler has failed."""
        if self._broken is not None:
            raise self._broken
        handler = self._handler(event)
        if now < self._now:
            raise ClockWentBack(now, self._now)
        out = self._out = []  # built per call: a failed call leaks nothing into the next
        self._may_preempt = preempt  # what every pump this event leads to may do
        try:
            handler(event, now)
        except Exception as e:  # past every check: the front may be half changed
            self._broken = FrontBroken(e, event)
            raise self._broken from e
        self._now = now
        return out if out else NOTHING

    def _handler(self, event: object) -> Callable[[Any, float], None]:
        """The handler the tables give `event`, once every check has passed."""
        kind = type(event)
        handler = self._front_events.get(kind)
        if handler is not None:
            if kind is Reconfigure:
                self._check_reconfigure(event)  # type: ignore[arg-type]
            return handler
        if kind not in _REQUEST_EVENTS:
            raise NotAnEvent(event)
        r = self._reqs.get(event.id)  # type: ignore[attr-defined]
        state = None if r is None else r.state
        handler = self._transitions.get((state, kind))
        if handler is None:
            raise WrongEvent(event, _not_taken(state, kind))  # type: ignore[arg-type]
        check = self._checks.get(kind)
        if check is not None:
            check(event, r)
        return handler

    @property
    def broken(self) -> FrontBroken | None:
        """Why the front refuses every call, once a handler has failed (None while it works)."""
        return self._broken

    # --- views ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Requests waiting for a slot (queued or suspended)."""
        return len(self._queue)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._reqs

    def state(self, req_id: str) -> State:
        return self._reqs[req_id].state

    @property
    def params(self) -> FrontParams:
        """The parameters in force (read-only: a change goes in as `Reconfigure`)."""
        return self._params

    def may_suspend(self, cls: str) -> bool:
        """Whether a request of `cls` may be preempted at all (its class is preemptible and the
        policy is on)."""
        return self._policy is not None and self._classes[cls].preemptible

    def tracks(self, cls: str, resumable: bool) -> bool:
        """Whether a request of `cls` whose output is `resumable` (the intake's rule) may be
        continued from its text, so its driver keeps that text: it may be suspended, or moved
        to another backend if its own dies mid-answer (`_migrate`). The one place both drivers
        ask. A lone backend has nowhere to move a stream to, so its chats keep the relay that
        parses nothing."""
        return resumable and (self.may_suspend(cls) or self._migrates())

    def _migrates(self) -> bool:
        """A stream may be moved: migrations are on and there is a second backend, one that can
        continue a generation."""
        slots = self._slots
        return (self._params.retry.max_migrations > 0 and len(slots) > 1
                and any(s.cfg.continues for s in slots))

    def hedges(self, cls: str) -> bool:
        """Whether requests of `cls` may be hedged: then their driver tells `FirstContent`."""
        return self._hedger.hedges(cls)

    def retry_after_s(self) -> float:
        return self._queue.admission.retry_after_s()

    def predicted_ttft_s(self, req_id: str) -> float | None:
        """Request `req_id`'s TTFT from its first start, as its backend's latency fit predicts it
        now from what that start looked like (`front.latency`); None before it started, after it
        ended, or while the fit predicts nothing. What a record may set beside the TTFT it measured."""
        r = self._reqs.get(req_id)
        if r is None or r.x is None:
            return None
        return self._latency.predict(r.tried[0], r.x)

    def start_ttft_s(self, backend: str) -> float | None:
        """`backend`'s mean TTFT from a start lately (its latency fit's samples; None: none yet):
        what a first token costs once a slot is had, for the capacity signal's TTFT budget."""
        fit = self._latency.fit(backend)
        return None if fit is None else fit.mean_s()

    def latency(self, backend: str) -> Coefficients | None:
        """`backend`'s fitted TTFT terms (None: not fitted yet): what /metrics and docs show."""
        fit = self._latency.fit(backend)
        return None if fit is None else fit.coefficients()

    def next_wakeup(self) -> float | None:
        """When `Tick` next has something to do (a queued request's bound, an ejection's end), or
        None."""
        queued = len(self._queue) > 0
        times = [t for t in (self._queue.next_wakeup() if queued else None, self._ejector.next_return(),
                             self._hedger.next_due(), self._pacer.next_due() if queued else None) if t is not None]
        return min(times) if times else None

    def queue_len(self, cls: str) -> int:
        return self._queue.queue_len(cls)

    def backends(self) -> Iterator[BackendView]:
        for name in self._slots.names:
            yield self.backend(name)

    def backend(self, name: str) -> BackendView:
        s = self._slots[name]
        models = s.cfg.models or (tuple(sorted(s.learned_models)) if s.learned_models is not None else None)
        return BackendView(s.name, s.healthy, s.retiring, s.in_flight, s.cfg.max_concurrency, s.cfg.reserve(s.cap),
                           s.probed, s.failures, self._ejector.ejected(name), s.cfg.pool, models, s.cap,
                           self._router.stale(s, self._now))

    def is_healthy(self, backend: str) -> bool:
        return self._slots.is_healthy(backend)

    def any_healthy(self) -> bool:
        return self._slots.any_healthy()

    def standing(self, caller: str, now: float) -> tuple[Standing | None, Standing | None]:
        """Where `caller`'s request and token limits stand at `now` (None: no such limit)."""
        return self._limits.standing(caller, now)

    # --- events -----------------------------------------------------------------------------

    def _check_arrive(self, ev: Arrive, r: Tracked | None) -> None:
        if ev.cls not in self._classes:
            raise WrongEvent(ev, f"unknown class (known: {', '.join(self._classes)})")

    def _check_attempt(self, ev: FirstContent | Failed, r: Tracked | None) -> None:
        """A hedged request's event names one of the attempts it runs."""
        assert r is not None
        if ev.backend is not None and ev.backend != r.backend and ev.backend != r.hedge:
            runs = r.backend if r.hedge is None else f"{r.backend} and {r.hedge}"
            raise WrongEvent(ev, f"the request runs on {runs}, not {ev.backend}")

    def _check_reconfigure(self, ev: Reconfigure) -> None:
        """A reload that needs a restart (classes added, removed or renamed; a scheduler policy
        that does not exist) is refused with nothing changed."""
        params = ev.params
        _same_names("classes", [c.name for c in self._params.classes], [c.name for c in params.classes])
        make_scheduler(params.queue, params.classes, _weights(params))

    def _arrive(self, ev: Arrive, now: float) -> None:
        spec = self._classes[ev.cls]
        req_id, caller = ev.id, ev.caller
        refused = self._refusal(ev, now)
        if refused is not None:
            self._out.append(refused)
            return
        routed = ev.model is not None or ev.prefix or ev.pin or ev.program
        route = Route(ev.model, ev.prefix, ev.pin, ev.program, ev.prompt) if self._predicts else \
            Route(ev.model, ev.prefix, ev.pin, ev.program) if routed else NO_ROUTE
        level, program_at = self._programs.place(ev.program, now)
        pending = Pending(req_id, ev.cls, spec.rank, ev.est_tokens, now, now + spec.max_queue_wait_s, caller,
                          ev.max_tokens, level, program_at, self._deadline(spec, ev.ttft_slo_s, now))
        if self._predicts and len(self._queue):
            pending = self._targeted(pending, spec, route, now)
        queued = self._queue.push(pending, now)
        for shed in self._queue.take_shed():  # queued requests that cost more, shed to make room for it
            self._left(self._reqs.pop(shed.id), now)
            self._out.append(Reject(shed.id, RejectReason.SHED, self.retry_after_s()))
        if queued is not None:
            self._out.append(Reject(req_id, queued.reason, queued.retry_after_s))
            return
        self._budget.record_call(now)
        self._hedger.arrived(ev.cls, now)
        kept = self.tracks(ev.cls, ev.resumable)
        r = self._reqs[req_id] = Tracked(pending, kept and self.may_suspend(ev.cls), ev.max_tokens, caller, route,
                                         kept, ev.resumable)
        r.body_bytes = ev.body_bytes
        self._queued_bytes += ev.body_bytes
        if caller is not None:  # its one reservation, which its retries and continuations share
            r.held = self._limits.take(caller, ev.est_tokens, now)
        self._pump(now, self._may_preempt)

    def _deadline(self, spec: ClassSpec, ttft_slo_s: float | None, now: float) -> float:
        """When a request arriving now is due its first token: its own TTFT target, else its
        class's (inf: none)."""
        ttft_s = ttft_slo_s if ttft_slo_s is not None else spec.slo.ttft_s if spec.slo is not None else None
        return math.inf if ttft_s is None else now + ttft_s

    def _targeted(self, p: Pending, spec: ClassSpec, route: Route, now: float) -> Pending:
        """`p` with its predicted TTFT once started on the best backend that may take it (a slot
        freeing first where none is free) and the prompt tokens that backend's cache is expected to
        hold: what admission, the order and shedding weigh. Asked only while requests are queued:
        with none ahead no wait can make a request miss, and it starts at once where a slot is free."""
        hits = self._router.hits(route)
        best: float | None = None
        cached = 0
        for s in self._router.usable(self._slots, self._router.serving(self._slots, spec, route)):
            t = self._router.predicted_s(s, route, hits, now, waits=True)
            if t is not None and (best is None or t < best):
                best = t
            cached = max(cached, hits.get(s.name, 0) * PREFIX_BLOCK_TOKENS)
        return replace(p, service_s=best, cached_tokens=min(cached, route.prompt_tokens))

    def _refusal(self, ev: Arrive, now: float) -> Reject | None:
        """Why a request is refused before it is queued (the bodies queued already fill their
        budget, the replicas' shared limits refused its caller, shut down, a model nobody serves,
        nowhere to go, its caller's limits here), or None."""
        budget = self._params.queue.max_queued_body_bytes
        if budget is not None and self._queued_bytes + ev.body_bytes > budget:
            return Reject(ev.id, RejectReason.QUEUE_FULL, 1.0, budget, self._queued_bytes)
        shared = ev.shared
        if shared is not None and shared.reason is not None:
            return Reject(ev.id, shared.reason, shared.retry_after_s, shared.limit, shared.used, True)
        if self._closed:
            return Reject(ev.id, RejectReason.SHUTTING_DOWN, 1.0)
        route = Route(ev.model)
        serving = self._router.serving(self._slots, self._classes[ev.cls], route)
        if not serving and ev.model is not None and self._nobody_serves(ev.model):
            return Reject(ev.id, RejectReason.MODEL_NOT_FOUND, 0.0)
        if not self._router.usable(self._slots, serving):
            return Reject(ev.id, RejectReason.NO_HEALTHY_BACKEND, self.retry_after_s())
        limited = self._limits.refusal(ev.caller, ev.est_tokens, now) if ev.caller is not None else None
        if limited is None:
            return None
        return Reject(ev.id, limited.reason, limited.retry_after_s, limited.limit, limited.used)

    def _nobody_serves(self, model: str) -> bool:
        """No backend serves `model`, as far as every backend's models are known (one whose are
        not yet known may serve it: it is not refused, it waits for one that does)."""
        return all(s.knows_models() and not s.serves(model) for s in self._slots if not s.retiring)

    def _opened(self, ev: Opened, now: float) -> None:
        """A running request's upstream is open, so a `Suspend` can stop it now. A request
        waiting for a slot may take this one's at once."""
        r = self._reqs[ev.id]
        if not r.preemptible:
            return
        r.suspendable = True
        if len(self._queue):
            self._pump(now, self._may_preempt)

    def _generated(self, ev: Generated, now: float) -> None:
        self._reqs[ev.id].generated = ev.tokens

    def _first_content(self, ev: FirstContent, now: float) -> None:
        """The first content came from `ev.backend`. Unhedged: its TTFT on its backend is a
        sample (`_ttft`). Hedged: that attempt wins, the other is dropped at once."""
        r = self._reqs[ev.id]
        if r.first:
            return
        r.first = True
        self._hedger.disarm(ev.id)
        if r.hedge is None:
            self._latency.prefilled(r.backend, ev.id)
            if r.x is not None and r.attempts == 1 and not r.preemptions:  # one undisturbed run: a sample
                if self._latency.observe(r.backend, r.x, now - r.bound_at):
                    self._first_predictions(now)
            self._ttft(r, now - r.bound_at, now)
            return
        loser = r.hedge if ev.backend == r.backend else r.backend
        r.backend, r.hedge = ev.backend, None
        self._out.append(Drop(ev.id, loser, ev.backend))
        self._release(loser, r.pending)
        self._pump(now, self._may_preempt)

    def _first_predictions(self, now: float) -> None:
        """A backend's fit predicts for the first time: the requests queued before any could be
        predicted (the first moments of a burst, a restart under load) with a TTFT target get
        their prediction now, so that in a class that sheds one that can no longer make its target
        leaves `late` at its latest start instead of being served late. Once per backend's fit."""
        for r in self._reqs.values():
            p = r.pending
            if r.state is not State.QUEUED or p.service_s is not None or p.deadline_at == math.inf:
                continue
            service_s = self._targeted(p, self._classes[p.cls], r.route, now).service_s
            if service_s is not None:
                r.pending = self._queue.predicted(p.id, service_s) or r.pending

    def _ttft(self, r: Tracked, ttft_s: float, now: float) -> None:
        """An unhedged request's TTFT on its backend, from its start there: a sample of its
        class's (what a hedge waits), and, from its one start of an undisturbed run, of an
        adaptive backend's latency (a race's first content is the faster attempt's, not the
        backend's). A cap that grew lets the queue in, suspending nothing itself (a sample may
        come between two ends of one engine step)."""
        cls = r.pending.cls
        hedged = self._hedger.hedges(cls)
        if hedged:
            self._hedger.observe(cls, ttft_s)
        elif r.attempts == 1 and not r.preemptions and self._slots.observe(r.backend, ttft_s, None):
            self._pump(now, False)

    def wants_first_content(self, cls: str, backend: str) -> bool:
        """Whether a driver tells `FirstContent` of a request of `cls` on `backend`: its class is
        hedged (a race ends there), or the backend's cap learns from its TTFT."""
        return self._predicts or self._hedger.hedges(cls) or self._slots.adapts(backend)

    def _hedge_due(self, now: float) -> None:
        """Requests still without content past their hedge delay go to a second backend too,
        within the budget, where one that may take them has room."""
        for req_id in self._hedger.due(now):
            r = self._reqs.get(req_id)
            if r is None or r.state is not State.RUNNING or r.first or r.hedge is not None:
                continue
            target = self._choose(r, now, exclude=(*r.tried, r.backend))
            if target is None or not self._hedger.allowed(now):
                continue
            self._slots.acquire(target, r.pending.cls, r.pending.est_tokens)
            self._router.bound(target, r.route)
            r.hedge = target
            r.tried.append(target)
            self._out.append(Start(req_id, target, StartMode.HEDGE))

    def _finished(self, ev: Finished, now: float) -> None:
        """The request ended (success, error, timeout, client gone): the one event that ends a
        request the front has not rejected itself. An engine that answered, even with a 4xx the
        client caused, is alive."""
        r = self._reqs.pop(ev.id)
        self._hedger.disarm(ev.id)
        if r.caller is not None:
            self._limits.settle(r.caller, r.held, ev.tokens, now)
        if r.route.program is not None:
            self._programs.served(r.route.program, ev.tokens, now)
        p = r.pending
        held = r.state is State.RUNNING or r.state is State.FAILED  # it holds its slot
        if held:
            if r.hedge is not None:  # ended before either attempt streamed: both go
                self._release(r.hedge, p)
            alive = ev.outcome is Outcome.SUCCESS or ev.outcome is Outcome.CLIENT_ERROR
            if ev.outcome is Outcome.SUCCESS and not r.preemptions:  # one whole run: how fast it serves
                self._slots.served_in(r.backend, now - r.bound_at, p.est_tokens, now)
            if alive:
                self._ejector.answered(r.backend)
                if self._slots.mark_success(r.backend):
                    self._out.append(HealthChanged(r.backend, True))
            self._release(r.backend, p)
            self._candidates.pop(ev.id, None)
        else:
            self._queue.remove(ev.id, now)
            self._unqueued(r)
        self._queue.settled(ev.id, ev.tokens)  # after `remove`: a fair queue knows its caller until then
        if r.state is not State.QUEUED:  # it was dispatched once: a completion for the drain rate
            self._queue.on_finish(p.cls if held else None, ev.outcome, now)
        self._pump(now, self._may_preempt)

    def _probed(self, ev: Probed, now: float) -> None:
        """A health probe (one that answered keeps the backend's reading fresh: `front.router`'s
        staleness). One that timed out while the backend was delivering bytes to
        requests in flight (`busy`) counts neither way: an engine too loaded to answer its health
        page promptly is not a dead one, and taking the only backend out would strand everything
        queued behind it (a wedged server is still found by its requests' own failures). A late
        probe of a backend that has left changes nothing."""
        if not ev.busy:
            self._slots.probed(ev.backend, now if ev.ok else None)
        if ev.ok:
            if self._slots.mark_success(ev.backend):
                self._out.append(HealthChanged(ev.backend, True))
                self._pump(now, self._may_preempt)
        elif not ev.busy and self._slots.mark_failure(ev.backend):
            self._out.append(HealthChanged(ev.backend, False))

    def _observed(self, ev: Observed, now: float) -> None:
        """A latency sample moves an adaptive backend's cap; a cap that grew lets the queue in.
        It suspends nothing itself (a preemption is weighed at the next event that may preempt):
        a sample may come between two ends of one engine step, before the second is told."""
        if self._slots.observe(ev.backend, ev.ttft_s, ev.itl_s):
            self._pump(now, False)

    def _kind_learned(self, ev: KindLearned, now: float) -> None:
        """Whether the backend can continue a generation sets its reservation and whether
        requests on it may be suspended."""
        self._slots.set_continues(ev.backend, ev.continues)
        self._pump(now, self._may_preempt)

    def _served(self, ev: Served, now: float) -> None:
        """What the backend serves is known: requests waiting for its models may go there."""
        self._slots.learn_models(ev.backend, ev.models)
        self._pump(now, self._may_preempt)

    def _allotted(self, ev: Allotted, now: float) -> None:
        """This replica's part of a shared backend's slots changed; a part that grew lets the
        queue in (suspending nothing itself, as a grown adaptive cap)."""
        if self._slots.allot(ev.backend, ev.slots):
            self._pump(now, False)

    def _served_elsewhere(self, ev: ServedElsewhere, now: float) -> None:
        """Other replicas' fair-share service: the order among callers may change, the slots
        do not, so nothing is started here."""
        self._queue.served_elsewhere(ev.service)

    def _local_share(self, ev: LocalShare, now: float) -> None:
        """Redis went away under `on_unavailable: local` (each limit 1/N here), or came back."""
        self._limits.share(ev.replicas)

    def take_served(self) -> dict[str, float]:
        """The fair-share service this front gave each caller since the last call, for the
        other replicas (`gateway.shared.fair`); empty unless `scheduler.fair_share`."""
        return self._queue.take_served()

    def _loaded(self, ev: Loaded, now: float) -> None:
        self._slots.engine_load(ev.backend, ev.queued, now)

    def _tick(self, ev: Tick, now: float) -> None:
        """Requests past their queue bound leave with `queue_timeout`, those that can no longer
        make their TTFT target (a class that sheds) with `late`; ejections that are over end; the
        rest are bound to whatever became free."""
        for p in self._queue.expire(now):
            self._left(self._reqs.pop(p.id), now)
            reason = RejectReason.QUEUE_TIMEOUT if p.waited_out(now) else RejectReason.LATE
            self._out.append(Reject(p.id, reason, self.retry_after_s()))
        for backend in self._ejector.returns(now):
            self._out.append(Readmitted(backend))
        self._pacer.expire(now)
        self._hedge_due(now)
        self._pump(now, self._may_preempt)

    def _close(self, ev: Close, now: float) -> None:
        self._closed = True
        for req_id, r in list(self._reqs.items()):
            if r.state is not State.RUNNING:
                self._queue.remove(req_id, now)
                self._left(self._reqs.pop(req_id), now)
                self._out.append(Reject(req_id, RejectReason.SHUTTING_DOWN, 1.0))

    def _reconfigure(self, ev: Reconfigure, now: float) -> None:
        """Swap in new parameters for the same classes, keeping every queued, running and
        suspended request: queued ones keep their place in arrival order and their wait bound (a
        new policy re-sorts them, with no admission check), running ones keep their slot even
        where a cap fell below what is in flight (new binds wait until it is met), and a class
        that is no longer preemptible has its running requests left alone. A new backend takes
        requests at once; a removed one takes no new request and its running ones end where they
        are (`Retired` when the last has). Adding, removing or renaming a class needs a restart:
        `ConfigError`, and nothing changed. A changed retry budget starts afresh."""
        params = ev.params  # checked (`_check_reconfigure`): the same classes, a known policy
        self._queue = carry_over(self._queue, params.queue, params.classes, _weights(params))
        if params.retry != self._params.retry:
            self._budget = retry_budget(params.retry)
        self._limits.reconfigure(params.callers)
        self._ejector.reconfigure(params.ejection)
        self._router.reconfigure(params.routing)
        self._programs.reconfigure(params.programs)
        self._hedger.reconfigure(params.hedging)
        self._pacer.reconfigure(params.classes)
        self._params = params
        self._classes = {c.name: c for c in params.classes}
        self._predicts = _predicts(params)
        gone = self._slots.reconfigure(params.backends, params.classes, params.health)
        for name in gone:
            self._retired(name)
        self._policy = PreemptionPolicy.from_params(params.preemption, params.queue.policy)
        self._max_attempts = params.retry.max_attempts
        for req_id, r in self._reqs.items():
            rank = self._classes[r.pending.cls].rank
            if r.pending.rank != rank:
                r.pending = replace(r.pending, rank=rank)
            if r.preemptible and not self.may_suspend(r.pending.cls):
                r.preemptible = r.suspendable = False
                self._candidates.pop(req_id, None)
        self._pump(now, self._may_preempt)

    def _left(self, r: Tracked, now: float) -> None:
        """A request the front refused after letting it in (expired, shut down) is charged what it
        generated before (a suspended one's earlier runs), and its caller gets back the rest."""
        self._unqueued(r)
        if r.caller is not None:
            self._limits.settle(r.caller, r.held, r.generated, now)
        self._queue.settled(r.pending.id, r.generated)


def _not_taken(state: State | None, kind: type) -> str:
    """What a request in `state` is, for a `WrongEvent` naming an event of `kind` it does not take."""
    if state is None:
        return "not in the front (it ended, was rejected, or never arrived)"
    if kind is Arrive:
        return f"the request is {state.value} already"
    return f"the request is {state.value}, not running"


def _same_names(what: str, old: list[str], new: list[str]) -> None:
    if sorted(old) != sorted(new):
        added = sorted(set(new) - set(old))
        removed = sorted(set(old) - set(new))
        change = "; ".join(p for p in (f"added {', '.join(added)}" if added else "",
                                        f"removed {', '.join(removed)}" if removed else "") if p)
        raise ConfigError(f"the {what} changed ({change}): that needs a restart of the gateway, "
                          f"a live reload only changes settings of the same {what}")
