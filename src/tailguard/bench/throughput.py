"""Throughput with an uncertainty, for comparing two runs: each run's window is cut into equal
time slices, and successful requests, output tokens and SLO-meeting requests are counted per
slice; a rate is the mean over slices (the run's total over its window) and the after/before
ratio gets a bootstrap CI over slices (batch means). Pure: records in, numbers out.

A streamed request's output tokens are spread over its content chunks' arrival times, so a
2,048-token summary counts in the slices it was generating in, not all at its end.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import Array, json_number, mean_ratio_ci, meets_slo, point_ratio

N_SLICES = 10
RATES: tuple[str, ...] = ("requests_per_s", "output_tokens_per_s", "goodput_per_s")


def window(records: Sequence[RequestRecord]) -> tuple[float, float]:
    """From the first request's due time to the last one's end (as `stats.measurement_window_s`)."""
    if not records:
        return 0.0, 0.0
    return min(r.scheduled_at for r in records), max(r.ended_at for r in records)


def slice_rates(records: Sequence[RequestRecord], start: float, end: float,
                slos: dict[str, dict[str, float]], n: int = N_SLICES) -> dict[str, Array | None]:
    """Each rate per slice of [start, end]; goodput is None when no record's class has an SLO."""
    width = (end - start) / n
    if width <= 0:
        return {k: None for k in RATES}
    counts = {k: np.zeros(n) for k in RATES}

    def at(t: float) -> int:
        return min(n - 1, max(0, int((t - start) / width)))

    for r in records:
        if r.ok:
            counts["requests_per_s"][at(r.ended_at)] += 1
            if r.cls in slos and meets_slo(r, slos[r.cls]):
                counts["goodput_per_s"][at(r.ended_at)] += 1
        if r.chunk_at and r.output_tokens:
            share = r.output_tokens / len(r.chunk_at)
            for t in r.chunk_at:
                counts["output_tokens_per_s"][at(t)] += share
        elif r.output_tokens:
            counts["output_tokens_per_s"][at(r.ended_at)] += r.output_tokens
    judged = any(r.cls in slos for r in records)
    return {k: (v / width if k != "goodput_per_s" or judged else None) for k, v in counts.items()}


def compare_rates(before: dict[str, Array | None], after: dict[str, Array | None], *, seed: int,
                  n_boot: int) -> dict[str, Any]:
    """Per rate: before, after, their ratio (> 1: more after) and its bootstrap 95% CI."""
    out: dict[str, Any] = {}
    for i, k in enumerate(RATES):
        b, a = before.get(k), after.get(k)
        if b is None or a is None:
            continue
        mb, ma = float(np.mean(b)), float(np.mean(a))
        ci = mean_ratio_ci(a, b, n_boot=n_boot, seed=seed + 100 + i)
        out[k] = {"before": json_number(mb, 4), "after": json_number(ma, 4),
                  "ratio": json_number(point_ratio(ma, mb), 4),
                  "ci95": None if ci is None else [json_number(ci[0], 4), json_number(ci[1], 4)]}
    return out
