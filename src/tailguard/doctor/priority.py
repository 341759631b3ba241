"""`priority_cost`: what a change of priorities cost, read from two runs (`tailguard doctor RUN
--against EARLIER`); pure, no I/O.

The seed article's table 10: "P99 fell but P50 rose after the fix: requests queue by priority and
the high-priority ones took the capacity; compare the groups' latency curves; tune the priority
ratio, reserve capacity". A class whose P99 fell and whose P50 rose, each beyond its bootstrap
95% interval (`bench.stats.ratio_ci`, the intervals `bench compare` prints) and by at least
`MOVED`, now waits at the median for what its tail gained: the change ranks it behind another
class (or sends another class's work into its steps). The next change reserves capacity for it,
with a value from the runs.
"""

from __future__ import annotations

import math
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


def _moved(before: ClassFacts, after: ClassFacts, metric: str, q: float) -> Moved | None:
    b, a = samples(before.records)[metric], samples(after.records)[metric]
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


def _reservation(f: RunFacts, before: RunFacts, c: ClassFacts) -> tuple[str, str]:
    """(the change, its setting as YAML) for class `c`: a `min_share` of what it held before the
    change when another class is served first, else pacing the others' starts by one decode step."""
    view = f.gateway
    server = c.server_class or c.name
    ahead = [o for o in f.classes.values() if o is not c and o.count and view is not None
             and view.waits_by_design(c, o)]
    if ahead:
        held = _share_in_flight(before, c.name)
        cap = view.backends[0].max_concurrency if view is not None and view.backends else 0
        share = max(math.floor(held * cap) / cap, 1 / cap) if cap else round(held, 2)
        share = min(share, 0.9)
        return (f"reserve capacity for {c.name}: `min_share: {share:g}` on the {server} class (it held {pct(held)} of "
                f"the requests in flight before the change; {', '.join(o.name for o in ahead)} is served first)",
                f"min_share: {share:g}")
    others = [o for o in f.classes.values() if o is not c and o.count]
    other = max(others, key=lambda o: o.max_tokens) if others else None
    step = (f.itl_p50 or 0.0) * float(f.meta.get("time_scale", 1.0))
    name = (other.server_class or other.name) if other else "batch"
    return (f"change the ratio between the classes: pace the {name} class's starts, `start_interval_s: {step:.3g}` "
            f"(one decode step, this run's ITL P50, in wall seconds), so its prefills stop landing in {c.name}'s steps",
            f"start_interval_s: {step:.3g}")


def priority_cost(f: RunFacts, before: RunFacts) -> Finding | None:
    """`f` is the run after the change, `before` the earlier one."""
    found: list[tuple[ClassFacts, str, Moved, Moved]] = []
    for name, c in f.classes.items():
        b = before.classes.get(name)
        if b is None or not c.count or not b.count:
            continue
        for metric in METRICS:
            p99, p50 = _moved(b, c, metric, 99.0), _moved(b, c, metric, 50.0)
            if p99 is not None and p50 is not None and p99.fell() and p50.rose():
                found.append((c, metric, p99, p50))
                break
    if not found:
        return None
    c, metric, p99, p50 = max(found, key=lambda x: x[3].ratio)
    step, setting = _reservation(f, before, c)
    label = "E2E" if metric == "e2e_s" else "TTFT"
    against = []
    changes = config_changes(run_config(_records(before), before.meta), run_config(_records(f), f.meta))
    if changes and len(changes.get("changes") or []) > 1:
        against.append(f"{len(changes['changes'])} gateway settings differ between the runs: which one cost the "
                       "median cannot be told apart")
    return Finding(
        "priority_cost", "medium",
        symptom=f"{c.name}: {label} P99 fell {secs(p99.before)} -> {secs(p99.after)} but P50 rose "
                f"{secs(p50.before)} -> {secs(p50.after)} against the earlier run",
        cause=("the change queues by priority: other work now takes the capacity this class's typical request "
               "used to get, so its median waits for what its tail gained"),
        next_step=step,
        check=f"{bench_command(f)}  # with `{setting}`; then {compare_command(f)}",
        evidence_for=(p99.line(f"{label} P99"), p50.line(f"{label} P50")),
        evidence_against=tuple(against),
    )
