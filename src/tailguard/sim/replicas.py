"""Several gateway replicas in front of one engine, on virtual time: each replica its own front
(its own queue and order), all of them sharing the backend's `max_concurrency` through slot
allotments as `gateway.shared.slots` leases them in Redis. What it shows: together the replicas
never have more than the cap in the engine, and what sharing costs their requests in waiting.

The allotment is `front.leases.SlotStore.renew`, the rule the renewal script of
`gateway.shared.slots` is the Lua copy of (the same steps, in the same order: expired leases
dropped, the cap water-filled over the replicas' demands, never more than the others leave free);
`tests/functional/test_shared_slots.py` runs both on the same renewals and checks that they
answer alike. Each replica renews as
`SlotLeases` does, on `front.leases`' pacing: every third of a lease, and within `eager_s` of
lacking slots for its queue or holding slots it does not use; it lowers its front's cap to what it runs as it sends a
renewal, and the answer reaches its front `rtt_s` later (`Allotted`); with each renewal the
fair-share service its front gave reaches the others (`ServedElsewhere`, as
`gateway.shared.fair` exchanges it at the same pace). The load balancer sends
arrivals to the replicas in turn. Requests are not preempted, hedged or retried here, and the
engine never fails: `sim.des` models those for one front.

    result = run_replicas(engine, arrivals, params, replicas=2)
    result.most_in_engine <= params.backends[0].max_concurrency
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.front.events import (
    Allotted, Decision, Drop, Ejected, FirstContent, Finished, GiveUp, HealthChanged, Readmitted, Reject, Retired,
    ServedElsewhere, Start, StartMode, Suspend, Tick, Wait,
)
from tailguard.front.front import Front
from tailguard.front.leases import EAGER_S, RenewalPacing, SlotStore, short
from tailguard.front.params import FrontParams
from tailguard.sim.scenario import Arrival, Timeline
from tailguard.sim.engine import Engine, FirstToken, RequestFinished, SimRequest, Step
from tailguard.types import Outcome


# What this run does with each decision: a first `Start` and a `Reject`. The others cannot come
# from the fronts it builds, and one that does stops the run naming it.
CARRIED: dict[type, str] = {Start: "_start", Reject: "_reject"}
NOT_APPLICABLE: dict[type, str] = {
    Suspend: "no class here is preemptible: one engine that never fails, no preemption modelled",
    Wait: "an attempt never fails here, so no retry waits",
    GiveUp: "an attempt never fails here, so none is given up",
    Drop: "no class here is hedged",
    HealthChanged: "no probes here: the engine is always up",
    Ejected: "an attempt never fails here, so no backend is ejected",
    Readmitted: "no backend is ejected here",
    Retired: "the fronts are never reconfigured here",
}


@dataclass
class ReplicasRun:
    """What a run gives: each request's timeline (in the order of the arrivals), the most
    requests the engine had at once (running and waiting in it), and the renewals sent."""

    timelines: list[Timeline]
    most_in_engine: int = 0
    renewals: int = 0
    replica_of: dict[str, int] = field(default_factory=dict)


_ARRIVE, _STEP_END, _ANSWER, _CHECK, _SERVED = range(5)


class _Replica:
    __slots__ = ("i", "front", "allotted", "held", "pacing")

    def __init__(self, i: int, front: Front, pacing: RenewalPacing) -> None:
        self.i, self.front, self.pacing = i, front, pacing
        self.allotted: int | None = None  # the cap told to its front (None: none told, the whole)
        self.held = 0


def run_replicas(engine: Engine, arrivals: Iterable[Arrival], params: FrontParams, replicas: int, *,
                 shared: bool = True, lease_s: float = 5.0, eager_s: float = EAGER_S, rtt_s: float = 0.0005,
                 share_service: bool = True) -> ReplicasRun:
    """Run every arrival to its end through `replicas` fronts of `params` (one backend: this
    engine). `shared`: the fronts share its `max_concurrency` by allotments; else each has all of
    it. `share_service`: with `shared`, their fair-share counters are one set, as with Redis."""
    if len(params.backends) != 1:
        raise ValueError("the replicas run drives one engine: give the fronts exactly one backend")
    return _Run(engine, list(arrivals), params, replicas, shared, lease_s, eager_s, rtt_s, share_service).loop()


class _Run:
    def __init__(self, engine: Engine, arrivals: list[Arrival], params: FrontParams, n: int, shared: bool,
                 lease_s: float, eager_s: float, rtt_s: float, share_service: bool) -> None:
        self.engine, self.lease_s, self.rtt_s = engine, lease_s, rtt_s
        self.share_service = share_service
        self.backend = params.backends[0].name
        self.store = SlotStore(params.backends[0].max_concurrency) if shared else None
        self.replicas = [_Replica(i, Front(params), RenewalPacing(lease_s, eager_s)) for i in range(n)]
        self.timelines = {a.id: Timeline(a.id, a.cls, a.at, a.prompt_tokens, a.max_tokens) for a in arrivals}
        self._carry: dict[type, Callable[[Any, float], None]] = {
            kind: getattr(self, name) for kind, name in CARRIED.items()}
        self.result = ReplicasRun(list(self.timelines.values()))
        self.arrivals = {a.id: a for a in arrivals}
        self.agenda: list[tuple[float, int, int, object]] = []
        self.order = 0
        self.open = len(arrivals)
        self.stepping = False
        for k, a in enumerate(arrivals):
            self.result.replica_of[a.id] = k % n
            self._schedule(a.at, _ARRIVE, a)
        if self.store is not None:
            for r in self.replicas:
                self._tell(r, 0)  # nothing starts before its first renewal says what is its
                self._schedule(0.0, _CHECK, r)

    def loop(self) -> ReplicasRun:
        now = 0.0
        while self.open:
            wake = min((w for r in self.replicas if (w := r.front.next_wakeup()) is not None), default=math.inf)
            if not self.stepping and not self.engine.idle():
                self._step(now)
            t = min(self.agenda[0][0] if self.agenda else math.inf, max(wake, now))
            if t == math.inf:
                raise RuntimeError("requests are stuck in the fronts with the engine idle")
            now = t
            if wake <= t and (not self.agenda or self.agenda[0][0] > t):
                for r in self.replicas:
                    self._apply(r, r.front.handle(Tick(), now), now)
                continue
            _, _, kind, what = heapq.heappop(self.agenda)
            if kind == _ARRIVE:
                assert isinstance(what, Arrival)
                r = self.replicas[self.result.replica_of[what.id]]
                self._apply(r, r.front.handle(what.arrive(), now), now)
            elif kind == _STEP_END:
                assert isinstance(what, Step)
                self._step_ended(what, now)
            elif kind == _CHECK:
                assert isinstance(what, _Replica)
                self._check(what, now)
            elif kind == _SERVED:
                assert isinstance(what, tuple)
                r, service = what
                self._apply(r, r.front.handle(ServedElsewhere(service), now), now)
            else:
                assert isinstance(what, tuple)
                r, held, cap = what
                r.held = held
                self._tell(r, cap, now)
        return self.result

    def _schedule(self, at: float, kind: int, what: object) -> None:
        self.order += 1
        heapq.heappush(self.agenda, (at, self.order, kind, what))

    def _step(self, now: float) -> None:
        step = self.engine.step(now)
        self.stepping = True
        self._schedule(now + step.duration_s, _STEP_END, step)

    def _step_ended(self, step: Step, now: float) -> None:
        self.stepping = False
        for ev in step.events:
            tl = self.timelines[ev.req_id]
            r = self.replicas[self.result.replica_of[ev.req_id]]
            if isinstance(ev, FirstToken) and tl.first_token_at is None:
                tl.first_token_at = now
                self._apply(r, r.front.handle(FirstContent(ev.req_id, self.backend), now), now)
            elif isinstance(ev, RequestFinished):
                tl.finished_at, tl.output_tokens, tl.outcome = now, ev.output_tokens, Outcome.SUCCESS
                self.open -= 1
                self._apply(r, r.front.handle(Finished(ev.req_id, Outcome.SUCCESS, tl.prompt_tokens + ev.output_tokens),
                                              now), now)
        for r in self.replicas:
            if len(r.front):
                self._apply(r, r.front.handle(Tick(), now), now)

    def _apply(self, r: _Replica, decisions: Sequence[Decision], now: float) -> None:
        for d in decisions:
            method = self._carry.get(type(d))
            if method is None:
                raise ValueError(f"the replicas run does not model {d!r} ({NOT_APPLICABLE[type(d)]}): use sim.des "
                                 "for one front")
            method(d, now)

    def _start(self, d: Start, now: float) -> None:
        if d.mode is not StartMode.FRESH:
            raise ValueError(f"the replicas run does not model {d!r} (an attempt never fails here, no class is "
                             "preemptible or hedged): use sim.des for one front")
        a, tl = self.arrivals[d.id], self.timelines[d.id]
        tl.counts.apply(d)
        tl.dispatched_at, tl.backend = now, d.backend
        self.engine.add(SimRequest(a.id, a.prompt_tokens, a.max_tokens, a.priority), now)
        in_engine = self.engine.num_running + self.engine.num_waiting
        self.result.most_in_engine = max(self.result.most_in_engine, in_engine)

    def _reject(self, d: Reject, now: float) -> None:
        tl = self.timelines[d.id]
        tl.outcome, tl.reject_reason, tl.finished_at = Outcome.REJECTED, d.reason, now
        self.open -= 1

    def _check(self, r: _Replica, now: float) -> None:
        """As `SlotLeases._run`: renew when the pacing says so, and look again in `eager_s`."""
        assert self.store is not None
        if self.open:
            self._schedule(now + r.pacing.eager_s, _CHECK, r)
        running, waiting = r.front.backend(self.backend).in_flight, len(r.front)
        if not r.pacing.due(now, short(running, waiting, r.allotted or 0, r.held, self.store.cap)):
            return
        self._tell(r, min(running, r.allotted or 0), now)  # nothing starts until the answer
        held, allotted = self.store.renew(r.i, running + waiting, running, now, self.lease_s)
        self.result.renewals += 1
        self._schedule(now + self.rtt_s, _ANSWER, (r, held, allotted))
        served = r.front.take_served()  # fair-share service, as `gateway.shared.fair` exchanges it
        if served and self.share_service:
            for other in self.replicas:
                if other is not r:
                    self._schedule(now + self.rtt_s, _SERVED, (other, served))

    def _tell(self, r: _Replica, slots: int, now: float = 0.0) -> None:
        if r.allotted != slots:
            r.allotted = slots
            self._apply(r, r.front.handle(Allotted(self.backend, slots), now), now)
