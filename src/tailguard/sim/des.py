"""The discrete-event driver of the engine model: timed requests in, one `Timeline` per request
out, on a `VirtualClock` (no sleeping, no I/O).

Optionally the gateway's front (`tailguard.front.front.Front`, the very object `tailguard serve`
drives) stands in front of the engines: arrivals go into it, and its decisions are carried out on
the engine models: `Start(id, backend)` adds a request to that backend's engine, `Suspend` aborts
it there (slot and KV freed at once; its blocks stay in the prefix cache), `Reject` ends it. A
request started again after it generated tokens (a suspended one, or one the front continues
after its backend failed) re-enters an engine as its continuation: prompt = original prompt +
tokens generated so far, max_tokens = what is left, with the same `kv_key`, so the engine's prefix
cache finds what its first run left.

Behind the front stands one engine (`run`) or a fleet (`run_fleet`): several `Host`s, each with
its own engine (preset, speed, prefix cache), the models it serves and its faults, named as the
front names its backends. A host that dies (`dies_at`, a SIGKILL) fails the requests it holds
(`Failed(disconnect, delivered=<tokens already produced>)`) and refuses every later one
(`Failed(connect)`) until it is back (`revives_at`); a hung host (`Faults(fault="hang")`, accepts and
never answers) fails each request at the response-header deadline (`header_timeout_s`); one with
an error rate fails that share with a 500 (`Failed(status)`). The front decides what follows (a
`Start` elsewhere, or nothing: the request ends with `Finished(UPSTREAM_ERROR)`); a request for a
model its host does not serve ends as vLLM answers it, a 404 (`model_not_found`). With `probes`,
each host's health page is probed as the gateway probes it (`Probed` to the front: a dead host
refuses at once, one that hangs on everything times out).

A `Gate` (the gateway's intake, as `sweep/virtual.py` applies it) may stand before the front: it
classifies, caps or refuses each request, and sizes its job, at the instant the request arrives,
and learns from each one that ends well, as the gateway's intake and output estimate do.

`scaling` adds engines while the run goes, as an autoscaler that follows the gateway's capacity
signal (`front.capacity`, `tailguard_capacity_needed`) would: it reads the signal every
`interval_s`, asks for the engines missing, and each joins the front (`Reconfigure`, as a reload
adds a backend) `provision_s` after it was asked for.

`follow_up` turns the run into a closed loop: each request's end may send the next ones (a
program's next step may send several calls at once), at once or later (a client refused with a `Retry-After` waits at least that long before it tries again).

Time runs like the HTTP server's: a step starting at t ends at t + duration; requests arriving
meanwhile join the engine's waiting queue at their arrival instant and are considered from the
next step; tokens and finishes take effect at the step's end. Every engine steps on its own. An
engine cannot abort a request mid-step, so the front preempts only at a step's end or while every
engine is idle (`preempt=False` otherwise); a victim whose own engine is mid-step then loses that
step's work for it (its token of that step is not delivered), as a real engine drops what an
aborted request's last step computed.

This module holds the entry points and the loop that advances the clock (`Driver`); the run's
state and its requests' side are `sim.carrier`'s, what happens to the hosts `sim.fleet`'s, what
falls due `sim.agenda`'s, and what it keeps of each host and request `sim.live`'s.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Iterable

from tailguard.clock import VirtualClock
from tailguard.front.events import FirstContent, Generated, Served, Tick
from tailguard.front.front import Front
from tailguard.sim.agenda import SCALE, STEP_END, HeaderDeadline, StepEnd
from tailguard.sim.engine import Admitted, Engine, FirstToken, Preempted, RequestFinished, Step
from tailguard.sim.fault import Faults
from tailguard.sim.fleet import Fleet
from tailguard.sim.live import Autoscaler, LiveHost
from tailguard.sim.scenario import Arrival, FollowUp, Gate, Host, Probing, Scaling, Tap, Timeline

DEFAULT_HEADER_TIMEOUT_S = 5.0


def run(
    engine: Engine,
    arrivals: Iterable[Arrival],
    clock: VirtualClock,
    front: Front | None = None,
    *,
    record_tokens: bool = False,
    follow_up: FollowUp | None = None,
    gate: Gate | None = None,
    watch: Callable[[float, Front], None] | None = None,
    tap: Tap | None = None,
) -> list[Timeline]:
    """Run every arrival through one engine to its end; Timelines come back in the order the
    arrivals were given (then those of follow-ups, in the order they were sent).

    Without `front`, each request enters the engine at its arrival. With it, the front decides
    when each goes in (and may suspend and reject); it must have exactly one backend, this
    engine. `follow_up(timeline, now)` is called when a request ends and may return the next
    arrival (at `now`). `gate` decides what each arrival asks of the front, as it arrives.
    `watch(now, front)` is called after every event the run handles (a cap's history, say);
    `tap(event, now, preempt, decisions)` is told each event the front is handed and what it
    decided, as the gateway's recorder is (`tailguard serve --record`).
    """
    if front is not None and len(front.params.backends) != 1:
        raise ValueError("the discrete-event run of one engine drives a front with exactly one backend; "
                         "give a fleet of hosts to run_fleet for more")
    name = front.params.backends[0].name if front is not None else "engine"
    return run_fleet([Host(name, engine)], arrivals, clock, front, record_tokens=record_tokens,
                     follow_up=follow_up, gate=gate, watch=watch, tap=tap)


def run_fleet(
    hosts: Sequence[Host],
    arrivals: Iterable[Arrival],
    clock: VirtualClock,
    front: Front | None = None,
    *,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    probes: Probing | None = None,
    record_tokens: bool = False,
    follow_up: FollowUp | None = None,
    gate: Gate | None = None,
    scaling: Scaling | None = None,
    watch: Callable[[float, Front], None] | None = None,
    tap: Tap | None = None,
) -> list[Timeline]:
    """`run` over a fleet: the front's `Start(id, backend)` picks the host; its backends must be
    exactly the hosts' names. `header_timeout_s` is the gateway's response-header deadline, after
    which a request at a hung host fails; `probes` adds the gateway's health probes; `scaling`
    adds hosts as the capacity signal asks. Without a front there must be one host that never
    fails."""
    _check_fleet(hosts, front, header_timeout_s, probes, scaling)
    given = list(arrivals)
    timelines, by_id = _timelines(given, record_tokens)
    # Every arrival, given or sent later by `follow_up`, in one heap; the index keeps the given
    # order among arrivals at the same instant.
    pending = [(a.at, i, a) for i, a in enumerate(given)]
    heapq.heapify(pending)
    if pending and pending[0][0] < clock.now():
        first = pending[0][2]
        raise ValueError(f"arrival {first.id!r} at {first.at} is before the clock ({clock.now()})")
    r = Driver(hosts, clock, front, by_id, pending, record_tokens, header_timeout_s, probes)
    r.follow_up, r.timelines, r.gate = follow_up, timelines, gate
    if (watch is not None or tap is not None) and front is None:
        raise ValueError("watch and tap read the front: they need one")
    r.watch, r.tap = watch, tap
    if scaling is not None:
        r.scaler = Autoscaler(scaling, len(hosts))
        r.agenda.schedule(clock.now() + scaling.interval_s, SCALE, r.scaler)
    r.loop()
    return timelines


def _check_fleet(hosts: Sequence[Host], front: Front | None, header_timeout_s: float, probes: Probing | None,
                 scaling: Scaling | None) -> None:
    """What `run_fleet` refuses before it starts: a fleet the front does not name, a host that
    fails with nobody in front to route around it, a fault not modeled on virtual time."""
    if scaling is not None and front is None:
        raise ValueError("scaling follows the front's capacity signal: it needs a front")
    names = [h.name for h in hosts]
    if not hosts or len(set(names)) != len(names):
        raise ValueError(f"a fleet needs hosts with distinct names, got {names}")
    if front is None:
        if len(hosts) != 1 or hosts[0].dies_at is not None or hosts[0].faults != Faults() or probes is not None:
            raise ValueError("without a front, a run drives one host that never fails (nobody would route or retry)")
    else:
        served = sorted(b.name for b in front.params.backends)
        if served != sorted(names):
            raise ValueError(f"the front's backends {served} must be the fleet's hosts {sorted(names)}")
    if header_timeout_s <= 0:
        raise ValueError(f"header_timeout_s must be > 0, got {header_timeout_s}")
    stalled = [h.name for h in hosts if h.faults.fault == "stall"]
    if stalled:
        raise ValueError(f"hosts {stalled} stall: not modeled on virtual time (it has no idle deadline per request)")


def _timelines(given: Sequence[Arrival], record_tokens: bool) -> tuple[list[Timeline], dict[str, Timeline]]:
    """A timeline per given arrival, in their order, and by id (an id given twice is refused)."""
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
    return timelines, by_id


class Driver(Fleet):
    """The loop of one run: what happens next, in time order, and each engine's steps."""

    def loop(self) -> None:
        """Until nothing is pending, take the next thing that happens: a front wake-up, an
        arrival, a step's end, a header deadline, a host's death or revival, a probe. Once
        everything at an instant is done, each idle engine with work starts a step there. At one
        instant a wake-up goes first while every engine is idle, and after the arrivals otherwise
        (a request arriving as its queue bound passes is still counted), and both before a step's
        end."""
        pending, agenda, front, clock, watch = self.pending, self.agenda.heap, self.front, self.clock, self.watch
        inf, heappop = math.inf, heapq.heappop
        self._tell_served()
        while True:
            # The hot loop: locals and plain comparisons (a DES run takes millions of turns).
            now = clock.now()
            t = t_arr = pending[0][0] if pending else inf
            t_wake = inf
            if front is not None:
                wake = front.next_wakeup()
                if wake is not None:
                    t_wake = wake if wake > now else now
                    if t_wake < t:
                        t = t_wake
            if agenda and agenda[0][0] < t:
                t = agenda[0][0]
            if t > now and self.stepping < self.alive and self._begin_steps(now):
                continue
            if t == inf:
                if front is not None and len(front):
                    raise RuntimeError("requests are stuck in the front with every engine idle")
                return
            clock.advance_to(t)
            if watch is not None:  # what the last event left
                watch(t, front)  # type: ignore[arg-type]
            if t_wake == t and (not self.stepping or t_arr > t):
                self._tick()
            elif t_arr == t:
                self._arrive(heappop(pending)[2])
            elif self._due(t):
                return

    def _due(self, t: float) -> bool:
        """The agenda's first entry falls due at `t`: True when the run is over (all that was
        left is what happens to hosts whatever their requests do)."""
        _, order, _, what = heapq.heappop(self.agenda.heap)
        if isinstance(what, StepEnd):
            if what.host.step is what.step:  # not a step its host's death discarded
                self._step_ended(what.host, what.step, t)
        elif isinstance(what, HeaderDeadline):
            self._header_deadline(what.req_id, what.attempt)
        elif isinstance(what, (Autoscaler, Host)):
            self._scale(what, t)
        elif self._all_done():
            return True
        else:
            self._host_due(order, what, t)
        return False

    def _begin_steps(self, now: float) -> bool:
        """Each live engine that is idle and has work starts a step at `now`. False if none did."""
        began = False
        for h in self.hosts.values():
            if h.step is not None or h.dead or h.engine.idle():
                continue
            step = h.engine.step(now)
            if step.duration_s == 0.0 and not step.events:
                raise RuntimeError(f"the engine of {h.name!r} made no progress while busy")
            h.step = step
            self.stepping += 1
            self.agenda.schedule(now + step.duration_s, STEP_END, StepEnd(h, step))
            began = True
        return began

    def _step_ended(self, h: LiveHost, step: Step, end: float) -> None:
        """`h`'s step ended at `end`: its tokens' times, its events on each request's timeline
        (but those of requests aborted mid-step), and what the front can start now (preemption
        included)."""
        h.step = None
        cut = h.cut
        if cut:
            h.cut = set()
        if self.record:
            self._token_times(step, cut, end)
        self._took_effect(h, step, cut, end)
        # Counted as stepping until every event of the step is told, so a request started
        # meanwhile (`Opened`) preempts nothing: a victim's own end may be among those events.
        self.stepping -= 1
        front = self.front
        if front is not None and len(front):
            self._tell_progress(end)
            self._apply(self.tell(Tick(), end))

    def _token_times(self, step: Step, cut: set[str], end: float) -> None:
        """Each token the step delivered came at its end."""
        by_id = self.by_id
        for rid in step.emitted:
            if cut and rid in cut:
                continue
            times = by_id[rid].token_times
            assert times is not None
            times.append(end)

    def _took_effect(self, h: LiveHost, step: Step, cut: set[str], end: float) -> None:
        """The step's events on each request's timeline, but those of requests aborted mid-step:
        ends, first tokens (a TTFT sample for the front), admissions, preemptions."""
        by_id, front = self.by_id, self.front
        for ev in step.events:
            if cut and ev.req_id in cut:
                continue
            tl = by_id[ev.req_id]
            if isinstance(ev, RequestFinished):
                self._finished(tl, ev, end)
            elif isinstance(ev, FirstToken):
                if tl.first_token_at is None:
                    tl.first_token_at = end
                    if front is not None and front.wants_first_content(tl.cls, h.name):  # a TTFT sample; a race won
                        self._apply(self.tell(FirstContent(ev.req_id, h.name), end, preempt=False))
            elif isinstance(ev, Admitted):
                if not ev.resumed and tl.admitted_at is None:
                    tl.admitted_at = step.started_at
                    tl.cached_tokens = ev.cached_tokens
            elif isinstance(ev, Preempted):
                tl.preemptions += 1

    def _tell_progress(self, now: float) -> None:
        """What the front weighs in a preemption: the tokens each running preemptible request
        has generated. Told at a step's end, only while requests wait (a preemption is weighed
        then only; decisions during a step never preempt), so the front's counts are current at
        every moment it may preempt."""
        front, waiting = self.front, self.waiting
        assert front is not None
        for rid, lv in self.tracked.items():
            if rid not in waiting and lv.host is not None:
                self.tell(Generated(rid, lv.base_tokens + lv.host.engine.output_tokens(rid)), now)

    def _tell_served(self) -> None:
        """The models each host lists, as the gateway's first probes read them."""
        front = self.front
        for h in self.hosts.values():
            if front is not None and h.models:
                self._apply(self.tell(Served(h.name, tuple(sorted(h.models))), self.clock.now()))

    def _tick(self) -> None:
        assert self.front is not None
        self._apply(self.tell(Tick(), self.clock.now(), preempt=not self.stepping))

