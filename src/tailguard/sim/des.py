"""The discrete-event driver of the engine model: timed requests in, one `Timeline` per request
out, on a `VirtualClock` (no sleeping, no I/O).

Optionally the gateway's front (`tailguard.front.front.Front`, the very object `tailguard serve`
drives) stands in front of the engine: arrivals go into it, and its decisions are carried out on
the engine model: `Start` adds a request to the engine, `Suspend` aborts it there (slot and KV
freed at once; its blocks stay in the prefix cache), `Reject` ends it. A suspended request
started again re-enters the engine as its continuation: prompt = original prompt + tokens
generated so far, max_tokens = what is left, with the same `kv_key`, so the engine's prefix cache
finds what its first run left. The front's backend is this one engine.

A `Gate` (the gateway's intake, as `sweep/virtual.py` applies it) may stand before the front: it
classifies, caps or refuses each request, and sizes its job, at the instant the request arrives,
and learns from each one that ends well, as the gateway's intake and output estimate do.

`follow_up` turns the run into a closed loop: each request's end may send the next one, at once
or later (a client refused with a `Retry-After` waits at least that long before it tries again).

Time runs like the HTTP server's: a step starting at t ends at t + duration; requests arriving
meanwhile join the engine's waiting queue at their arrival instant and are considered from the
next step; tokens and finishes take effect at the step's end. The engine cannot abort a request
mid-step, so decisions made during a step never preempt (`preempt=False`); the front is asked
again at the step's end.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Iterable, Protocol

from tailguard.clock import VirtualClock
from tailguard.front.events import Arrive, Decision, Finished, Generated, Opened, Reject, Start, Suspend, Tick
from tailguard.front.front import Front
from tailguard.front.intake import Accepted
from tailguard.sim.engine import Admitted, Engine, FirstToken, Preempted, RequestFinished, SimRequest, Step
from tailguard.types import Outcome


@dataclass(slots=True, frozen=True)
class Arrival:
    """A timed request. `cls` matters only with a front (whose class table gives its rank and
    queue bound); `priority` is vLLM's (lower first, with the engine's "priority" policy);
    `max_tokens` is what the engine may generate for it. `accepted` is what the gateway's intake
    made of it (`tailguard.front.intake`: the front's job size, the limit it was sent with, whether
    it can be continued); `refused` the code of the 400 it got instead."""

    id: str
    at: float
    prompt_tokens: int
    max_tokens: int
    cls: str = "interactive"
    priority: int = 0
    block_hashes: tuple[int, ...] = ()  # prefix-cache keys of the prompt's leading blocks (sim.kv)
    caller: str | None = None  # whose request (the front's limits per caller), as an API key names it
    accepted: Accepted | None = None
    refused: str | None = None

    @property
    def resumable(self) -> bool:
        return self.accepted is None or self.accepted.resumable

    def arrive(self) -> Arrive:
        """What the front is told: the request as the intake accepted it or, made by hand, sized
        by its own `max_tokens` (a plain text generation)."""
        acc = self.accepted
        if acc is None:
            return Arrive(self.id, self.cls, self.prompt_tokens + self.max_tokens, True, self.max_tokens, self.caller)
        return Arrive(self.id, self.cls, acc.est_tokens, acc.resumable, acc.max_tokens, self.caller)


class Gate(Protocol):
    """What stands before the front: the gateway's intake as a run's driver applies it."""

    def admit(self, a: Arrival) -> Arrival:
        """`a` as the front gets it, decided as it arrives (class, limits, size; or `refused`)."""
        ...

    def finished(self, tl: Timeline) -> None:
        """`tl`'s request ended well (its output tokens are known)."""
        ...


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
    reject_reason: str | None = None  # a RejectReason (refused by the front), or a 400 code (the intake, the engine)
    retry_after_s: float | None = None  # what a refusal told the client (a follow-up comes no sooner)
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
    front: Front | None = None,
    *,
    record_tokens: bool = False,
    follow_up: Callable[[Timeline, float], Arrival | None] | None = None,
    gate: Gate | None = None,
) -> list[Timeline]:
    """Run every arrival to its end; Timelines come back in the order the arrivals were given
    (then those of follow-ups, in the order they were sent).

    Without `front`, each request enters the engine at its arrival. With it, the front decides
    when each goes in (and may suspend and reject); it must have exactly one backend, this
    engine. `follow_up(timeline, now)` is called when a request ends and may return the next
    arrival (at `now`). `gate` decides what each arrival asks of the front, as it arrives.
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
    # Every arrival, given or sent later by `follow_up`, in one heap; the index keeps the given
    # order among arrivals at the same instant.
    pending = [(a.at, i, a) for i, a in enumerate(given)]
    heapq.heapify(pending)
    if pending and pending[0][0] < clock.now():
        first = pending[0][2]
        raise ValueError(f"arrival {first.id!r} at {first.at} is before the clock ({clock.now()})")
    if front is not None and len(front.params.backends) != 1:
        raise ValueError("the discrete-event run drives a front with exactly one backend (its engine)")
    r = _Run(engine, clock, front, by_id, pending, record_tokens)
    r.follow_up, r.timelines, r.gate = follow_up, timelines, gate
    r.loop()
    return timelines


class _Live:
    """A front-dispatched preemptible request while it is in the engine or suspended."""

    __slots__ = ("arrival", "kv_key", "base_tokens")

    def __init__(self, arrival: Arrival, kv_key: int) -> None:
        self.arrival = arrival
        self.kv_key = kv_key  # the engine's name for its content: each run finds what the last left cached
        self.base_tokens = 0  # generated in earlier runs


class _Run:
    """One run's state; a class so the hot loop reads locals, not closures."""

    def __init__(
        self, engine: Engine, clock: VirtualClock, front: Front | None,
        by_id: dict[str, Timeline], pending: list[tuple[float, int, Arrival]], record: bool,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.front = front
        self.by_id = by_id
        self.pending = pending  # arrivals to come: a heap of (at, sequence, arrival)
        self.record = record
        self.waiting: dict[str, Arrival] = {}  # in the front, waiting for a Start
        self.max_model_len = engine.config.max_model_len
        self.in_step = False
        self.live: dict[str, _Live] = {}  # preemptible requests dispatched and not finished
        self.kv_keys = 0  # the next kv_key to give a preemptible request
        self.follow_up: Callable[[Timeline, float], Arrival | None] | None = None
        self.gate: Gate | None = None
        self.timelines: list[Timeline] = []

    def _tell_progress(self, now: float) -> None:
        """What the front weighs in a preemption: the tokens each running preemptible request
        has generated. Told at a step's end, only while requests wait (a preemption is weighed
        then only; decisions during a step never preempt), so the front's counts are current at
        every moment it may preempt."""
        front, engine, waiting = self.front, self.engine, self.waiting
        assert front is not None
        for rid, lv in self.live.items():
            if rid not in waiting:
                front.handle(Generated(rid, lv.base_tokens + engine.output_tokens(rid)), now)

    def loop(self) -> None:
        """Run until nothing is pending: idle turns jump to the next arrival or front wake-up,
        busy turns run one engine step with what arrives during it, then the step's outcome."""
        engine = self.engine
        while True:
            if engine.idle():
                if not self._idle_turn():
                    return
                continue
            now = self.clock.now()
            step = engine.step(now)
            end = now + step.duration_s
            if step.duration_s == 0.0 and not step.events:
                raise RuntimeError("the engine made no progress while busy")
            self._during_step(end)
            self._step_ended(step, now, end)

    def _idle_turn(self) -> bool:
        """The engine is idle: go to the next arrivals (all at that instant) or the front's next
        wake-up, whichever is first. False when there is nothing left."""
        pending, front, clock = self.pending, self.front, self.clock
        next_at = pending[0][0] if pending else math.inf
        wake = front.next_wakeup() if front is not None else None
        if wake is not None and wake <= next_at:
            clock.advance_to(max(wake, clock.now()))
            self._tick()
            return True
        if next_at == math.inf:
            if front is not None and len(front):
                raise RuntimeError("requests are stuck in the front with the engine idle")
            return False
        clock.advance_to(next_at)
        while pending and pending[0][0] <= next_at:  # everyone arriving at this instant
            self._arrive(heapq.heappop(pending)[2])
        return True

    def _during_step(self, end: float) -> None:
        """Arrivals (and front-queue expiries) during a step that ends at `end`, in time order.
        The step's outcome is fixed already, so preemptions wait for its end (at most one step
        late)."""
        pending, front, clock = self.pending, self.front, self.clock
        self.in_step = True
        while True:
            next_at = pending[0][0] if pending else math.inf
            if front is not None:
                wake = front.next_wakeup()
                if wake is not None and wake < next_at and wake <= end:
                    clock.advance_to(max(wake, clock.now()))
                    self._tick()
                    continue
            if next_at > end:
                break
            clock.advance_to(next_at)
            self._arrive(heapq.heappop(pending)[2])
        clock.advance_to(end)
        self.in_step = False

    def _step_ended(self, step: Step, now: float, end: float) -> None:
        """A step that began at `now` ended at `end`: its tokens' times, its events on each
        request's timeline, and what the front can start now (preemption included)."""
        by_id, front = self.by_id, self.front
        if self.record:
            for rid in step.emitted:
                times = by_id[rid].token_times
                assert times is not None
                times.append(end)
        for ev in step.events:
            tl = by_id[ev.req_id]
            if isinstance(ev, RequestFinished):
                self._finished(tl, ev, end)
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
            self._tell_progress(end)
            self._apply(front.handle(Tick(), end))

    # --- helpers ---------------------------------------------------------------------------

    def _finished(self, tl: Timeline, ev: RequestFinished, end: float) -> None:
        tl.finished_at = end
        tl.output_tokens = ev.output_tokens
        tl.finish_reason = ev.finish_reason
        tl.outcome = Outcome.SUCCESS
        if self.live:
            lv = self.live.pop(ev.req_id, None)
            if lv is not None:
                tl.output_tokens += lv.base_tokens
        if self.front is not None:
            self._apply(self.front.handle(Finished(ev.req_id, Outcome.SUCCESS, tl.prompt_tokens + tl.output_tokens), end))
        if self.gate is not None:
            self.gate.finished(tl)
        if self.follow_up is not None:
            self._follow(tl, end)

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
        if a.at > t or tl.outcome is Outcome.CLIENT_ERROR:
            # after every given index; one refused at once comes through the heap, so a client
            # refused over and over (a class the gateway does not know) loops instead of recursing
            heapq.heappush(self.pending, (a.at, len(self.by_id), a))
        elif tl.outcome is Outcome.REJECTED:
            raise ValueError(f"the follow-up of refused request {tl.id!r} comes at the same instant: a client "
                             f"must wait before retrying (it was told Retry-After {tl.retry_after_s} s)")
        else:
            self._arrive(a)

    def _end(self, tl: Timeline, outcome: Outcome, reason: str, t: float, retry_after_s: float | None = None) -> None:
        tl.outcome, tl.reject_reason, tl.finished_at, tl.retry_after_s = outcome, reason, t, retry_after_s
        if self.follow_up is not None:
            self._follow(tl, t)

    def _arrive(self, a: Arrival) -> None:
        t = a.at
        tl = self.by_id[a.id]
        if self.gate is not None:
            a = self.gate.admit(a)
            tl.cls, tl.max_tokens = a.cls, a.max_tokens
        if a.refused is not None:
            self._end(tl, Outcome.CLIENT_ERROR, a.refused, t)
            return
        if a.prompt_tokens + a.max_tokens > self.max_model_len or a.prompt_tokens < 1 or a.max_tokens < 1:
            self._end(tl, Outcome.CLIENT_ERROR, "context_length", t)
            return
        front = self.front
        if front is None:
            self._dispatch(a, t)
            return
        self.waiting[a.id] = a
        self._apply(front.handle(a.arrive(), t, preempt=not self.in_step))

    def _tick(self) -> None:
        assert self.front is not None
        self._apply(self.front.handle(Tick(), self.clock.now(), preempt=not self.in_step))

    def _apply(self, decisions: Sequence[Decision]) -> None:
        """Carry out the front's decisions (and those they lead to) on the engine model."""
        if not decisions:
            return
        front = self.front
        assert front is not None
        todo: deque[Decision] = deque(decisions)
        t = self.clock.now()
        while todo:
            d = todo.popleft()
            if isinstance(d, Start):
                a = self.waiting.pop(d.id)
                self._dispatch(a, t)
                if d.id in self.live:
                    todo.extend(front.handle(Opened(d.id), t, preempt=not self.in_step))
            elif isinstance(d, Suspend):
                self._suspend(d.id, t)
            elif isinstance(d, Reject):
                self.waiting.pop(d.id, None)
                self.live.pop(d.id, None)
                self._end(self.by_id[d.id], Outcome.REJECTED, d.reason, t, d.retry_after_s)

    def _suspend(self, req_id: str, t: float) -> None:
        lv = self.live[req_id]
        lv.base_tokens += self.engine.output_tokens(req_id)
        self.engine.abort(req_id, t)
        self.by_id[req_id].suspensions += 1
        self.waiting[req_id] = lv.arrival

    def _dispatch(self, a: Arrival, t: float) -> None:
        tl = self.by_id[a.id]
        kv_key = None
        front = self.front
        if front is not None and front.tracks(a.cls, a.resumable):
            lv = self.live.get(a.id)
            if lv is None:
                lv = self.live[a.id] = _Live(a, self.kv_keys)
                self.kv_keys += 1
            kv_key = lv.kv_key
            if lv.base_tokens:  # resumed: the continuation of what it generated so far
                self.engine.add(SimRequest(a.id, a.prompt_tokens + lv.base_tokens, a.max_tokens - lv.base_tokens,
                                           a.priority, a.block_hashes, kv_key), t)
                return
        if tl.dispatched_at is None:
            tl.dispatched_at = t
        self.engine.add(SimRequest(a.id, a.prompt_tokens, a.max_tokens, a.priority, a.block_hashes, kv_key), t)
