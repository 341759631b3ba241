"""A recording read as traffic: each request that reached the front, what happened to it, and
how its backend served it (the samples `sim.fit` fits the engine to); pure, no I/O.

Everything is on the recording's clock (the front's `now`): arrivals, binds, suspensions and
rejections come from the events and decisions; sizes and first-content instants from the
`request` lines (a request still running when the recording stopped has none, and is left out).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from tailguard.front.counts import Counts
from tailguard.front.events import (
    Arrive, Drop, Ejected, Finished, Generated, GiveUp, HealthChanged, KindLearned, Readmitted, Reconfigure, Reject,
    Retired, Start, StartMode, Suspend, Wait,
)
from tailguard.recording.codec import Observation, Recording
from tailguard.recording.legacy import DropV1, HedgeV1, StartV1
from tailguard.sim.fit import Served
from tailguard.types import Outcome


@dataclass(slots=True)
class Request:
    """One recorded request: what the front was told (`arrive`) at `at`, what it decided, and
    what the driver saw when it ended (`seen`; None if it had not ended)."""

    arrive: Arrive
    at: float
    bound_at: float | None = None  # its first Start
    rejected: str | None = None
    counts: Counts = field(default_factory=Counts)  # what the front's decisions said of it
    seen: Observation | None = None

    @property
    def suspensions(self) -> int:
        return self.counts.preemptions

    @property
    def cls(self) -> str:
        return self.arrive.cls

    @property
    def prompt_tokens(self) -> int:
        return self.seen.prompt_tokens if self.seen is not None else 0

    @property
    def output_tokens(self) -> int:
        """Tokens to generate when replayed: what it generated, or (refused, gone before any)
        its budget as the gateway gave it."""
        if self.seen is not None and self.seen.output_tokens > 0:
            return self.seen.output_tokens
        if self.arrive.max_tokens is not None:
            return max(1, self.arrive.max_tokens)
        return max(1, self.arrive.est_tokens - self.prompt_tokens)


@dataclass(slots=True)
class Traffic:
    """The requests in arrival order, the backends' running intervals, and the facts a report
    must state about the recording (reloads, kinds learned)."""

    requests: list[Request]
    running: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)  # backend -> (from, to, id)
    # backend -> (at, id, tokens generated before): each run started there, which prefills its
    # prompt and, resumed, what it had generated
    starts: dict[str, list[tuple[float, str, int]]] = field(default_factory=dict)
    continues: dict[str, bool] = field(default_factory=dict)  # backend -> can continue a generation
    reloads: int = 0
    unfinished: int = 0  # arrived, but no `request` line: left out

    @property
    def span_s(self) -> float:
        return self.requests[-1].at - self.requests[0].at if self.requests else 0.0


def traffic_of(rec: Recording) -> Traffic:
    """The recording's requests and what happened to them, joined by id."""
    return _Reader(rec).read()


# How a recording's decisions become traffic (a recording of format version 1 has its own Start,
# Hedge and Drop: `recording.legacy`), and why the others do not.
CARRIED: dict[type, str] = {Start: "_start", StartV1: "_start_v1", Suspend: "_suspend", Reject: "_reject",
                            GiveUp: "_counted", Drop: "_counted"}
NOT_APPLICABLE: dict[type, str] = {
    Wait: "it holds no slot until its next Start, which moves it",
    HealthChanged: "a backend's health is not traffic: its requests' starts say where they ran",
    Ejected: "an ejection is not traffic: its requests' starts say where they ran",
    Readmitted: "a readmission is not traffic",
    Retired: "a backend that left has no start after its last request's",
    HedgeV1: "a hedge's second attempt is not traffic (version 1)",
    DropV1: "a hedge's loser is not traffic (version 1)",
}


class _Reader:
    """One pass over a recording's steps; each decision by its method in `CARRIED`."""

    def __init__(self, rec: Recording) -> None:
        self.rec = rec
        self.reqs: dict[str, Request] = {}
        self.running: dict[str, tuple[str, float]] = {}
        self.intervals: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
        self.starts: dict[str, list[tuple[float, str, int]]] = defaultdict(list)
        self.generated: dict[str, int] = {}
        self.continues = {b.name: b.continues for b in rec.header.params.backends}
        self.reloads = 0
        self.carry = {kind: getattr(self, name) for kind, name in CARRIED.items()}

    def read(self) -> Traffic:
        rec = self.rec
        for step in rec.steps:
            self._event(step.event, step.now)
            for d in step.decisions:
                method = self.carry.get(type(d))
                if method is not None:
                    method(d, step.now)
        end = rec.steps[-1].now if rec.steps else 0.0
        for req_id in list(self.running):
            self._stop(req_id, end)
        for obs in rec.requests:
            if obs.id in self.reqs:
                self.reqs[obs.id].seen = obs
        ended = [r for r in self.reqs.values() if r.seen is not None]
        return Traffic(ended, dict(self.intervals), dict(self.starts), self.continues, self.reloads,
                       len(self.reqs) - len(ended))

    def _event(self, ev: object, now: float) -> None:
        if isinstance(ev, Arrive):
            self.reqs[ev.id] = Request(ev, now)
        elif isinstance(ev, Generated):
            self.generated[ev.id] = ev.tokens
        elif isinstance(ev, Finished) and ev.id in self.running:
            self._stop(ev.id, now)
        elif isinstance(ev, KindLearned):
            self.continues[ev.backend] = ev.continues
        elif isinstance(ev, Reconfigure):
            self.reloads += 1
            self.continues.update((b.name, b.continues) for b in ev.params.backends)

    def _stop(self, req_id: str, now: float) -> None:
        backend, since = self.running.pop(req_id)
        self.intervals[backend].append((since, now, req_id))

    def _start(self, d: Start, now: float) -> None:
        self.reqs[d.id].counts.apply(d)
        if d.mode is not StartMode.HEDGE:  # a hedge's second attempt is not traffic
            self._ran(d.id, d.backend, d.mode.continues, now)

    def _start_v1(self, d: StartV1, now: float) -> None:
        self._ran(d.id, d.backend, d.resumed, now)

    def _ran(self, req_id: str, backend: str, continued: bool, now: float) -> None:
        """It runs on `backend` from `now` (a continuation of what it had generated)."""
        r = self.reqs[req_id]
        if r.bound_at is None:
            r.bound_at = now
        where = self.running.get(req_id)
        if where is not None and where[0] == backend:
            return  # a retry on the same backend keeps its slot
        if where is not None:
            self._stop(req_id, now)
        self.running[req_id] = (backend, now)
        self.starts[backend].append((now, req_id, self.generated.get(req_id, 0) if continued else 0))

    def _suspend(self, d: Suspend, now: float) -> None:
        self.reqs[d.id].counts.apply(d)
        self._stop(d.id, now)

    def _reject(self, d: Reject, now: float) -> None:
        self.reqs[d.id].rejected = d.reason.value

    def _counted(self, d: GiveUp | Drop, now: float) -> None:
        self.reqs[d.id].counts.apply(d)


def served(t: Traffic) -> dict[str, list[Served]]:
    """By backend, how each request that ran once, undisturbed, was served: sizes, prefill
    and per-token times, and the load beside it (time averages over its own prefill and decode)."""
    by_id = {r.arrive.id: r for r in t.requests}

    def context(r: Request) -> float:  # the KV a running request holds, on average over its run
        return r.prompt_tokens + r.output_tokens / 2.0

    out: dict[str, list[Served]] = {}
    for backend, spans in t.running.items():
        load = _Load([(a, b, context(by_id[i])) for a, b, i in spans if i in by_id])
        prefilled = _Prefills([(at, by_id[i].prompt_tokens + before) for at, i, before in t.starts.get(backend, ())
                               if i in by_id])
        samples = out[backend] = []
        for r in (by_id[i] for _, _, i in spans if i in by_id):
            seen = r.seen
            assert seen is not None
            if (seen.outcome is not Outcome.SUCCESS or seen.attempts != 1 or r.suspensions or r.bound_at is None
                    or seen.first_content_at is None or seen.first_content_at < r.bound_at):
                continue
            first, done, n = seen.first_content_at, seen.finished_at, seen.output_tokens
            seqs, kv = load.mean(first, done)
            others, others_kv = load.mean(r.bound_at, first)
            decoding = n >= 2 and done > first
            samples.append(Served(
                r.prompt_tokens, n, first - r.bound_at, (done - first) / (n - 1) if decoding else None,
                seqs, kv, max(0.0, others - 1.0), max(0.0, others_kv - context(r)),
                prefilled.between(first, done) / (n - 1) if decoding else 0.0))
    return out


class _Load:
    """Sequences running on one backend over time and the KV tokens they hold: two step
    functions built from running intervals, integrated so a time average is two lookups."""

    def __init__(self, spans: list[tuple[float, float, float]]) -> None:
        changes = sorted([(a, 1, kv) for a, _, kv in spans] + [(b, -1, -kv) for _, b, kv in spans])
        self.at: list[float] = []
        self.level: list[tuple[int, float]] = []  # (sequences, kv tokens) from `at[k]` on
        self.area: list[tuple[float, float]] = []  # their integrals up to `at[k]`
        n, kv, area_n, area_kv, last = 0, 0.0, 0.0, 0.0, None
        for t, dn, dkv in changes:
            if last is not None:
                area_n += n * (t - last)
                area_kv += kv * (t - last)
            n, kv, last = n + dn, kv + dkv, t
            self.at.append(t)
            self.level.append((n, kv))
            self.area.append((area_n, area_kv))

    def _integral(self, t: float) -> tuple[float, float]:
        k = bisect.bisect_right(self.at, t) - 1
        if k < 0:
            return 0.0, 0.0
        (n, kv), (an, akv) = self.level[k], self.area[k]
        dt = t - self.at[k]
        return an + n * dt, akv + kv * dt

    def mean(self, start: float, end: float) -> tuple[float, float]:
        """Time-averaged (sequences, kv tokens) over [start, end]; the level at `start` if empty."""
        if end <= start:
            k = bisect.bisect_right(self.at, start) - 1
            return (float(self.level[k][0]), self.level[k][1]) if k >= 0 else (0.0, 0.0)
        (n0, kv0), (n1, kv1) = self._integral(start), self._integral(end)
        return (n1 - n0) / (end - start), (kv1 - kv0) / (end - start)


class _Prefills:
    """Prompt tokens started on one backend over time: how many between two instants."""

    def __init__(self, starts: list[tuple[float, int]]) -> None:
        starts.sort()
        self.at = [a for a, _ in starts]
        self.total = [0]
        for _, tokens in starts:
            self.total.append(self.total[-1] + tokens)

    def between(self, start: float, end: float) -> int:
        """Tokens of the runs started in (start, end]."""
        return self.total[bisect.bisect_right(self.at, end)] - self.total[bisect.bisect_right(self.at, start)]
