"""Statistics against known distributions, the failure-in-the-tail rule, and the summary shape."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import (
    METRICS, STAT_KEYS, bootstrap_percentiles, describe, percentile, ratio_ci, samples, summarize,
    tail_ratio_ci,
)


def rec(i: int, *, cls: str = "chat", due: float = 0.0, e2e: float = 1.0, ttft: float | None = 0.1,
        tokens: int = 10, ok: bool = True, kind: str | None = None, phase: str | None = None,
        warmup: bool = False, lag: float = 0.0, queue_ms: float | None = None) -> RequestRecord:
    r = RequestRecord(index=i, cls=cls, warmup=warmup, scheduled_at=due, sent_at=due + lag, ended_at=due + e2e,
                      ok=ok, error_kind=kind, timeout_phase=phase, queue_ms=queue_ms)
    if ttft is not None:
        r.first_token_at = due + ttft
        if tokens > 1:
            step = (e2e - ttft) / (tokens - 1)
            r.chunk_at = [due + ttft + k * step for k in range(tokens)]
        else:
            r.chunk_at = [due + ttft]
    r.finish_tokens()
    return r


META = {"seed": 1, "max_dispatch_lag_s": 0.005, "workload": {"name": "w", "classes": [{"name": "chat"}, {"name": "summary"}]},
        "slo": {"chat": {"ttft_s": 0.5, "e2e_s": 2.0}}}


@pytest.mark.parametrize("q", [0.0, 1.0, 25.0, 50.0, 90.0, 99.0, 99.9, 100.0])
def test_percentile_matches_numpy_linear(q: float) -> None:
    x = np.sort(np.random.default_rng(3).normal(size=1001))
    assert percentile(x, q) == pytest.approx(float(np.percentile(x, q)), rel=1e-12, abs=1e-12)


def test_percentiles_of_known_distributions() -> None:
    rng = np.random.default_rng(7)
    u = describe(rng.uniform(0.0, 1.0, size=200_000))
    for key, q in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999)):
        assert u[key] == pytest.approx(q, abs=0.005)
    assert u["mean"] == pytest.approx(0.5, abs=0.005)
    e = describe(rng.exponential(2.0, size=200_000))
    for key, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert e[key] == pytest.approx(-2.0 * math.log(1 - q), rel=0.03)
    assert e["mean"] == pytest.approx(2.0, rel=0.02)


def test_inf_samples_rank_above_everything_and_never_make_nan() -> None:
    x = np.sort(np.array([1.0, 2.0, 3.0, math.inf, math.inf]))
    assert percentile(x, 50) == 3.0
    assert percentile(x, 60) == math.inf  # interpolating towards a failure is a failure
    assert percentile(x, 100) == math.inf
    d = describe([1.0, 3.0, math.inf])
    assert d["mean"] == 2.0 and d["max"] == math.inf


def test_failures_and_timeouts_stay_in_the_tail() -> None:
    good = [rec(i, e2e=1.0 + i / 1000) for i in range(197)]
    timeouts = [rec(100 + i, e2e=30.0, ttft=None, ok=False, kind="timeout", phase="first_token") for i in range(2)]
    error = [rec(200, e2e=0.001, ttft=None, ok=False, kind="http")]  # a fast 503 must not look fast
    s = summarize(good + timeouts + error, META)["overall"]
    assert (s["count"], s["ok"], s["errors"], s["timeouts"]) == (200, 197, 1, 2)
    assert s["e2e_s"]["p50"] == pytest.approx(1.0 + 99.5 / 1000)
    assert s["e2e_s"]["p99"] == pytest.approx(30.0)        # the timed-out requests, at their give-up time
    assert s["e2e_s"]["p999"] is None and s["e2e_s"]["max"] is None  # the failure: +inf, written as null
    assert s["ttft_s"]["p99"] == pytest.approx(30.0)
    assert s["error_kinds"] == {"timeout": 2, "http": 1}
    assert s["timeout_phases"] == {"first_token": 2}
    # if failures were dropped, P99 would be about 1.2 s
    assert describe([r.e2e_s for r in good])["p99"] < 1.2


def test_itl_is_pooled_per_chunk_and_tpot_per_request() -> None:
    steady = rec(0, e2e=1.0, ttft=0.1, tokens=10)  # 9 gaps of 0.1
    stalled = rec(1, e2e=2.0, ttft=0.1, tokens=3)
    stalled.chunk_at = [1.1, 1.11, 3.0]  # a 1.89 s stall after the second token
    stalled.scheduled_at, stalled.ended_at, stalled.first_token_at = 1.0, 3.0, 1.1
    smp = samples([steady, stalled])
    assert len(smp["itl_s"]) == 9 + 2
    assert sorted(smp["itl_s"])[-1] == pytest.approx(1.89)
    assert sorted(smp["itl_s"])[0] == pytest.approx(0.01)  # a per-request mean would hide both
    assert smp["tpot_s"].tolist() == pytest.approx([0.9 / 9, 1.9 / 2])


def test_tpot_skips_failures_and_single_tokens() -> None:
    rs = [rec(0, tokens=1), rec(1, ok=False, kind="disconnect"), rec(2, e2e=1.0, ttft=0.1, tokens=10)]
    assert samples(rs)["tpot_s"].tolist() == pytest.approx([0.1])


def test_output_tokens_prefer_usage_over_chunks() -> None:
    r = rec(0, tokens=5)
    r.usage_output_tokens = 7
    r.finish_tokens()
    assert r.output_tokens == 7


def test_summary_keys_are_exactly_the_design_brief() -> None:
    rs = [rec(i, due=i * 0.1, queue_ms=5.0) for i in range(20)] + [rec(100, cls="summary", due=0.5, e2e=4.0)]
    s = summarize(rs, META)
    assert {"classes", "overall", "throughput", "validity"} <= set(s)
    assert list(s["classes"]) == ["chat", "summary"]
    for g in [*s["classes"].values(), s["overall"]]:
        assert {"count", "ok", "errors", "timeouts", "throughput"} <= set(g)
        for m in METRICS:
            # the design brief's keys, then the low end and the spread users of AIPerf and vllm bench expect
            assert list(g[m]) == list(STAT_KEYS) == ["p1", "p5", "p10", "p25", "p50", "p90", "p95", "p99", "p999",
                                                     "max", "mean", "min", "std"]
        assert set(g["throughput"]) == {"requests_per_s", "output_tokens_per_s"}
    assert {"dispatch_lag_p99_s", "valid"} <= set(s["validity"])
    assert s["overall"]["queue_s"]["p50"] == pytest.approx(0.005)


def test_throughput_goodput_and_warmup() -> None:
    rs = [rec(i, due=float(i), e2e=1.0, ttft=0.2 if i % 2 else 0.9, tokens=10) for i in range(10)]
    rs.append(rec(99, due=-5.0, e2e=50.0, warmup=True))
    s = summarize(rs, META)
    o = s["overall"]
    assert o["count"] == 10 and s["run"]["warmup_requests_excluded"] == 1
    # window: first due 0 .. last end 10
    assert o["throughput"]["requests_per_s"] == pytest.approx(1.0)
    assert o["throughput"]["output_tokens_per_s"] == pytest.approx(10.0)
    gp = s["classes"]["chat"]["goodput"]
    assert gp["fraction"] == pytest.approx(0.5) and gp["good"] == 5


def test_requests_cut_by_an_interrupt_are_counted_but_not_measured() -> None:
    rs = [rec(i, due=float(i)) for i in range(6)]
    rs += [rec(6, due=6.0, ok=False, kind="interrupted", ttft=None), rec(7, due=6.5, ok=False, kind="interrupted")]
    s = summarize(rs, {**META, "interrupted": {"after_s": 7.0, "grace_s": 5.0}})
    assert s["overall"]["count"] == 6 and s["overall"]["errors"] == 0 and s["overall"]["e2e_s"]["p99"] is not None
    assert s["interrupted"] == {"after_s": 7.0, "grace_s": 5.0, "sent": 8, "done": 6, "cut": 2}
    assert summarize(rs[:6], META)["interrupted"] is None


def test_order_statistic_bootstrap_matches_brute_force() -> None:
    rng = np.random.default_rng(11)
    x = rng.exponential(size=400)
    fast = bootstrap_percentiles(x, (99.0, 50.0), 20_000, np.random.default_rng(1))
    idx = rng.integers(0, len(x), size=(20_000, len(x)))
    s = np.sort(x[idx], axis=1)
    k99, k50 = math.ceil(0.99 * 400) - 1, math.ceil(0.5 * 400) - 1
    for col, k in ((0, k99), (1, k50)):
        for q in (5, 50, 95):
            assert np.percentile(fast[:, col], q) == pytest.approx(np.percentile(s[:, k], q), rel=0.03)
    ratio_fast = fast[:, 0] / fast[:, 1]
    ratio_brute = s[:, k99] / s[:, k50]
    for q in (2.5, 97.5):
        assert np.percentile(ratio_fast, q) == pytest.approx(np.percentile(ratio_brute, q), rel=0.03)


def test_bootstrap_ci_covers_the_true_tail_ratio() -> None:
    true = math.log(100) / math.log(2)  # P99/P50 of any exponential
    covered = 0
    for t in range(100):
        x = np.random.default_rng(1000 + t).exponential(3.0, size=2000)
        ci = tail_ratio_ci(x, n_boot=1000, seed=t)
        assert ci is not None
        covered += ci[0] <= true <= ci[1]
    assert 88 <= covered <= 99  # nominal 95%


def test_ratio_ci_covers_a_known_scale_change() -> None:
    covered = 0
    for t in range(60):
        rng = np.random.default_rng(5000 + t)
        before, after = rng.exponential(1.0, size=3000), rng.exponential(0.5, size=3000)
        ci = ratio_ci(after, before, 95.0, n_boot=1000, seed=t)
        assert ci is not None
        covered += ci[0] <= 0.5 <= ci[1]
    assert covered >= 52


def test_bootstrap_is_seeded() -> None:
    x = np.random.default_rng(0).exponential(size=500)
    assert tail_ratio_ci(x, seed=3) == tail_ratio_ci(x, seed=3)
    assert tail_ratio_ci(x, seed=3) != tail_ratio_ci(x, seed=4)


def test_low_percentiles_std_and_min_sit_beside_the_tail() -> None:
    d = describe([float(x) for x in range(1, 101)] + [math.inf])
    assert d["min"] == 1.0 and d["p1"] == pytest.approx(2.0) and d["p25"] == pytest.approx(26.0)
    assert d["std"] == pytest.approx(np.std(np.arange(1, 101)))  # numpy's (and vllm bench's): of the finite values
    assert d["max"] == math.inf and math.isnan(describe([])["std"])


def test_input_and_output_lengths_of_the_requests_that_succeeded() -> None:
    rs = [rec(i, tokens=10 + i) for i in range(4)] + [rec(9, tokens=3, ok=False, kind="http")]
    for r in rs:
        r.prompt_tokens = 100
    rs[0].usage_prompt_tokens = 106  # what the server counted wins over what the bench planned
    s = summarize(rs, META)
    lengths = s["overall"]["lengths"]
    assert lengths["input_tokens"]["max"] == 106 and lengths["input_tokens"]["min"] == 100
    assert lengths["input_tokens"]["mean"] == pytest.approx(101.5)
    assert lengths["output_tokens"]["p50"] == pytest.approx(11.5) and lengths["output_tokens"]["min"] == 10
    assert set(lengths["output_tokens"]) == set(STAT_KEYS)
    assert s["overall"]["input_tokens"] == 506 and s["overall"]["output_tokens"] == 10 + 11 + 12 + 13 + 3
