"""Before/after comparison of two runs: per class and metric, the percentiles, their ratio with a
bootstrap 95% CI, throughput and goodput with theirs (`throughput.py`), and the seed's verdict
per class (did P99 fall, did the P99/P50 gap narrow, did the timeout rate fall). Pure: works on
records and run descriptions, no I/O.

"overall" over several classes pools requests of very different sizes (32-token chats with
2,048-token summaries): its percentiles and P99/P50 describe the mix, not any request, and move
with it. Its verdict is therefore only what adds up across classes: throughput, error and
timeout rates (`verdict.pooled`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from tailguard.bench.configs import config_changes, run_config
from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import (
    DEFAULT_BOOTSTRAP, METRICS, describe, json_number, measured, point_ratio, ratio_ci, samples,
)
from tailguard.bench.throughput import compare_rates, slice_rates, window
from tailguard.bench.validity import validity

COMPARED_PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 50.0), ("p95", 95.0), ("p99", 99.0))
VERDICT_METRIC = "e2e_s"


def _rate(n: int, d: int) -> float:
    return n / d if d else math.nan


def _counts(records: Sequence[RequestRecord]) -> dict[str, Any]:
    n = len(records)
    timeouts = sum(1 for r in records if r.timed_out)
    ok = sum(1 for r in records if r.ok)
    return {"count": n, "ok": ok, "errors": n - ok - timeouts, "timeouts": timeouts,
            "timeout_rate": json_number(_rate(timeouts, n), 6), "error_rate": json_number(_rate(n - ok - timeouts, n), 6)}


POOLED_WHY = ("over several classes of different sizes, percentiles and P99/P50 describe the mix, not a request: "
              "read each class for latency")


@dataclass(frozen=True)
class _Side:
    """What every group of one run is measured against: the run's window and SLOs."""

    start: float
    end: float
    slos: dict[str, dict[str, float]]

    def rates(self, records: Sequence[RequestRecord]) -> dict[str, Any]:
        return slice_rates(records, self.start, self.end, self.slos)


def _group(before: Sequence[RequestRecord], after: Sequence[RequestRecord], sides: tuple[_Side, _Side],
           seed: int, n_boot: int, pooled: bool = False) -> dict[str, Any]:
    sb, sa = samples(before), samples(after)
    metrics: dict[str, Any] = {}
    for m in METRICS:
        if len(sb[m]) == 0 and len(sa[m]) == 0:
            continue
        db, da = describe(sb[m]), describe(sa[m])
        row: dict[str, Any] = {}
        for i, (key, q) in enumerate(COMPARED_PERCENTILES):
            ci = ratio_ci(sa[m], sb[m], q, n_boot=n_boot, seed=seed + i)
            row[key] = {
                # n_*: sample sizes, so "no sample" (e.g. no gateway queue header straight to an
                # engine) reads "-" and is not mistaken for a percentile landing on failures.
                "before": json_number(db[key]), "after": json_number(da[key]),
                "n_before": len(sb[m]), "n_after": len(sa[m]),
                "ratio": json_number(point_ratio(da[key], db[key]), 4),
                "ci95": None if ci is None else [json_number(ci[0], 4), json_number(ci[1], 4)],
            }
        row["tail_ratio"] = {
            "before": json_number(point_ratio(db["p99"], db["p50"]), 4),
            "after": json_number(point_ratio(da["p99"], da["p50"]), 4),
        }
        metrics[m] = row
    cb, ca = _counts(before), _counts(after)
    rates = compare_rates(sides[0].rates(before), sides[1].rates(after), seed=seed, n_boot=n_boot)
    verdict = _pooled_verdict(rates, cb, ca) if pooled else _verdict(metrics.get(VERDICT_METRIC), cb, ca)
    return {"before": cb, "after": ca, "metrics": metrics, "throughput": rates, "verdict": verdict}


def _lt(a: float | None, b: float | None) -> bool | None:
    """a < b where None means +inf (a percentile on failed requests); None if both are None."""
    if a is None and b is None:
        return None
    if a is None:
        return False
    if b is None:
        return True
    return a < b


def _verdict(row: dict[str, Any] | None, cb: dict[str, Any], ca: dict[str, Any]) -> dict[str, Any]:
    v: dict[str, Any] = {"metric": VERDICT_METRIC, "p99_fell": None, "p99_fell_significantly": None,
                         "gap_narrowed": None, "timeout_rate_fell": None}
    if row is not None:
        p99 = row["p99"]
        v["p99_fell"] = _lt(p99["after"], p99["before"])
        ci = p99["ci95"]
        v["p99_fell_significantly"] = None if ci is None or ci[1] is None else bool(ci[1] < 1.0)
        v["gap_narrowed"] = _lt(row["tail_ratio"]["after"], row["tail_ratio"]["before"])
    v["timeout_rate_fell"] = _rate_fell(cb["timeout_rate"], ca["timeout_rate"])
    return v


def _rate_fell(before: float | None, after: float | None) -> bool | None:
    """None when there is nothing to say: a rate missing, or zero in both runs."""
    if before is None or after is None or (before == 0 and after == 0):
        return None
    return after < before


def _pooled_verdict(rates: dict[str, Any], cb: dict[str, Any], ca: dict[str, Any]) -> dict[str, Any]:
    return {"metric": None, "pooled": True, "why": POOLED_WHY,
            "output_tokens_ratio": (rates.get("output_tokens_per_s") or {}).get("ratio"),
            "error_rate_fell": _rate_fell(cb["error_rate"], ca["error_rate"]),
            "timeout_rate_fell": _rate_fell(cb["timeout_rate"], ca["timeout_rate"])}


def compare(before: Sequence[RequestRecord], before_meta: dict[str, Any],
            after: Sequence[RequestRecord], after_meta: dict[str, Any], *,
            seed: int = 0, n_boot: int = DEFAULT_BOOTSTRAP) -> dict[str, Any]:
    """The comparison object written to compare.json (warm-up requests excluded)."""
    b, a = measured(before), measured(after)
    names = [c["name"] for c in (before_meta.get("workload") or {}).get("classes", [])]
    names += [c["name"] for c in (after_meta.get("workload") or {}).get("classes", []) if c["name"] not in names]
    for r in [*b, *a]:
        if r.cls not in names:
            names.append(r.cls)
    sides = (_Side(*window(b), before_meta.get("slo") or {}), _Side(*window(a), after_meta.get("slo") or {}))
    classes = {n: _group([r for r in b if r.cls == n], [r for r in a if r.cls == n], sides, seed, n_boot)
               for n in names if any(r.cls == n for r in [*b, *a])}
    return {
        "before": _run_info(before_meta, b),
        "after": _run_info(after_meta, a),
        "classes": classes,
        "overall": _group(b, a, sides, seed, n_boot, pooled=len(classes) > 1),
        # Which gateway settings differed: a clean comparison changes one.
        "config": config_changes(run_config(before, before_meta), run_config(after, after_meta)),
    }


def _run_info(meta: dict[str, Any], records: Sequence[RequestRecord]) -> dict[str, Any]:
    return {
        "label": meta.get("label"), "workload": (meta.get("workload") or {}).get("name"), "url": meta.get("url"),
        "mode": meta.get("mode"), "concurrency": meta.get("concurrency"), "rate": meta.get("rate"),
        "started_at": meta.get("started_at"),
        "time_scale": meta.get("time_scale", 1.0),  # wall seconds per simulated second: 1 is wall time
        "validity": validity(records, meta),
    }
