"""Statistics of a run: percentiles, the `summary.json` shape, goodput, validity, and bootstrap
confidence intervals for percentile ratios. Pure: numpy over records, no I/O.

How failures stay in the tail (the documented rule):
- E2E of a timed-out request is the time until the client gave up (at least its timeout); of any
  other failure (HTTP error, rejection, disconnect, truncated stream) it is +inf, ranked above
  every success, so a fast 429 can never make a percentile look better.
- TTFT: the real TTFT if a content token arrived; else a timed-out request's time until it gave
  up, and +inf for any other failure.
- A percentile that lands on a +inf sample is written as `null` in summary.json and shown as
  "fail" in tables. `mean` is over finite samples only.
- ITL is pooled per chunk over every request (failed ones included: the gaps they saw happened):
  AIPerf's inter-chunk latency, vllm bench's ITL. TPOT = (E2E - TTFT) / (output tokens - 1), for
  successful requests with at least 2 tokens: AIPerf's and GuideLLM's ITL (docs/bench.md has the table).
- Input and output lengths (`lengths`) are over successful requests: the prompt as the server's
  `usage` counted it, the output tokens as above.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

from tailguard.bench.recorder import RequestRecord
from tailguard.bench.validity import validity

Array = NDArray[np.float64]
# The low end (P1-P25) beside the tail, and the spread (std, min), as AIPerf and vllm bench show them.
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p1", 1.0), ("p5", 5.0), ("p10", 10.0), ("p25", 25.0),
    ("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0), ("p999", 99.9))
METRICS: tuple[str, ...] = ("e2e_s", "ttft_s", "itl_s", "tpot_s", "queue_s")
STAT_KEYS: tuple[str, ...] = tuple(k for k, _ in PERCENTILES) + ("max", "mean", "min", "std")
LENGTHS: tuple[str, ...] = ("input_tokens", "output_tokens")
TAIL_RATIO_METRICS: tuple[str, ...] = ("e2e_s", "ttft_s")
DEFAULT_BOOTSTRAP = 2000


# --- percentiles ---------------------------------------------------------------------------------

def percentile(sorted_values: Array, q: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of an ascending array that may hold
    +inf; a percentile interpolating towards +inf is +inf. nan for an empty array."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    pos = (n - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    a, b = float(sorted_values[lo]), float(sorted_values[hi])
    if frac == 0.0 or a == b:
        return a
    if math.isinf(b):
        return math.inf
    return a + (b - a) * frac


def describe(values: Iterable[float] | Array) -> dict[str, float]:
    """p1 ... p999, max, mean, min and std of a sample (floats; +inf kept, nan when empty). The
    mean and the standard deviation (of the population, numpy's and vllm bench's) are over the
    finite samples only."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    out = {k: percentile(x, q) for k, q in PERCENTILES}
    out["max"] = float(x[-1]) if len(x) else math.nan
    out["min"] = float(x[0]) if len(x) else math.nan
    finite = x[np.isfinite(x)]
    out["mean"] = float(finite.mean()) if len(finite) else math.nan
    out["std"] = float(finite.std()) if len(finite) else math.nan
    return out


def json_number(v: float, digits: int = 6) -> float | None:
    """JSON has no inf or nan: both become null (see the module docstring for what null means)."""
    return None if not math.isfinite(v) else round(v, digits)


# --- samples from records ---------------------------------------------------------------------------

def e2e_sample(rec: RequestRecord) -> float:
    if rec.ok or rec.timed_out:
        return rec.e2e_s
    return math.inf


def ttft_sample(rec: RequestRecord) -> float:
    ttft = rec.ttft_s
    if ttft is not None:
        return ttft
    return rec.e2e_s if rec.timed_out else math.inf


def tpot_sample(rec: RequestRecord) -> float | None:
    ttft = rec.ttft_s
    if not rec.ok or ttft is None or rec.output_tokens < 2:
        return None
    return (rec.e2e_s - ttft) / (rec.output_tokens - 1)


def input_tokens(rec: RequestRecord) -> int:
    """The prompt as the server counted it (its `usage`), else as the bench sized it."""
    return rec.usage_prompt_tokens if rec.usage_prompt_tokens is not None else rec.prompt_tokens


def lengths(records: Sequence[RequestRecord]) -> dict[str, Array]:
    """Input and output sequence lengths (AIPerf's ISL and OSL) of the requests that succeeded:
    a failed request's output is cut short, so it would only blur what the server was asked."""
    ok = [r for r in records if r.ok]
    return {"input_tokens": np.asarray([input_tokens(r) for r in ok], dtype=np.float64),
            "output_tokens": np.asarray([r.output_tokens for r in ok], dtype=np.float64)}


def samples(records: Sequence[RequestRecord]) -> dict[str, Array]:
    """Every metric's sample over `records` (already filtered to one class or all, warm-up removed)."""
    itl: list[Array] = [np.diff(np.asarray(r.chunk_at, dtype=np.float64)) for r in records if len(r.chunk_at) > 1]
    tpot = [t for t in (tpot_sample(r) for r in records) if t is not None]
    return {
        "e2e_s": np.asarray([e2e_sample(r) for r in records], dtype=np.float64),
        "ttft_s": np.asarray([ttft_sample(r) for r in records], dtype=np.float64),
        "itl_s": np.concatenate(itl) if itl else np.empty(0),
        "tpot_s": np.asarray(tpot, dtype=np.float64),
        "queue_s": np.asarray([r.queue_ms / 1000.0 for r in records if r.queue_ms is not None], dtype=np.float64),
    }


def measured(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The records statistics are taken over: not warm-up, and not cut by an interrupt (the
    bench ended those, not the server)."""
    return [r for r in records if not r.warmup and r.error_kind != "interrupted"]


# --- goodput ----------------------------------------------------------------------------------------

def meets_slo(rec: RequestRecord, slo: dict[str, float]) -> bool:
    if not rec.ok:
        return False
    ttft = rec.ttft_s
    if "ttft_s" in slo and (ttft is None or ttft > slo["ttft_s"]):
        return False
    if "e2e_s" in slo and rec.e2e_s > slo["e2e_s"]:
        return False
    if "tpot_s" in slo:
        tpot = tpot_sample(rec)
        if tpot is not None and tpot > slo["tpot_s"]:
            return False
    return True


# --- bootstrap ----------------------------------------------------------------------------------------

def _order_index(n: int, q: float) -> int:
    """1-based rank of the order statistic a resample's q-th percentile is taken at."""
    return min(n, max(1, math.ceil(q / 100.0 * n)))


def bootstrap_percentiles(x: Array, qs: Sequence[float], n_boot: int, rng: np.random.Generator) -> Array:
    """Bootstrap replicates of several percentiles of one sample, jointly (shape n_boot x len(qs)).

    Exact and O(n_boot), not O(n_boot * n): the k-th smallest of n draws from the empirical
    distribution is x_(ceil(n*U)) with U ~ Beta(k, n-k+1), the k-th smallest of n uniforms; a
    later order statistic k2 of the same resample is U + (1-U) * Beta(k2-k, n-k2+1)."""
    s = np.sort(np.asarray(x, dtype=np.float64))
    n = len(s)
    out = np.empty((n_boot, len(qs)))
    if n == 0:
        out.fill(math.nan)
        return out
    ks = [_order_index(n, q) for q in qs]
    order = sorted(range(len(qs)), key=lambda i: ks[i])
    u = np.zeros(n_boot)
    prev_k = 0
    for i in order:
        k = ks[i]
        if k > prev_k:
            u = u + (1.0 - u) * rng.beta(k - prev_k, n - k + 1, size=n_boot)
            prev_k = k
        idx = np.clip(np.ceil(u * n).astype(np.int64) - 1, 0, n - 1)
        out[:, i] = s[idx]
    return out


def _ratio(num: Array, den: Array) -> Array:
    with np.errstate(divide="ignore", invalid="ignore"):
        r: Array = num / den
    return r


def _ci(ratios: Array, level: float) -> tuple[float, float] | None:
    """Percentile interval of the defined replicates; None when fewer than half are defined
    (inf/inf or 0/0, e.g. both runs failing at that percentile)."""
    r = ratios[~np.isnan(ratios)]
    if len(r) < max(1, len(ratios) // 2):
        return None
    r = np.sort(r)
    alpha = (1.0 - level) / 2.0 * 100.0
    return percentile(r, alpha), percentile(r, 100.0 - alpha)


def tail_ratio_ci(x: Array, q_hi: float = 99.0, q_lo: float = 50.0, *, n_boot: int = DEFAULT_BOOTSTRAP,
                  seed: int = 0, level: float = 0.95) -> tuple[float, float] | None:
    """Bootstrap CI of P_hi/P_lo within one sample (both percentiles from the same resample)."""
    if len(x) == 0:
        return None
    reps = bootstrap_percentiles(x, (q_hi, q_lo), n_boot, np.random.default_rng(seed))
    return _ci(_ratio(reps[:, 0], reps[:, 1]), level)


def ratio_ci(after: Array, before: Array, q: float, *, n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0,
             level: float = 0.95) -> tuple[float, float] | None:
    """Bootstrap CI of P_q(after)/P_q(before), the two runs resampled independently."""
    if len(after) == 0 or len(before) == 0:
        return None
    rng = np.random.default_rng(seed)
    a = bootstrap_percentiles(after, (q,), n_boot, rng)[:, 0]
    b = bootstrap_percentiles(before, (q,), n_boot, rng)[:, 0]
    return _ci(_ratio(a, b), level)


def mean_ratio_ci(after: Array, before: Array, *, n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0,
                  level: float = 0.95) -> tuple[float, float] | None:
    """Bootstrap CI of mean(after)/mean(before), each run's values (e.g. per-slice rates)
    resampled independently."""
    if len(after) == 0 or len(before) == 0:
        return None
    rng = np.random.default_rng(seed)
    a = np.asarray(after, dtype=np.float64)[rng.integers(0, len(after), size=(n_boot, len(after)))].mean(axis=1)
    b = np.asarray(before, dtype=np.float64)[rng.integers(0, len(before), size=(n_boot, len(before)))].mean(axis=1)
    return _ci(_ratio(a, b), level)


def point_ratio(num: float, den: float) -> float:
    if math.isnan(num) or math.isnan(den):
        return math.nan
    if den == 0.0:
        return math.inf if num > 0 else math.nan
    if math.isinf(den):
        return math.nan if math.isinf(num) else 0.0
    return num / den


# --- summary.json ------------------------------------------------------------------------------------------

def _stats_json(d: dict[str, float], digits: int = 6) -> dict[str, float | None]:
    return {k: json_number(d[k], digits) for k in STAT_KEYS}


def _group(records: list[RequestRecord], window_s: float, slos: dict[str, dict[str, float]] | None,
           seed: int, n_boot: int) -> dict[str, Any]:
    ok = sum(1 for r in records if r.ok)
    timeouts = sum(1 for r in records if r.timed_out)
    smp = samples(records)
    stats = {m: describe(smp[m]) for m in METRICS}
    out_tokens = sum(r.output_tokens for r in records)
    g: dict[str, Any] = {
        "count": len(records), "ok": ok, "errors": len(records) - ok - timeouts, "timeouts": timeouts,
    }
    for m in METRICS:
        g[m] = _stats_json(stats[m])
    # Sample sizes: 0 means "not measured" (e.g. queue_s without a gateway), so that metric's
    # nulls are not read as percentiles landing on failures.
    g["samples"] = {m: len(smp[m]) for m in METRICS}
    g["throughput"] = {
        "requests_per_s": json_number(ok / window_s if window_s > 0 else math.nan),
        "output_tokens_per_s": json_number(out_tokens / window_s if window_s > 0 else math.nan),
    }
    g["tail_ratio"] = {}
    for m in TAIL_RATIO_METRICS:
        ci = tail_ratio_ci(smp[m], n_boot=n_boot, seed=seed)
        g["tail_ratio"][m] = {
            "p99_over_p50": json_number(point_ratio(stats[m]["p99"], stats[m]["p50"]), 4),
            "ci95": None if ci is None else [json_number(ci[0], 4), json_number(ci[1], 4)],
        }
    g["goodput"] = _goodput(records, window_s, slos)
    g["output_tokens"] = out_tokens
    g["input_tokens"] = sum(input_tokens(r) for r in records)
    g["lengths"] = {k: _stats_json(describe(v), 2) for k, v in lengths(records).items()}
    kinds: dict[str, int] = {}
    phases: dict[str, int] = {}
    for r in records:
        if r.error_kind:
            kinds[r.error_kind] = kinds.get(r.error_kind, 0) + 1
        if r.timeout_phase:
            phases[r.timeout_phase] = phases.get(r.timeout_phase, 0) + 1
    g["error_kinds"] = kinds
    g["timeout_phases"] = phases
    return g


def _goodput(records: list[RequestRecord], window_s: float, slos: dict[str, dict[str, float]] | None) -> dict[str, Any] | None:
    if not slos:
        return None
    judged = [r for r in records if r.cls in slos]
    if not judged:
        return None
    good = sum(1 for r in judged if meets_slo(r, slos[r.cls]))
    return {
        "requests_per_s": json_number(good / window_s if window_s > 0 else math.nan),
        "fraction": json_number(good / len(judged), 4),
        "good": good,
        "judged": len(judged),
    }


def measurement_window_s(records: Sequence[RequestRecord]) -> float:
    """From the first measured request's due time to the last measured request's end."""
    if not records:
        return 0.0
    return max(r.ended_at for r in records) - min(r.scheduled_at for r in records)


def summarize(records: Sequence[RequestRecord], meta: dict[str, Any], *, n_boot: int = DEFAULT_BOOTSTRAP) -> dict[str, Any]:
    """The `summary.json` object: classes.<name>, overall, throughput, validity, plus run info."""
    rec = measured(records)
    window = measurement_window_s(rec)
    seed = int(meta.get("seed") or 0)
    slos: dict[str, dict[str, float]] = meta.get("slo") or {}
    class_names = [c["name"] for c in (meta.get("workload") or {}).get("classes", [])]
    for r in rec:
        if r.cls not in class_names:
            class_names.append(r.cls)
    classes = {name: _group([r for r in rec if r.cls == name], window, slos, seed, n_boot)
               for name in class_names if any(r.cls == name for r in rec)}
    overall = _group(rec, window, slos, seed, n_boot)
    return {
        "classes": classes,
        "overall": overall,
        "throughput": overall["throughput"],
        "validity": validity(rec, meta),
        "interrupted": _interrupted(records, meta),
        "trace": meta.get("trace"),  # what a trace replay sent (bench.trace.plan.TraceFactory.describe)
        "run": {
            "workload": (meta.get("workload") or {}).get("name"),
            "url": meta.get("url"), "model": meta.get("model"), "mode": meta.get("mode"),
            "concurrency": meta.get("concurrency"), "rate": meta.get("rate"), "arrival": meta.get("arrival"),
            "burstiness": meta.get("burstiness"), "seed": meta.get("seed"), "started_at": meta.get("started_at"),
            "measured_requests": len(rec), "warmup_requests_excluded": len(records) - len(rec),
            "window_s": json_number(window),
            "time_scale": meta.get("time_scale", 1.0),
            "gateway_config": (meta.get("gateway_config") or {}).get("hash"),
        },
    }


def _interrupted(records: Sequence[RequestRecord], meta: dict[str, Any]) -> dict[str, Any] | None:
    """None for a run that ran to its end; else when it was stopped and what had been sent:
    `sent` = `done` (ended on their own, warm-up included) + `cut` (still running after the grace)."""
    info = meta.get("interrupted")
    if not info:
        return None
    cut = sum(1 for r in records if r.error_kind == "interrupted")
    return {"after_s": info.get("after_s"), "grace_s": info.get("grace_s"),
            "sent": len(records), "done": len(records) - cut, "cut": cut}
