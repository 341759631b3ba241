"""Compare math: ratios, confidence intervals and the verdict, on records with known latencies."""

from __future__ import annotations

import numpy as np
import pytest

from tailguard.bench.compare import compare
from tailguard.bench.recorder import RequestRecord

META = {"seed": 0, "workload": {"name": "w", "classes": [{"name": "chat"}, {"name": "summary"}]}}


def records(e2e: np.ndarray, cls: str = "chat", timeouts: int = 0, start: int = 0) -> list[RequestRecord]:
    out = []
    for i, v in enumerate(e2e):
        r = RequestRecord(index=start + i, cls=cls, warmup=False, scheduled_at=float(i), sent_at=float(i),
                          ended_at=float(i) + float(v), ok=True, first_token_at=float(i) + float(v) / 4,
                          chunk_at=[float(i) + float(v) / 4, float(i) + float(v)])
        r.finish_tokens()
        out.append(r)
    for k in range(timeouts):
        out.append(RequestRecord(index=start + len(e2e) + k, cls=cls, warmup=False, scheduled_at=0.0,
                                 ended_at=60.0, error_kind="timeout", timeout_phase="first_token"))
    return out


def test_ratio_ci_and_verdict_when_the_tail_falls() -> None:
    rng = np.random.default_rng(0)
    # before: a bimodal tail (HOL blocking); after: the same body without the tail, and no timeouts
    before_chat = np.concatenate([rng.uniform(0.2, 0.3, 900), rng.uniform(10, 20, 100)])
    after_chat = rng.uniform(0.2, 0.3, 1000)
    before = records(before_chat, timeouts=10) + records(rng.uniform(30, 40, 50), "summary", start=5000)
    after = records(after_chat) + records(rng.uniform(33, 44, 50), "summary", start=5000)
    cmp = compare(before, META, after, META, seed=1, n_boot=500)
    assert list(cmp["classes"]) == ["chat", "summary"]
    chat = cmp["classes"]["chat"]
    p99 = chat["metrics"]["e2e_s"]["p99"]
    bp99 = float(np.percentile(np.concatenate([before_chat, [60.0] * 10]), 99))
    assert p99["before"] == pytest.approx(bp99, abs=2e-6)
    assert p99["after"] == pytest.approx(float(np.percentile(after_chat, 99)), abs=2e-6)
    assert p99["ratio"] == pytest.approx(p99["after"] / p99["before"], rel=1e-3)
    lo, hi = p99["ci95"]
    assert lo <= p99["ratio"] <= hi < 1.0
    assert chat["before"]["timeouts"] == 10 and chat["before"]["timeout_rate"] == pytest.approx(10 / 1010)
    v = chat["verdict"]
    assert v == {"metric": "e2e_s", "p99_fell": True, "p99_fell_significantly": True, "gap_narrowed": True,
                 "timeout_rate_fell": True}
    s = cmp["classes"]["summary"]
    assert s["metrics"]["e2e_s"]["p50"]["ratio"] == pytest.approx(1.1, rel=0.05)
    assert s["verdict"]["p99_fell"] is False and s["verdict"]["timeout_rate_fell"] is None
    assert {"before", "after", "classes", "overall"} <= set(cmp)


def test_same_distribution_gives_a_ci_around_one() -> None:
    rng = np.random.default_rng(2)
    a, b = records(rng.exponential(1.0, 3000)), records(rng.exponential(1.0, 3000))
    cmp = compare(a, META, b, META, n_boot=500)
    for key in ("p50", "p95", "p99"):
        lo, hi = cmp["overall"]["metrics"]["e2e_s"][key]["ci95"]
        assert lo < 1.0 < hi


def test_failures_make_a_worse_after_run() -> None:
    before = records(np.full(100, 1.0))
    after = records(np.full(95, 1.0))
    for i in range(5):
        after.append(RequestRecord(index=900 + i, cls="chat", warmup=False, scheduled_at=0.0, ended_at=0.01,
                                   status=503, error_kind="http"))
    cmp = compare(before, META, after, META, n_boot=200)
    p99 = cmp["classes"]["chat"]["metrics"]["e2e_s"]["p99"]
    assert p99["after"] is None and p99["ratio"] is None  # lands on a failure: +inf
    assert cmp["classes"]["chat"]["verdict"]["p99_fell"] is False
    assert cmp["classes"]["chat"]["after"]["errors"] == 5


def steady(n: int, every_s: float, tokens: int, cls: str = "chat", start: int = 0) -> list[RequestRecord]:
    """A request ending every `every_s` seconds, each streaming `tokens` chunks in its last second."""
    out = []
    for i in range(n):
        end = (i + 1) * every_s
        r = RequestRecord(index=start + i, cls=cls, warmup=False, scheduled_at=end - 1.0, sent_at=end - 1.0,
                          ended_at=end, ok=True, first_token_at=end - 1.0,
                          chunk_at=[end - 1.0 + k / tokens for k in range(tokens)])
        r.finish_tokens()
        out.append(r)
    return out


def test_throughput_and_goodput_rows_have_ratios_and_intervals() -> None:
    meta = {**META, "slo": {"chat": {"e2e_s": 2.0}}}
    before = steady(200, 0.5, 10)            # 2 requests/s, 20 tokens/s
    after = steady(250, 0.4, 10)             # 2.5 requests/s, 25 tokens/s
    tp = compare(before, meta, after, meta, n_boot=500)["classes"]["chat"]["throughput"]
    assert set(tp) == {"requests_per_s", "output_tokens_per_s", "goodput_per_s"}
    rps = tp["requests_per_s"]
    assert rps["before"] == pytest.approx(200 / 100.0, rel=0.02) and rps["after"] == pytest.approx(250 / 100.0, rel=0.02)
    assert rps["ratio"] == pytest.approx(1.25, rel=0.03)
    lo, hi = rps["ci95"]
    assert 1.0 < lo <= rps["ratio"] <= hi
    assert tp["output_tokens_per_s"]["ratio"] == pytest.approx(1.25, rel=0.03)
    assert tp["goodput_per_s"]["ratio"] == pytest.approx(1.25, rel=0.03)
    assert "goodput_per_s" not in compare(before, META, after, META, n_boot=100)["classes"]["chat"]["throughput"]


def test_overall_on_a_mixed_workload_judges_only_what_adds_up_across_classes() -> None:
    before = steady(100, 1.0, 32) + steady(10, 10.0, 2048, "summary", start=1000)
    after = steady(100, 1.0, 32) + steady(10, 10.0, 2048, "summary", start=1000)
    cmp = compare(before, META, after, META, n_boot=200)
    v = cmp["overall"]["verdict"]
    assert v["pooled"] is True and v["metric"] is None and "p99_fell" not in v and "describe the mix" in v["why"]
    assert v["output_tokens_ratio"] == pytest.approx(1.0) and v["timeout_rate_fell"] is None
    assert cmp["classes"]["chat"]["verdict"]["metric"] == "e2e_s"  # each class keeps its latency verdict
    one = compare(before[:100], META, after[:100], META, n_boot=200)
    assert "pooled" not in one["overall"]["verdict"]  # one class: overall is that class
