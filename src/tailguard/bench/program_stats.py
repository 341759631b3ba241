"""Agent programs measured as their users feel them: each program's end-to-end time, from its due
start to its last answer, per program class and overall, read from the request records alone
(`RequestRecord.program*`, written by `bench.programs`); a before/after comparison of two runs;
and their tables. Pure but for the tables' rich objects.

A program whose call failed, or that never got its last answer, ranks as worst (+inf), as a
failed request does in the request statistics: it stays in the count and in the tail.

    summary["programs"] = program_summary(records)      # None for a run without programs
    cmp["programs"] = program_comparison(before, after)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text

from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import STAT_KEYS, describe, json_number, measured
from tailguard.bench.table import fit, fmt_ratio, fmt_s, table


@dataclass(frozen=True, slots=True)
class ProgramOutcome:
    """One program: its class, its due start, when its last answer came, its calls, whether it
    ended well (every call ok, the last one among them)."""

    index: int
    cls: str
    start_s: float
    end_s: float
    calls: int
    ok: bool

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s if self.ok else math.inf


def programs_of(records: Sequence[RequestRecord]) -> list[ProgramOutcome]:
    """The programs the measured records are calls of, in the order they started."""
    by: dict[int, list[RequestRecord]] = {}
    for r in measured(records):
        if r.program is not None:
            by.setdefault(r.program, []).append(r)
    out = []
    for index, calls in by.items():
        ok = all(c.ok for c in calls) and any(c.program_last for c in calls)
        out.append(ProgramOutcome(index, calls[0].cls, min(c.scheduled_at for c in calls),
                                  max(c.ended_at for c in calls), len(calls), ok))
    return sorted(out, key=lambda p: p.start_s)


def _group(progs: Sequence[ProgramOutcome]) -> dict[str, Any]:
    e2e = describe([p.e2e_s for p in progs])
    ok = sum(1 for p in progs if p.ok)
    return {"count": len(progs), "ok": ok, "failed": len(progs) - ok,
            "calls_mean": json_number(sum(p.calls for p in progs) / len(progs), 3) if progs else None,
            "e2e_s": {k: json_number(e2e[k]) for k in STAT_KEYS}}


def program_summary(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """`summary.json`'s `programs`: per program class and overall, programs, ok, failed, calls per
    program and program E2E (p50 ... max, mean); None when no record is a program's call."""
    progs = programs_of(records)
    if not progs:
        return None
    names = sorted({p.cls for p in progs}, key=[p.cls for p in progs].index)
    return {"classes": {n: _group([p for p in progs if p.cls == n]) for n in names}, "overall": _group(progs)}


def program_comparison(before: Sequence[RequestRecord], after: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """Program E2E before and after, per class and overall, with after/before ratios of P50, P99
    and the mean; None unless both runs have programs."""
    b, a = program_summary(before), program_summary(after)
    if b is None or a is None:
        return None
    out: dict[str, Any] = {}
    for name in [*b["classes"], "overall"]:
        gb = b["overall"] if name == "overall" else b["classes"].get(name)
        ga = a["overall"] if name == "overall" else a["classes"].get(name)
        if gb is None or ga is None:
            continue
        out[name] = {"before": gb, "after": ga, "ratio": {
            k: _ratio(ga["e2e_s"][k], gb["e2e_s"][k]) for k in ("p50", "p99", "mean")}}
    return out


def _ratio(after: float | None, before: float | None) -> float | None:
    if after is None or before is None or before <= 0:
        return None
    return round(after / before, 4)


def programs_table(programs: dict[str, Any]) -> Table:
    """The summary's programs: counts and E2E percentiles per program class."""
    t = table("Programs (E2E from each program's due start to its last answer; failed ones rank as worst)",
              ("class", "programs", "ok", "failed", "calls", "P50", "P90", "P99", "max", "mean"))
    for name, g in [*programs["classes"].items(), ("overall", programs["overall"])]:
        e = g["e2e_s"]
        t.add_row(Text(name, style="bold" if name == "overall" else ""), str(g["count"]), str(g["ok"]),
                  Text(str(g["failed"]), style="red" if g["failed"] else ""), f"{g['calls_mean']:.1f}",
                  *(fmt_s(e[k]) for k in ("p50", "p90", "p99", "max", "mean")))
    return fit(t)


def program_comparison_table(cmp: dict[str, Any]) -> Table:
    """Program E2E before and after, per class, with the ratios (below 1 is faster)."""
    t = table("Program E2E, before -> after (ratio)", ("class", "P50", "P99", "mean", "failed"))
    for name, g in cmp.items():
        b, a, r = g["before"]["e2e_s"], g["after"]["e2e_s"], g["ratio"]
        t.add_row(name, *(f"{fmt_s(b[k])} -> {fmt_s(a[k])} ({fmt_ratio(r[k])})" for k in ("p50", "p99", "mean")),
                  f"{g['before']['failed']} -> {g['after']['failed']}")
    return fit(t)
