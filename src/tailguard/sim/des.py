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
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Iterable

from tailguard.clock import VirtualClock
from tailguard.front.events import (
    Decision, Drop, Ejected, Event, Failed, Finished, FirstContent, Generated, GiveUp, HealthChanged, Loaded,
    Opened, Probed, Readmitted, Reconfigure, Reject, Retired, Served, Start, StartMode, Suspend, Tick, Wait,
)
from tailguard.front.capacity import Capacity
from tailguard.front.counts import COUNTED_DECISIONS
from tailguard.front.front import Front
from tailguard.front.samples import sample
from tailguard.sim.engine import Admitted, Engine, FirstToken, Preempted, RequestFinished, SimRequest, Step
from tailguard.sim.fault import ErrorSpread, Faults
from tailguard.sim.scenario import Arrival, Gate, Host, Probing, Scaled, Scaling, Timeline
from tailguard.types import FailureKind, Outcome

# Told each event the front was handed, at what instant, whether it could preempt, and what it
# decided: what the gateway's recorder writes (`gateway.ops.recorder.Recorder.event`).
Tap = Callable[[Event, float, bool, Sequence[Decision]], None]
# Told each request's end and its instant: the next arrival (or several, or none) it sends.
FollowUp = Callable[[Timeline, float], Arrival | Sequence[Arrival] | None]

# What the DES does with each decision (`_apply`): all of them, but those that say something of a
# backend to the gateway's probes, gauges and logs, which a simulated fleet has none of. The
# decisions about a request are counted on its timeline (`front.counts.COUNTED_DECISIONS`).
CARRIED: dict[type, str] = {Start: "_carry_start", Suspend: "_suspend", Drop: "_drop", GiveUp: "_give_up",
                            Reject: "_carry_reject"}
NOT_APPLICABLE: dict[type, str] = {
    Wait: "the request stays in `waiting` (set as it failed) until its next Start",
    HealthChanged: "health is the front's; the DES has no probe loop or gauge to move",
    Ejected: "ejection is the front's; the DES has no log or gauge to tell",
    Readmitted: "ejection is the front's; the DES has no log or gauge to tell",
    Retired: "a host a scaling run adds never leaves, so none retires",
}

# How a request at a hung host fails: no response head by the gateway's deadline (its
# `timeouts.header_s`), which the front reads as a hung server.
HUNG = FailureKind.TIMEOUT_HEADER
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
    r = _Driver(hosts, clock, front, by_id, pending, record_tokens, header_timeout_s, probes)
    r.follow_up, r.timelines, r.gate = follow_up, timelines, gate
    if (watch is not None or tap is not None) and front is None:
        raise ValueError("watch and tap read the front: they need one")
    r.watch, r.tap = watch, tap
    if scaling is not None:
        r.scaler = _Scaler(scaling, len(hosts))
        r._schedule(clock.now() + scaling.interval_s, _SCALE, r.scaler)
    r.loop()
    return timelines


class _Host:
    """A host while the run goes: its engine, the step in flight, whether it is dead."""

    __slots__ = ("name", "engine", "models", "faults", "errors", "dead", "step", "cut")

    def __init__(self, h: Host) -> None:
        self.name = h.name
        self.engine = h.engine
        self.models = frozenset(h.models)
        self.faults = h.faults
        self.errors = ErrorSpread(h.faults)
        self.dead = False
        self.step: Step | None = None  # in flight until its end is popped from the agenda
        self.cut: set[str] = set()  # aborted mid-step: the step in flight delivers nothing to them

    def produced(self, req_id: str) -> int:
        """Tokens `req_id` has received from this engine: its count there, less the token of the
        step in flight (not delivered before the step ends; a request that finishes in it has
        left the engine already, and counts from its finish)."""
        n = self.engine.output_tokens(req_id)
        step = self.step
        if step is not None and req_id in step.emitted:
            if n == 0:
                n = next(ev.output_tokens for ev in step.events
                         if isinstance(ev, RequestFinished) and ev.req_id == req_id)
            n -= 1
        return n


class _Live:
    """A front-dispatched request from its first `Start` to its end: where it runs (and, while
    hedged, where its second attempt runs) and what earlier runs generated."""

    __slots__ = ("arrival", "kv_key", "base_tokens", "host", "attempt", "hedge", "hedge_attempt", "tries")

    def __init__(self, arrival: Arrival, kv_key: int | None) -> None:
        self.arrival = arrival
        # The engine's name for its content (preemptible requests only): each run finds what the
        # last left cached.
        self.kv_key = kv_key
        self.base_tokens = 0  # generated in earlier runs (suspended, or failed after producing)
        self.host: _Host | None = None  # None while queued again (suspended, or being retried)
        self.hedge: _Host | None = None  # its second attempt's, while hedged
        # Attempts are numbered (`tries` so far), so a header deadline of one that ended finds
        # the request moved on.
        self.attempt = self.hedge_attempt = self.tries = 0

    def promote_hedge(self) -> None:
        """The first attempt is gone: the hedge is the request's attempt from now on."""
        self.host, self.attempt, self.hedge = self.hedge, self.hedge_attempt, None


@dataclass(slots=True, frozen=True)
class _StepEnd:
    host: _Host
    step: Step


@dataclass(slots=True, frozen=True)
class _HeaderDeadline:
    req_id: str
    attempt: int


# What falls due, in the order of things at the same instant (after arrivals and wake-ups): a
# probe sent as a host dies finds it dead. The last four happen to a host whatever its requests
# do, and a run with only those left is over.
_STEP_END, _HEADER_DEADLINE, _DEATH, _REVIVAL, _PROBE_TIMEOUT, _PROBE = range(6)
_SCALE = 6  # the autoscaler reads the signal (`_Scaler`), or (with a Host) an engine it asked for is up


class _Scaler:
    """The autoscaler's state in a run: the capacity signal, the engines on their way."""

    __slots__ = ("scaling", "capacity", "hosts", "coming")

    def __init__(self, scaling: Scaling, hosts: int) -> None:
        self.scaling = scaling
        self.capacity = Capacity(scaling.window_s)
        self.hosts = hosts  # in the fleet or on their way
        self.coming = 0  # asked for, not up yet


_Due = _StepEnd | _HeaderDeadline | _Host | _Scaler | Host


class _Driver:
    """One run's state; a class so the hot loop reads locals, not closures."""

    def __init__(
        self, hosts: Sequence[Host], clock: VirtualClock, front: Front | None,
        by_id: dict[str, Timeline], pending: list[tuple[float, int, Arrival]], record: bool, header_timeout_s: float,
        probes: Probing | None,
    ) -> None:
        self.hosts = {h.name: _Host(h) for h in hosts}
        self.clock = clock
        self.front = front
        self.by_id = by_id
        self.pending = pending  # arrivals to come: a heap of (at, sequence, arrival)
        self.record = record
        self.header_timeout_s = header_timeout_s
        # Step ends, header deadlines, deaths, revivals and probes: a heap of (at, order, sequence, what).
        self.agenda: list[tuple[float, int, int, _Due]] = []
        self.seq = 0
        self.probes = probes
        for h in hosts:
            host = self.hosts[h.name]
            if h.revives_at is not None and (h.dies_at is None or h.revives_at <= h.dies_at):
                raise ValueError(f"host {h.name!r} revives at {h.revives_at}: only after it dies ({h.dies_at})")
            if h.dies_at is not None:
                self._schedule(h.dies_at, _DEATH, host)
            if h.revives_at is not None:
                self._schedule(h.revives_at, _REVIVAL, host)
            if probes is not None:
                self._schedule(clock.now(), _PROBE, host)
        self.stepping = 0  # hosts with a step in flight
        self.alive = len(hosts)  # hosts not dead: while all of them are stepping, none can begin a step
        self.waiting: dict[str, Arrival] = {}  # in the front, waiting for a Start
        self.max_model_len = max(h.engine.config.max_model_len for h in hosts)
        self.live: dict[str, _Live] = {}  # front-dispatched requests not ended
        self.tracked: dict[str, _Live] = {}  # those of them that may be suspended
        self.kv_keys = 0  # the next kv_key to give a preemptible request
        self.follow_up: FollowUp | None = None
        self.gate: Gate | None = None
        self.timelines: list[Timeline] = []
        self.scaler: _Scaler | None = None
        self.watch: Callable[[float, Front], None] | None = None
        self.tap: Tap | None = None
        self._carry: dict[type, Callable[[Any, float], Sequence[Decision]]] = {
            kind: getattr(self, name) for kind, name in CARRIED.items()}
        # The backends whose cap learns from their requests' latency: told `Observed` as each ends.
        self.adaptive = frozenset(() if front is None else (b.name for b in front.params.backends if b.adaptive))

    def tell(self, event: Event, now: float, preempt: bool = True) -> Sequence[Decision]:
        """Hand the front one event: the one place the run does (and the tap hears it)."""
        front = self.front
        assert front is not None
        decisions = front.handle(event, now, preempt=preempt)
        if self.tap is not None:
            self.tap(event, now, preempt, decisions)
        return decisions

    def _schedule(self, at: float, order: int, what: _Due) -> None:
        heapq.heappush(self.agenda, (at, order, self.seq, what))
        self.seq += 1

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

    def loop(self) -> None:
        """Until nothing is pending, take the next thing that happens: a front wake-up, an
        arrival, a step's end, a header deadline, a host's death or revival, a probe. Once
        everything at an instant is done, each idle engine with work starts a step there. At one
        instant a wake-up goes first while every engine is idle, and after the arrivals otherwise
        (a request arriving as its queue bound passes is still counted), and both before a step's
        end."""
        pending, agenda, front, clock, watch = self.pending, self.agenda, self.front, self.clock, self.watch
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
            else:
                _, order, _, what = heappop(agenda)
                if isinstance(what, _StepEnd):
                    if what.host.step is what.step:  # not a step its host's death discarded
                        self._step_ended(what.host, what.step, t)
                elif isinstance(what, _HeaderDeadline):
                    self._header_deadline(what.req_id, what.attempt)
                elif isinstance(what, (_Scaler, Host)):
                    self._scale(what, t)
                elif self._all_done():
                    return
                else:
                    self._host_due(order, what, t)

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
            self._schedule(now + step.duration_s, _STEP_END, _StepEnd(h, step))
            began = True
        return began

    def _step_ended(self, h: _Host, step: Step, end: float) -> None:
        """`h`'s step ended at `end`: its tokens' times, its events on each request's timeline
        (but those of requests aborted mid-step), and what the front can start now (preemption
        included)."""
        h.step = None
        cut = h.cut
        if cut:
            h.cut = set()
        by_id, front = self.by_id, self.front
        if self.record:
            for rid in step.emitted:
                if cut and rid in cut:
                    continue
                times = by_id[rid].token_times
                assert times is not None
                times.append(end)
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
        # Counted as stepping until every event of the step is told, so a request started
        # meanwhile (`Opened`) preempts nothing: a victim's own end may be among those events.
        self.stepping -= 1
        if front is not None and len(front):
            self._tell_progress(end)
            self._apply(self.tell(Tick(), end))

    # --- scaling ---------------------------------------------------------------------------

    def _scale(self, what: _Scaler | Host, t: float) -> None:
        """The autoscaler reads the signal (and comes back in `interval_s` while work is left),
        or an engine it asked for is up: it joins the front as a reload adds a backend."""
        sc, front = self.scaler, self.front
        assert sc is not None and front is not None
        if isinstance(what, Host):
            sc.coming -= 1
            self._join(what, t)
            return
        if self._all_done():
            return
        self._schedule(t + sc.scaling.interval_s, _SCALE, sc)
        pool = front.params.backends[0].pool
        reading = sc.capacity.measure(front, t).get(pool)
        if reading is None:
            return
        for _ in range(min(reading.needed - reading.ready - sc.coming, sc.scaling.max_hosts - sc.hosts)):
            host = sc.scaling.make(f"scaled{sc.hosts}")
            sc.hosts += 1
            sc.coming += 1
            ready_at = t + sc.scaling.provision_s
            sc.scaling.added.append(Scaled(host.name, t, reading.needed, ready_at))
            self._schedule(ready_at, _SCALE, host)

    def _join(self, host: Host, t: float) -> None:
        front = self.front
        assert front is not None
        if host.name in self.hosts:
            raise ValueError(f"scaling made a host named {host.name!r} twice")
        h = self.hosts[host.name] = _Host(host)
        self.alive += 1
        self.max_model_len = max(self.max_model_len, host.engine.config.max_model_len)
        params = front.params
        spec = replace(params.backends[0], name=host.name)
        self._apply(self.tell(Reconfigure(replace(params, backends=[*params.backends, spec])), t,
                                 preempt=not self.stepping))
        if self.probes is not None:
            self._schedule(t, _PROBE, h)

    def _ended(self, tl: Timeline, t: float) -> None:
        """A request ended: the capacity signal counts it (its service time, if it ran)."""
        if self.scaler is not None:
            service_s = None if tl.dispatched_at is None else t - tl.dispatched_at
            self.scaler.capacity.ended(tl.backend, tl.cls, t, service_s)

    # --- faults ----------------------------------------------------------------------------

    def _all_done(self) -> bool:
        """Nothing is left to arrive, wait or run: deaths and probes no longer matter."""
        front = self.front
        return (not self.pending and not self.live and (front is None or not len(front))
                and all(h.engine.idle() for h in self.hosts.values()))

    def _host_due(self, order: int, h: _Host, t: float) -> None:
        """What happens to `h` whatever its requests do: it dies, revives, or is probed."""
        if order == _DEATH:
            self._die(h)
        elif order == _REVIVAL:
            h.dead = False
            self.alive += 1
        elif order == _PROBE_TIMEOUT:
            self._probed(h, False, t)
        else:
            probes = self.probes
            assert probes is not None
            self._schedule(t + probes.interval_s, _PROBE, h)
            if h.faults.hangs(False, t) and not h.dead:
                self._schedule(t + probes.timeout_s, _PROBE_TIMEOUT, h)
            else:
                self._probed(h, not h.dead, t)

    def _probed(self, h: _Host, ok: bool, t: float) -> None:
        """A probe's answer, with the engine's own count of what it runs and queues (its load
        page, read with the probe) when it answered."""
        front = self.front
        assert front is not None
        self._apply(self.tell(Probed(h.name, ok), t, preempt=not self.stepping))
        if ok:
            e = h.engine
            self._apply(self.tell(Loaded(h.name, e.num_running + e.num_waiting), t, preempt=not self.stepping))

    def _die(self, h: _Host) -> None:
        """`h`'s process died: its step in flight is lost, and what it held fails; a request
        that had its response head (every request an engine took: it answers a stream at once)
        fails as a stream cut short, one at a hung host as a broken connection."""
        t = self.clock.now()
        held = [(rid, lv) for rid, lv in self.live.items() if lv.host is h or lv.hedge is h]
        produced = {rid: h.produced(rid) for rid, _ in held}
        produced_in_engine = {rid for rid, _ in held if h.engine.has(rid)}
        h.dead = True
        self.alive -= 1
        if h.step is not None:
            h.step = None
            self.stepping -= 1
        h.cut.clear()
        h.engine.crash(t)
        for rid, lv in held:
            if lv.host is h or lv.hedge is h:  # not moved by what an earlier failure led to
                # a request with no engine run there was hung: no response head, its connection reset
                hung = rid not in produced_in_engine
                kind = FailureKind.RESET if hung else FailureKind.DISCONNECT
                self._fail(rid, lv, h, kind, not hung, produced[rid], t)

    def _header_deadline(self, rid: str, attempt: int) -> None:
        lv = self.live.get(rid)
        if lv is None:
            return
        for h, n in ((lv.host, lv.attempt), (lv.hedge, lv.hedge_attempt)):
            if h is not None and n == attempt and not h.engine.has(rid):  # still no answer
                self._fail(rid, lv, h, HUNG, False, 0, self.clock.now())

    def _fail(self, rid: str, lv: _Live, h: _Host, kind: FailureKind, answered: bool, produced: int,
              t: float) -> None:
        """The attempt at `h` failed after `produced` tokens; the front decides what follows. Of
        a hedged request, the other attempt goes on (`Drop` of this one); else it goes again
        (`Start`), waits for a backend (`Wait`), or ends here as an upstream error with what it
        had generated (`GiveUp`)."""
        front = self.front
        assert front is not None
        self.by_id[rid].failures += 1
        if lv.hedge is not None:
            self._apply(self.tell(Failed(rid, kind, False, answered, h.name), t, preempt=not self.stepping))
            return
        lv.base_tokens += produced
        lv.host = None
        self.waiting[rid] = lv.arrival
        self._apply(self.tell(Failed(rid, kind, lv.base_tokens > 0, answered), t, preempt=not self.stepping))

    def _give_up(self, d: GiveUp, t: float) -> Sequence[Decision]:
        """The front will not try `d.id` again: it ends as an upstream error (a timeout for a
        deadline) with what it had generated, and the front is told it ended."""
        front = self.front
        assert front is not None
        rid = d.id
        self.waiting.pop(rid, None)
        tl, lv = self.by_id[rid], self.live[rid]
        tl.output_tokens = lv.base_tokens
        self._forget(rid)
        outcome = Outcome.TIMEOUT if d.kind.is_timeout else Outcome.UPSTREAM_ERROR
        self._observe(tl, t, lv.base_tokens)
        self._apply(self.tell(Finished(rid, outcome, tl.prompt_tokens + lv.base_tokens), t))
        self._end(tl, outcome, d.kind.value, t)
        return ()

    def _refuse(self, rid: str, reason: str, t: float) -> None:
        """The engine answered `rid` with a 4xx (a model it does not serve, a context too long
        for it): the request ends as a client error, and its backend is alive."""
        front = self.front
        assert front is not None
        lv = self.live.get(rid)
        if lv is not None and lv.hedge is not None:  # the other attempt stops with it
            for h in (lv.host, lv.hedge):
                if h is not None:
                    self._abort(h, rid, t)
        self._forget(rid)
        self._apply(self.tell(Finished(rid, Outcome.CLIENT_ERROR, 0), t))
        self._end(self.by_id[rid], Outcome.CLIENT_ERROR, reason, t)

    def _forget(self, rid: str) -> None:
        self.live.pop(rid, None)
        self.tracked.pop(rid, None)

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
                self.tracked.pop(ev.req_id, None)
        if self.front is not None:
            # No preemption yet: another request of this step may be told its end next, and must
            # not be suspended first; the step's Tick lets the front preempt once all are in.
            self._observe(tl, end, ev.output_tokens)
            tokens = tl.prompt_tokens + tl.output_tokens
            self._apply(self.tell(Finished(ev.req_id, Outcome.SUCCESS, tokens), end, preempt=False))
        if self.gate is not None:
            self.gate.finished(tl)
        self._ended(tl, end)
        if self.follow_up is not None:
            self._follow(tl, end)

    def _observe(self, tl: Timeline, end: float, chunks: int) -> None:
        """A request on an adaptive backend ended: what it showed of its backend's latency between
        tokens, as the gateway's dispatcher tells it (`front.samples`). Its last token came at
        its end."""
        front = self.front
        assert front is not None
        if tl.backend not in self.adaptive:
            return
        seen = sample(tl.backend, tl.first_token_at, end, chunks, tl.counts)
        if seen is not None:
            self._apply(self.tell(seen, end, preempt=False))

    def _follow(self, tl: Timeline, t: float) -> None:
        assert self.follow_up is not None
        sent = self.follow_up(tl, t)
        for a in (() if sent is None else (sent,) if isinstance(sent, Arrival) else sent):
            self._sent(tl, a, t)

    def _sent(self, tl: Timeline, a: Arrival, t: float) -> None:
        """`a`, sent as `tl`'s request ended at `t`, comes in (now, or through the heap)."""
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
        self._ended(tl, t)
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
            [h] = self.hosts.values()
            tl.dispatched_at, tl.backend = t, h.name
            h.engine.add(SimRequest(a.id, a.prompt_tokens, a.max_tokens, a.priority, a.block_hashes), t)
            return
        self.waiting[a.id] = a
        self._apply(self.tell(a.arrive(), t, preempt=not self.stepping))

    def _tick(self) -> None:
        assert self.front is not None
        self._apply(self.tell(Tick(), self.clock.now(), preempt=not self.stepping))

    def _apply(self, decisions: Sequence[Decision]) -> None:
        """Carry out the front's decisions (and those they lead to) on the engine models, each by
        its method in `CARRIED`, and count those about a request on its timeline as the gateway
        counts them (`front.counts`)."""
        if not decisions:
            return
        todo: deque[Decision] = deque(decisions)
        t = self.clock.now()
        carry = self._carry
        while todo:
            d = todo.popleft()
            kind = type(d)
            if kind in COUNTED_DECISIONS:
                self.by_id[d.id].counts.apply(d)  # type: ignore[union-attr]
            method = carry.get(kind)
            if method is not None:
                todo.extend(method(d, t))

    def _carry_start(self, d: Start, t: float) -> Sequence[Decision]:
        """A hedge's second attempt, or a start of any other mode (its engine then has it, and
        the front is told `Opened` when the request may be suspended)."""
        front = self.front
        assert front is not None
        if d.mode is StartMode.HEDGE:
            self._send(d.id, self.live[d.id], self.hosts[d.backend], t, hedge=True)
        elif self._start(d, t):
            return self.tell(Opened(d.id), t, preempt=not self.stepping)
        return ()

    def _carry_reject(self, d: Reject, t: float) -> Sequence[Decision]:
        self.waiting.pop(d.id, None)
        self._forget(d.id)
        self._end(self.by_id[d.id], Outcome.REJECTED, d.reason, t, d.retry_after_s)
        return ()

    def _suspend(self, d: Suspend, t: float) -> Sequence[Decision]:
        req_id = d.id
        lv = self.live[req_id]
        h = lv.host
        assert h is not None
        lv.base_tokens += h.produced(req_id)
        self._abort(h, req_id, t)
        lv.host = None
        self.waiting[req_id] = lv.arrival
        return ()

    def _drop(self, d: Drop, t: float) -> Sequence[Decision]:
        """A hedge is over: the attempt at `d.winner` is the request's from now on; the one at
        `d.loser` stops now (one that failed has stopped already)."""
        lv = self.live[d.id]
        loser = self.hosts[d.loser]
        if loser is lv.host:
            lv.promote_hedge()
            assert lv.host is not None
            self.by_id[d.id].backend = lv.host.name
        else:
            lv.hedge = None
        if not d.failed:
            self._abort(loser, d.id, t)
        return ()

    @staticmethod
    def _abort(h: _Host, req_id: str, t: float) -> None:
        """Stop `req_id` in `h`'s engine; mid-step, that step delivers nothing more to it."""
        if h.step is not None:
            h.cut.add(req_id)
        h.engine.abort(req_id, t)

    def _start(self, d: Start, t: float) -> bool:
        """Send a request where the front says: True when its engine took it, its upstream is
        open and it may be suspended (the front is told `Opened`)."""
        a = self.waiting.pop(d.id)
        front = self.front
        assert front is not None
        lv = self.live.get(d.id)
        if lv is None:
            tracked = front.tracks(a.cls, a.resumable)
            lv = self.live[d.id] = _Live(a, self.kv_keys if tracked else None)
            if tracked:
                self.tracked[d.id] = lv
                self.kv_keys += 1
        tl = self.by_id[d.id]
        if tl.dispatched_at is None:
            tl.dispatched_at = t
        return self._send(d.id, lv, self.hosts[d.backend], t, hedge=False) and lv.kv_key is not None

    def _send(self, rid: str, lv: _Live, h: _Host, t: float, hedge: bool) -> bool:
        """An attempt of `rid` at `h` (its only one, or a hedge's second): True when the engine
        took it. It answers in the order the simulator's server does: refused when dead, then
        a hang, a drawn 500, the engine's 404."""
        lv.tries += 1
        if hedge:
            lv.hedge, lv.hedge_attempt = h, lv.tries
        else:
            lv.host, lv.attempt = h, lv.tries
            self.by_id[rid].backend = h.name
        a = lv.arrival
        if h.dead:
            self._fail(rid, lv, h, FailureKind.CONNECT, False, 0, t)
            return False
        if h.faults.hangs(True, t):
            self._schedule(t + self.header_timeout_s, _HEADER_DEADLINE, _HeaderDeadline(rid, lv.tries))
            return False
        if h.errors.fails(t):
            self._fail(rid, lv, h, FailureKind.STATUS, True, 0, t)
            return False
        if a.model is not None and h.models and a.model not in h.models:
            self._refuse(rid, "model_not_found", t)
            return False
        done = lv.base_tokens
        req = SimRequest(a.id, a.prompt_tokens + done, a.max_tokens - done, a.priority, a.block_hashes, lv.kv_key)
        try:
            h.engine.add(req, t)
        except ValueError:  # past this engine's context length (a fleet's engines may differ)
            self._refuse(rid, "context_length", t)
            return False
        return True
