"""The discrete-event driver of the engine model: timed requests in, one `Timeline` per request
out, on a `VirtualClock` (no sleeping, no I/O).

Optionally a gateway scheduler (`tailguard.gateway.scheduler.Scheduler`) stands in front of the
engine, as the gateway does: arrivals are pushed to it, at most `front_max_inflight` requests are
in the engine at once, and a slot freed by a finished request is refilled by `front.pop`. That is
how a gateway policy is evaluated on virtual time with the very object the gateway runs.

With a `preemption` policy as well, the run preempts as the gateway's dispatcher does: when the
front's best queued request finds no slot, the policy may name a running request of a
preemptible class; it is aborted in the engine (slot and KV freed at once), queued again with its
first arrival time, and when dispatched again it re-enters the engine as its continuation: prompt
= original prompt + tokens generated so far, max_tokens = what is left.

`follow_up` turns the run into a closed loop: each request's end may send the next one at once.

Time runs like the HTTP server's: a step starting at t ends at t + duration; requests arriving
meanwhile join the engine's waiting queue at their arrival instant and are considered from the
next step; tokens and finishes take effect at the step's end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Iterable, cast

from tailguard.clock import VirtualClock
from tailguard.gateway.preemption import Candidate, PreemptionPolicy
from tailguard.gateway.scheduler import Pending, PreemptiveScheduler, Scheduler
from tailguard.sim.engine import Admitted, Engine, FirstToken, Preempted, RequestFinished, SimRequest
from tailguard.types import Outcome


@dataclass(slots=True, frozen=True)
class Arrival:
    """A timed request. `cls`, `rank` and `wait_bound_s` matter only with a `front` scheduler;
    `priority` is vLLM's (lower first, with the engine's "priority" policy)."""

    id: str
    at: float
    prompt_tokens: int
    max_tokens: int
    cls: str = "interactive"
    rank: int = 0
    priority: int = 0
    wait_bound_s: float = math.inf
    block_hashes: tuple[int, ...] = ()  # prefix-cache keys of the prompt's leading blocks (sim.kv)


@dataclass(slots=True)
class Timeline:
    """What happened to one request, in simulated seconds.

    `queue_s` runs from arrival to the engine first scheduling the request (the front queue plus
    the engine's own queue); `front_queue_s` is the part spent in the front scheduler.
    `token_times` is filled only when `run(..., record_tokens=True)`.
    """

    id: str
    cls: str
    arrived_at: float
    prompt_tokens: int
    max_tokens: int
    outcome: Outcome | None = None
    reject_reason: str | None = None  # "queue_full" | "wait_bound" | "queue_timeout" | "context_length"
    finish_reason: str | None = None
    dispatched_at: float | None = None
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    preemptions: int = 0  # by the engine (KV pressure)
    suspensions: int = 0  # by the front (gateway preemption)
    token_times: list[float] | None = None

    @property
    def queue_s(self) -> float | None:
        return None if self.admitted_at is None else self.admitted_at - self.arrived_at

    @property
    def front_queue_s(self) -> float | None:
        return None if self.dispatched_at is None else self.dispatched_at - self.arrived_at

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrived_at

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.arrived_at

    @property
    def tpot_s(self) -> float | None:
        if self.finished_at is None or self.first_token_at is None or self.output_tokens < 2:
            return None
        return (self.finished_at - self.first_token_at) / (self.output_tokens - 1)


def run(
    engine: Engine,
    arrivals: Iterable[Arrival],
    clock: VirtualClock,
    front: Scheduler | None = None,
    front_max_inflight: int | None = None,
    *,
    record_tokens: bool = False,
    preemption: PreemptionPolicy | None = None,
    preemptible: Collection[str] = (),
    preempt_fits: Callable[[Pending, str], bool] | None = None,
    follow_up: Callable[[Timeline, float], Arrival | None] | None = None,
) -> list[Timeline]:
    """Run every arrival to its end; Timelines come back in the order the arrivals were given
    (then those of follow-ups, in the order they were sent).

    Without `front`, each request enters the engine at its arrival. With it, at most
    `front_max_inflight` (default: the engine's `max_num_seqs`) are in the engine at once.
    `preemption` (needs a `front` with `head`/`take`/`requeue`, as `BaseScheduler` has) may
    suspend running requests of the `preemptible` classes; `preempt_fits(waiting, victim_cls)`
    adds the slot-share check the gateway's pool makes. `follow_up(timeline, now)` is called when
    a request ends and may return the next arrival (at `now`).
    """
    given = list(arrivals)
    timelines: list[Timeline] = []
    by_id: dict[str, Timeline] = {}
    for a in given:
        if a.id in by_id:
            raise ValueError(f"duplicate arrival id {a.id!r}")
        tl = Timeline(a.id, a.cls, a.at, a.prompt_tokens, a.max_tokens)
        if record_tokens:
            tl.token_times = []
        timelines.append(tl)
        by_id[a.id] = tl
    order = sorted(given, key=lambda a: a.at)
    if order and order[0].at < clock.now():
        raise ValueError(f"arrival {order[0].id!r} at {order[0].at} is before the clock ({clock.now()})")
    r = _Run(engine, clock, front, front_max_inflight, by_id, order, record_tokens)
    if preemption is not None:
        if front is None:
            raise ValueError("preemption needs a front scheduler")
        r.preemption, r.preemptible, r.preempt_fits = preemption, frozenset(preemptible), preempt_fits
        r.pfront = cast(PreemptiveScheduler, front)
    r.follow_up, r.timelines = follow_up, timelines
    r.loop()
    return timelines


class _Live:
    """A front-dispatched request while it is in the engine or suspended."""

    __slots__ = ("arrival", "kv_key", "started_at", "base_tokens", "suspensions", "running")

    def __init__(self, arrival: Arrival, kv_key: int) -> None:
        self.arrival = arrival
        self.kv_key = kv_key  # the engine's name for its content: each run finds what the last left cached
        self.running = False  # in the engine (else suspended, queued in the front)
        self.started_at = 0.0
        self.base_tokens = 0  # generated in earlier runs
        self.suspensions = 0


class _Run:
    """One run's state; a class so the hot loop reads locals, not closures."""

    def __init__(
        self, engine: Engine, clock: VirtualClock, front: Scheduler | None, limit: int | None,
        by_id: dict[str, Timeline], order: list[Arrival], record: bool,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.front = front
        self.limit = limit if limit is not None else engine.config.max_num_seqs
        if self.limit < 1:
            raise ValueError("front_max_inflight must be >= 1")
        self.by_id = by_id
        self.order = order
        self.record = record
        self.waiting: dict[str, Arrival] = {}  # queued in the front scheduler
        self.inflight = 0
        self.max_model_len = engine.config.max_model_len
        self.preemption: PreemptionPolicy | None = None
        self.preemptible: frozenset[str] = frozenset()
        self.preempt_fits: Callable[[Pending, str], bool] | None = None
        self.pfront: PreemptiveScheduler | None = None
        self.in_step = False
        self.live: dict[str, _Live] = {}  # preemptible requests dispatched and not finished
        self.kv_keys = 0  # the next kv_key to give a preemptible request
        self.follow_up: Callable[[Timeline, float], Arrival | None] | None = None
        self.timelines: list[Timeline] = []

    def loop(self) -> None:
        engine, clock, front, by_id, order = self.engine, self.clock, self.front, self.by_id, self.order
        record = self.record
        n = len(order)
        i = 0
        inf = math.inf
        while True:
            if engine.idle():
                next_at = order[i].at if i < n else inf
                wake = front.next_wakeup() if front is not None and len(front) else None
                if wake is not None and wake <= next_at:
                    clock.advance_to(max(wake, clock.now()))
                    self._expire()
                    continue
                if i >= n:
                    if front is not None and len(front):
                        raise RuntimeError("requests are stuck in the front scheduler with the engine idle")
                    return
                clock.advance_to(next_at)
                while i < n and order[i].at <= next_at:  # everyone arriving at this instant
                    self._arrive(order[i])
                    i += 1
                continue

            now = clock.now()
            step = engine.step(now)
            end = now + step.duration_s
            if step.duration_s == 0.0 and not step.events:
                raise RuntimeError("the engine made no progress while busy")
            # Arrivals (and front-queue expiries) during the step, in time order. The step's
            # outcome is fixed already, so preemptions wait for its end (at most one step late).
            self.in_step = True
            while True:
                next_at = order[i].at if i < n else inf
                if front is not None and len(front):
                    wake = front.next_wakeup()
                    if wake is not None and wake < next_at and wake <= end:
                        clock.advance_to(max(wake, clock.now()))
                        self._expire()
                        continue
                if next_at > end:
                    break
                clock.advance_to(next_at)
                self._arrive(order[i])
                i += 1
            clock.advance_to(end)
            self.in_step = False

            if record:
                for rid in step.emitted:
                    times = by_id[rid].token_times
                    assert times is not None
                    times.append(end)
            for ev in step.events:
                tl = by_id[ev.req_id]
                if isinstance(ev, RequestFinished):
                    tl.finished_at = end
                    tl.output_tokens = ev.output_tokens
                    tl.finish_reason = ev.finish_reason
                    tl.outcome = Outcome.SUCCESS
                    self.inflight -= 1
                    if self.live:
                        lv = self.live.pop(ev.req_id, None)
                        if lv is not None:
                            tl.output_tokens += lv.base_tokens
                    if front is not None:
                        front.on_finish(ev.req_id, Outcome.SUCCESS, end)
                    if self.follow_up is not None:
                        self._follow(tl, end)
                elif isinstance(ev, FirstToken):
                    if tl.first_token_at is None:
                        tl.first_token_at = end
                elif isinstance(ev, Admitted):
                    if not ev.resumed and tl.admitted_at is None:
                        tl.admitted_at = now
                        tl.cached_tokens = ev.cached_tokens
                elif isinstance(ev, Preempted):
                    tl.preemptions += 1
            if front is not None and len(front):
                self._pump(end)

    # --- helpers ---------------------------------------------------------------------------

    def _follow(self, tl: Timeline, t: float) -> None:
        assert self.follow_up is not None
        a = self.follow_up(tl, t)
        if a is None:
            return
        if a.id in self.by_id:
            raise ValueError(f"duplicate arrival id {a.id!r}")
        new = Timeline(a.id, a.cls, a.at, a.prompt_tokens, a.max_tokens)
        if self.record:
            new.token_times = []
        self.by_id[a.id] = new
        self.timelines.append(new)
        self._arrive(a)

    def _arrive(self, a: Arrival) -> None:
        t = a.at
        if a.prompt_tokens + a.max_tokens > self.max_model_len or a.prompt_tokens < 1 or a.max_tokens < 1:
            tl = self.by_id[a.id]
            tl.outcome = Outcome.CLIENT_ERROR
            tl.reject_reason = "context_length"
            tl.finished_at = t
            if self.follow_up is not None:
                self._follow(tl, t)
            return
        front = self.front
        if front is None:
            self._dispatch(a, t)
            return
        bound_at = t + a.wait_bound_s
        reject = front.push(Pending(a.id, a.cls, a.rank, a.prompt_tokens + a.max_tokens, t, bound_at), t)
        if reject is not None:
            tl = self.by_id[a.id]
            tl.outcome = Outcome.REJECTED
            tl.reject_reason = reject.reason
            tl.finished_at = t
            if self.follow_up is not None:
                self._follow(tl, t)
            return
        self.waiting[a.id] = a
        self._pump(t)

    def _pump(self, t: float) -> None:
        front = self.front
        assert front is not None
        while True:
            while self.inflight < self.limit and len(front):
                p = front.pop(t)
                if p is None:
                    break
                self._dispatch(self.waiting.pop(p.id), t)
            # Whatever is still queued found no slot: maybe a preemption makes one.
            if (self.preemption is None or self.in_step or not self.live or not len(front)
                    or not self._preempt(t)):
                return

    def _preempt(self, t: float) -> bool:
        front = self.pfront
        policy = self.preemption
        assert front is not None and policy is not None
        head = front.head(t)
        if head is None:
            return False
        engine = self.engine
        fits_cls = self.preempt_fits

        def fits(c: Candidate) -> bool:
            if fits_cls is not None and not fits_cls(head, c.cls):
                return False
            return not front.guaranteed(c.cls)

        cands = []
        for rid, lv in self.live.items():
            if not lv.running:
                continue
            a = lv.arrival
            done = lv.base_tokens + engine.output_tokens(rid)
            cands.append(Candidate(rid, a.cls, a.rank, "engine", a.max_tokens - done, lv.suspensions, lv.started_at))
        victim = policy.victim(head, cands, t, fits)
        if victim is None:
            return False
        lv = self.live[victim.id]
        lv.base_tokens += engine.output_tokens(victim.id)
        lv.suspensions += 1
        lv.running = False
        engine.abort(victim.id, t)
        self.inflight -= 1
        self.by_id[victim.id].suspensions += 1
        a = lv.arrival
        front.requeue(Pending(a.id, a.cls, a.rank, a.prompt_tokens + a.max_tokens, a.at, t + a.wait_bound_s), t)
        self.waiting[a.id] = a
        p = front.take(head.id, t)
        self._dispatch(self.waiting.pop(p.id), t)
        return True

    def _expire(self) -> None:
        front = self.front
        assert front is not None
        t = self.clock.now()
        for p in front.expire(t):
            self.waiting.pop(p.id, None)
            tl = self.by_id[p.id]
            tl.outcome = Outcome.REJECTED
            tl.reject_reason = "queue_timeout"
            tl.finished_at = t

    def _dispatch(self, a: Arrival, t: float) -> None:
        tl = self.by_id[a.id]
        self.inflight += 1
        kv_key = None
        if self.preemption is not None and a.cls in self.preemptible:
            lv = self.live.get(a.id)
            if lv is None:
                lv = self.live[a.id] = _Live(a, self.kv_keys)
                self.kv_keys += 1
            lv.started_at = t
            lv.running = True
            kv_key = lv.kv_key
            if lv.base_tokens:  # resumed: the continuation of what it generated so far
                self.engine.add(SimRequest(a.id, a.prompt_tokens + lv.base_tokens, a.max_tokens - lv.base_tokens,
                                           a.priority, a.block_hashes, kv_key), t)
                return
        if tl.dispatched_at is None:
            tl.dispatched_at = t
        self.engine.add(SimRequest(a.id, a.prompt_tokens, a.max_tokens, a.priority, a.block_hashes, kv_key), t)
