"""`priority_cost`: what a change of priorities cost, read from two runs (`tailguard doctor RUN
--against EARLIER`); pure, no I/O.

The seed article's table 10: "P99 fell but P50 rose after the fix: requests queue by priority and
the high-priority ones took the capacity; compare the groups' latency curves; tune the priority
ratio, reserve capacity". A group (a class, or all requests together) whose P99 fell and whose
P50 rose, each beyond its bootstrap 95% interval (`bench.stats.ratio_ci`, the intervals `bench
compare` prints) and by at least `MOVED`, traded its median for its tail; the class whose median
rose most pays for it. The next change reserves capacity for that class, with a value from the
runs: a `min_share` of what it held before when another class is served ahead of it, else a
`max_share` on the class served after it that leaves it the slots it held. On the discrete-event
simulator, taking preemption off a chat-heavy mix at full load does it: the reports' tail falls
(they are no longer suspended), the chats' median rises (they wait behind reports again).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tailguard.bench.configs import config_changes, run_config
from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import describe, ratio_ci, samples
from tailguard.doctor.facts import ClassFacts, RunFacts
from tailguard.doctor.finding import Finding
from tailguard.doctor.rules import bench_command, compare_command
from tailguard.doctor.words import pct, secs

MOVED = 0.1  # a percentile 10% up or down: a change worth a finding, beyond its interval
N_BOOT = 1000
METRICS = ("e2e_s", "ttft_s")


@dataclass(frozen=True)
class Moved:
    """One class's metric between two runs: a percentile before and after, their ratio and its 95% CI."""

    before: float
    after: float
    ratio: float
    ci: tuple[float, float] | None

    def fell(self) -> bool:
        return self.ci is not None and self.ci[1] < 1.0 and self.ratio <= 1.0 - MOVED

    def rose(self) -> bool:
        return self.ci is not None and self.ci[0] > 1.0 and self.ratio >= 1.0 + MOVED

    def line(self, label: str) -> str:
        ci = f"[{self.ci[0]:.2f}, {self.ci[1]:.2f}]" if self.ci else "n/a"
        return f"{label} {secs(self.before)} -> {secs(self.after)} (x{self.ratio:.2f}, 95% CI {ci})"


def _moved(before: Sequence[RequestRecord], after: Sequence[RequestRecord], metric: str, q: float) -> Moved | None:
    b, a = samples(before)[metric], samples(after)[metric]
    if len(a) == 0 or len(b) == 0:
        return None
    key = "p99" if q == 99.0 else "p50"
    pb, pa = describe(b)[key], describe(a)[key]
    if not (math.isfinite(pb) and math.isfinite(pa)) or pb <= 0:
        return None
    return Moved(pb, pa, pa / pb, ratio_ci(a, b, q, n_boot=N_BOOT, seed=int(q)))


def _records(f: RunFacts) -> list[RequestRecord]:
    return [r for c in f.classes.values() for r in c.records]


def _share_in_flight(f: RunFacts, name: str) -> float:
    """The class's share of the requests in flight over the run (its requests' time over everyone's)."""
    total = sum(r.e2e_s for r in _records(f))
    return sum(r.e2e_s for r in f.classes[name].records) / total if total > 0 else 0.0


def _reservation(f: RunFacts, before: RunFacts, c: ClassFacts) -> tuple[str, str] | None:
    """(the change, its setting as YAML) that reserves capacity for class `c`, sized by the
    share of the requests in flight it held in the earlier run; None without another class or
    the gateway's settings to size it by."""
    view = f.gateway
    others = [o for o in f.classes.values() if o is not c and o.count]
    if view is None or not view.backends or not others:
        return None
    cap = view.backends[0].max_concurrency or 8
    held = _share_in_flight(before, c.name)
    server = c.server_class or c.name
    ahead = [o for o in others if view.waits_by_design(c, o)]
    if ahead:
        share = min(max(math.floor(held * cap) / cap, 1 / cap), 0.9)
        return (f"reserve capacity for {c.name}: `min_share: {share:g}` on the {server} class, the slots of "
                f"{cap} it held before the change ({pct(held)} of the requests in flight; "
                f"{', '.join(o.name for o in ahead)} is served first)", f"min_share: {share:g} on {server}")
    after = max(others, key=lambda o: o.max_tokens)
    other = after.server_class or after.name
    share = max(1 - math.ceil(held * cap) / cap, 1 / cap)
    return (f"reserve capacity for {c.name}: `max_share: {share:g}` on the {other} class, so {c.name} keeps the "
            f"slots of {cap} it held before the change ({pct(held)} of the requests in flight)",
            f"max_share: {share:g} on {other}")


def _group_moved(before: Sequence[RequestRecord], after: Sequence[RequestRecord]) -> tuple[str, Moved, Moved] | None:
    """(metric, P99, P50) of the first metric whose P99 fell and P50 rose between the runs."""
    for metric in METRICS:
        p99, p50 = _moved(before, after, metric, 99.0), _moved(before, after, metric, 50.0)
        if p99 is not None and p50 is not None and p99.fell() and p50.rose():
            return metric, p99, p50
    return None


def _payer(f: RunFacts, before: RunFacts) -> ClassFacts | None:
    """The class whose median rose most (by at least `MOVED`)."""
    rises = [(m.ratio, c) for name, c in f.classes.items() if c.count and name in before.classes
             and (m := _moved(before.classes[name].records, c.records, "e2e_s", 50.0)) is not None]
    best = max(rises, key=lambda x: x[0], default=None)
    return best[1] if best is not None and best[0] >= 1.0 + MOVED else None


def priority_cost(f: RunFacts, before: RunFacts) -> Finding | None:
    """`f` is the run after the change, `before` the earlier one."""
    groups: list[tuple[str, Sequence[RequestRecord], Sequence[RequestRecord], ClassFacts | None]] = [
        (name, before.classes[name].records, c.records, c) for name, c in f.classes.items()
        if c.count and name in before.classes]
    groups.append(("all requests", _records(before), _records(f), None))
    for name, b, a, cls in groups:
        moved = _group_moved(b, a)
        payer = cls if cls is not None else _payer(f, before)
        if moved is None or payer is None or (change := _reservation(f, before, payer)) is None:
            continue
        metric, p99, p50 = moved
        label = "E2E" if metric == "e2e_s" else "TTFT"
        pays = "" if cls is not None else \
            f"; {payer.name}'s median rose most (E2E P50 {secs(before.classes[payer.name].e2e_p50)} -> {secs(payer.e2e_p50)})"
        against = []
        changes = config_changes(run_config(_records(before), before.meta), run_config(_records(f), f.meta))
        if changes and len(changes.get("changes") or []) > 1:
            against.append(f"{len(changes['changes'])} gateway settings differ between the runs: which one cost the "
                           "median cannot be told apart")
        step, setting = change
        return Finding(
            "priority_cost", "medium",
            symptom=(f"{name}: {label} P99 fell {secs(p99.before)} -> {secs(p99.after)} but P50 rose "
                     f"{secs(p50.before)} -> {secs(p50.after)} against the earlier run{pays}"),
            cause=("the change moved capacity between classes: the tail got it, the typical request of "
                   f"{payer.name} now waits for it (the article, table 10: high-priority requests took the capacity)"),
            next_step=step,
            check=f"{bench_command(f)}  # with `{setting}`; then {compare_command(f)}",
            evidence_for=(p99.line(f"{label} P99"), p50.line(f"{label} P50")),
            evidence_against=tuple(against),
        )
    return None
