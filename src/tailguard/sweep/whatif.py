"""What a recorded run would have been under another config: the recorded arrivals replayed
through the discrete-event simulator, in front of an engine fitted to the recording; pure, no I/O.

Three columns per class: what the recording shows, the recorded config re-simulated (how well the
simulation reproduces the run: the fit's own check), and the other config simulated on the same
traffic and the same fitted engine. Each request arrives at its recorded instant with its class,
caller, prompt size, output size (what it generated; its budget if it generated nothing) and
the job size and budget the gateway gave it.

What the simulation cannot know, the report says (`WhatIf.notes`): the DES drives one engine,
so several backends become one engine with their slots summed; arrivals are replayed open-loop
(a closed-loop client served sooner would have sent its next request sooner); a reload in the
recording is not replayed (the re-simulation runs the config the recording started with); the
engine runs no faults, so retries and failures do not happen, and a client that left is served
to the end of what it had generated.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tailguard.bench.stats import percentile
from tailguard.clock import VirtualClock
from tailguard.front.front import Front
from tailguard.front.intake import Accepted
from tailguard.front.params import BackendSpec, FrontParams
from tailguard.recording.codec import Recording
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.scenario import Arrival
from tailguard.sim.engine import Engine
from tailguard.sim.fit import Fit, fit
from tailguard.sweep.traffic import Request, Traffic, served, traffic_of
from tailguard.types import Outcome

RECORDED, RESIMULATED, OTHER = "recorded", "re-simulated", "other"
ENGINE = "engine"  # the one backend the DES drives
STATS = (("queue_s", 50.0), ("queue_s", 99.0), ("ttft_s", 50.0), ("ttft_s", 99.0))


@dataclass(frozen=True, slots=True)
class Result:
    """One request's fate in one column: its wait for a slot, its time to first content, its
    refusal, its suspensions."""

    cls: str
    queue_s: float | None
    ttft_s: float | None
    rejected: str | None
    suspensions: int


@dataclass(frozen=True, slots=True)
class ClassSummary:
    requests: int
    stats: dict[tuple[str, float], float]  # (queue_s | ttft_s, 50 | 99) -> seconds (nan: none)
    rejected: dict[str, int]  # reason -> requests
    preemptions: int


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The report: per column, per class; the engine fitted (pooled, and per backend); notes."""

    columns: dict[str, dict[str, ClassSummary]]
    fit: Fit
    by_backend: dict[str, Fit]
    engine: EngineConfig
    requests: int
    span_s: float
    notes: list[str]

    def agreement(self, cls: str) -> dict[tuple[str, float], float | None]:
        """Re-simulated over recorded, per statistic (None where either has no value or the
        recorded one is zero)."""
        rec, sim = self.columns[RECORDED].get(cls), self.columns[RESIMULATED].get(cls)
        out: dict[tuple[str, float], float | None] = {}
        for key in STATS:
            a = rec.stats[key] if rec is not None else float("nan")
            b = sim.stats[key] if sim is not None else float("nan")
            out[key] = None if np.isnan(a) or np.isnan(b) or a <= 0 else b / a
        return out


def what_if(rec: Recording, other: FrontParams | None, shape: EngineConfig,
            max_num_seqs: int | None = None) -> WhatIf:
    """The recording's traffic re-simulated under its own config and, given, under `other`.
    `shape` gives the engine's step-time shape and limits (the fit sets its level);
    `max_num_seqs` the engine's batch (default: the recorded config's slots, summed)."""
    t = traffic_of(rec)
    if not t.requests:
        raise ValueError("the recording holds no request that ended: nothing to replay")
    if other is not None:
        missing = sorted({r.cls for r in t.requests} - {c.name for c in other.classes})
        if missing:
            raise ValueError(f"the recorded requests have class(es) {', '.join(missing)}, which the other config "
                             f"does not define (it has {', '.join(c.name for c in other.classes)})")
    samples = served(t)
    pooled = fit(shape.cost, [s for ss in samples.values() for s in ss])
    backends = rec.header.params.backends
    seqs = max_num_seqs if max_num_seqs is not None else sum(b.max_concurrency for b in backends)
    longest = max(r.prompt_tokens + r.output_tokens for r in t.requests)
    engine = engine_of(shape, pooled, seqs, longest)
    notes = _notes(t, backends, seqs, max_num_seqs is None)
    columns = {RECORDED: summarize(recorded(t)),
               RESIMULATED: summarize(simulate(t, one_backend(rec.header.params, t.continues), engine,
                                               pooled.overhead_s))}
    if other is not None:
        columns[OTHER] = summarize(simulate(t, one_backend(other, t.continues), engine, pooled.overhead_s))
    return WhatIf(columns, pooled, {b: fit(shape.cost, ss) for b, ss in samples.items()}, engine,
                  len(t.requests), t.span_s, notes)


def engine_of(shape: EngineConfig, fitted: Fit, max_num_seqs: int, longest_tokens: int) -> EngineConfig:
    """`shape` with the fitted cost, the batch given, room for the longest request, and every
    request generating exactly its recorded output."""
    model_len = max(shape.max_model_len, longest_tokens + 1)
    return dataclasses.replace(
        shape, cost=fitted.cost, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(shape.max_num_batched_tokens, max_num_seqs), max_model_len=model_len,
        kv_cache_tokens=max(shape.kv_cache_tokens, model_len), output_length="exact")


def one_backend(params: FrontParams, continues: dict[str, bool]) -> FrontParams:
    """`params` with its backends as the one engine the DES drives: slots (and slots reserved
    for the top rank) summed; it continues a generation if every backend it stands for could
    (as the recording learned them, for those it names)."""
    bs = [dataclasses.replace(b, continues=continues.get(b.name, b.continues)) for b in params.backends]
    reserved = None if all(b.reserved_slots is None for b in bs) else sum(b.reserve() for b in bs)
    merged = BackendSpec(ENGINE, sum(b.max_concurrency for b in bs), 1.0, all(b.continues for b in bs), reserved)
    return dataclasses.replace(params, backends=[merged])


def recorded(t: Traffic) -> list[Result]:
    """Each request as the recording shows it."""
    out = []
    for r in t.requests:
        first = r.seen.first_content_at if r.seen is not None else None
        out.append(Result(r.cls, None if r.bound_at is None else r.bound_at - r.at,
                          None if first is None else first - r.at, r.rejected, r.suspensions))
    return out


def simulate(t: Traffic, params: FrontParams, engine: EngineConfig, overhead_s: float = 0.0) -> list[Result]:
    """Each request as the DES serves it behind a front built from `params` (one backend); its
    TTFT with `overhead_s` added (what the fit found no engine step to explain)."""
    t0 = t.requests[0].at
    arrivals = [_arrival(r, t0) for r in t.requests]
    timelines = run(Engine(engine), arrivals, VirtualClock(), Front(params))
    return [Result(tl.cls, tl.front_queue_s, None if tl.ttft_s is None else tl.ttft_s + overhead_s,
                   str(tl.reject_reason) if tl.outcome is Outcome.REJECTED else None, tl.suspensions)
            for tl in timelines]


def _arrival(r: Request, t0: float) -> Arrival:
    a = r.arrive
    # The front is told what the gateway told it (job size, output budget, resumability); the
    # engine generates what the recording says the request generated.
    accepted = Accepted(a.max_tokens, a.est_tokens, False, {}, a.resumable)
    return Arrival(a.id, r.at - t0, max(1, r.prompt_tokens), r.output_tokens, cls=a.cls, caller=a.caller,
                   accepted=accepted)


def summarize(results: list[Result]) -> dict[str, ClassSummary]:
    """Per class: requests, P50/P99 of the wait for a slot (of those started) and of TTFT (of
    those that had content), refusals by reason, suspensions."""
    by_cls: dict[str, list[Result]] = {}
    for r in results:
        by_cls.setdefault(r.cls, []).append(r)
    out = {}
    for cls, rs in by_cls.items():
        values = {"queue_s": np.sort([r.queue_s for r in rs if r.queue_s is not None]),
                  "ttft_s": np.sort([r.ttft_s for r in rs if r.ttft_s is not None])}
        out[cls] = ClassSummary(
            len(rs), {(m, q): percentile(values[m], q) for m, q in STATS},
            dict(Counter(r.rejected for r in rs if r.rejected is not None)), sum(r.suspensions for r in rs))
    return out


def _notes(t: Traffic, bs: Sequence[BackendSpec], seqs: int, default_seqs: bool) -> list[str]:
    notes = []
    if len(bs) > 1:
        notes.append(f"the recording has {len(bs)} backends ({', '.join(b.name for b in bs)}); the simulator drives "
                     f"one engine, so they are simulated as one with their {sum(b.max_concurrency for b in bs)} slots")
    how = "the recorded config's slots" if default_seqs else "as given"
    notes.append(f"the engine batches up to {seqs} sequences ({how}; --max-num-seqs sets the real engine's)")
    if t.reloads:
        notes.append(f"the recording has {t.reloads} reload(s); the re-simulation runs the config it started with")
    if t.unfinished:
        notes.append(f"{t.unfinished} request(s) had not ended when the recording stopped: left out")
    notes.append("arrivals are replayed at their recorded instants (open loop): a closed-loop client served sooner "
                 "or later would have sent its next request sooner or later; no faults are simulated")
    return notes
