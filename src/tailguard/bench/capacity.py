"""Capacity at an SLO (`tailguard bench --find-capacity CLASS`): the highest request rate at which a
class meets its SLO for at least a share of its requests (99% by default); pure, no I/O.

The driver (`cli/bench.py`) runs the workload open loop at the rate `CapacitySearch.next_rate()`
names, judges the run (`judge`: the class's requests that met every target of the SLO, refused and
failed ones counting as misses, over all it sent) and tells the search with `add`. The search doubles
the rate while runs pass (halves it while they fail) until one passes and one fails, then bisects
between them (geometrically) until they are within `precision` of each other: the capacity lies in
[highest passing rate, lowest failing rate]. A run the bench marks invalid (its generator fell
behind the schedule: `validity`) ends the search there, for no rate above it can be measured on
this machine, and says so. `compare` gives the after/before ratio of two capacities with the
interval the two brackets allow.

    search = CapacitySearch(start_rate=2.0, precision=0.05)
    while (rate := search.next_rate()) is not None:
        share = judge(records, "interactive", {"ttft_s": 1.0})
        search.add(rate, share >= 0.99, valid=True)
    search.result()   # {"capacity_per_s": ..., "bracket": [pass, fail], "steps": [...], "stopped": ...}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import measured, meets_slo

CAPACITY_JSON = "capacity.json"


def judge(records: Sequence[RequestRecord], cls: str, slo: dict[str, float]) -> float | None:
    """The share of `cls`'s measured requests that ended well within every target of `slo`
    (`ttft_s`, `tpot_s`, `e2e_s`); None when the run sent none of that class."""
    mine = [r for r in measured(records) if r.cls == cls]
    if not mine:
        return None
    return sum(1 for r in mine if meets_slo(r, slo)) / len(mine)


@dataclass
class Step:
    rate: float
    share: float | None
    passed: bool
    valid: bool
    reason: str | None = None


@dataclass
class CapacitySearch:
    """Doubling (or halving) to a bracket, then bisection to `precision` (see the module docstring)."""

    start_rate: float
    precision: float = 0.05
    max_steps: int = 16
    max_halvings: int = 6  # below start_rate / 2**6 with nothing passing, the search gives up
    steps: list[Step] = field(default_factory=list)
    stopped: str | None = None

    def __post_init__(self) -> None:
        if not (self.start_rate > 0 and self.precision > 0):
            raise ValueError(f"the start rate and the precision must be > 0, got {self.start_rate}, {self.precision}")

    def passing(self) -> float | None:
        rates = [s.rate for s in self.steps if s.passed]
        return max(rates) if rates else None

    def failing(self) -> float | None:
        rates = [s.rate for s in self.steps if not s.passed]
        return min(rates) if rates else None

    def next_rate(self) -> float | None:
        """The next rate to run, or None once the search is over."""
        if self.stopped is not None:
            return None
        if len(self.steps) >= self.max_steps:
            self.stopped = f"{self.max_steps} steps run"
            return None
        lo, hi = self.passing(), self.failing()
        if not self.steps:
            return self.start_rate
        if hi is None:
            assert lo is not None
            return lo * 2.0
        if lo is None:
            rate = hi / 2.0
            if rate < self.start_rate / 2 ** self.max_halvings:
                self.stopped = f"no rate down to {hi:g}/s meets the SLO"
                return None
            return rate
        if hi <= lo * (1.0 + self.precision):
            self.stopped = f"bracketed within {100 * self.precision:g}%"
            return None
        return math.sqrt(lo * hi)

    def add(self, rate: float, passed: bool, valid: bool, share: float | None = None, reason: str | None = None) -> None:
        """The run at `rate`: whether it met the SLO, and whether the bench could measure it."""
        self.steps.append(Step(rate, share, passed and valid, valid, reason))
        if not valid:
            self.stopped = f"the run at {rate:g}/s was not valid ({reason or 'see its summary'}): the generator " \
                           "could not keep the schedule, so no higher rate is measured here"

    def result(self) -> dict[str, Any]:
        lo, hi = self.passing(), self.failing()
        return {"capacity_per_s": lo or 0.0, "bracket": [lo, hi], "stopped": self.stopped,
                "steps": [vars(s) for s in self.steps]}


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """After/before capacity ratio, with the interval the two searches' brackets allow: at least
    after's passing rate over before's failing one, at most after's failing rate over before's
    passing one (None: unbounded, a search that never failed or never passed)."""
    (bp, bf), (ap, af) = before["bracket"], after["bracket"]
    ratio = ap / bp if ap and bp else None
    low = ap / bf if ap and bf else None
    high = af / bp if af and bp else None
    return {"before_per_s": bp, "after_per_s": ap, "ratio": ratio, "interval": [low, high],
            "before_bracket": [bp, bf], "after_bracket": [ap, af]}
