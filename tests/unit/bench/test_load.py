"""Pure parts of the load module: config checks, URL normalising, rescaling to simulated time."""

from __future__ import annotations

import pytest

from tailguard.bench.load import BenchConfig, RunResult, Timeouts, rescale
from tailguard.bench.target import base_url
from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import summarize
from tailguard.bench.workload import load_workload, parse_workload
from tailguard.errors import ConfigError


@pytest.mark.parametrize("kw,msg", [
    ({}, "--concurrency N"),
    ({"concurrency": 2, "rate": 3.0, "requests": 5}, "not both"),
    ({"concurrency": 0, "requests": 5}, "at least 1"),
    ({"rate": -1.0, "requests": 5}, "> 0"),
    ({"rate": 1.0}, "--requests N or --duration S"),
    ({"rate": 1.0, "requests": 5, "duration_s": 3.0}, "--requests N or --duration S"),
    ({"rate": 1.0, "requests": 5, "timeouts": Timeouts(total_s=0)}, "timeouts"),
    ({"rate": 1.0, "requests": 5, "warmup_requests": -1}, "--warmup"),
    ({"rate": 1.0, "requests": 5, "time_scale": 0.0}, "--time-scale"),
    ({"rate": 1.0, "requests": 5, "interrupt_grace_s": -1.0}, "--interrupt-grace"),
])
def test_config_errors(kw: dict, msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        BenchConfig(url="http://x", **kw).check(load_workload("chat-only")[0])


def test_classes_with_their_own_arrivals_need_no_rate() -> None:
    w = parse_workload({"name": "a", "classes": [{"name": "n", "arrival": {"rate": 2.0}}]})
    BenchConfig(url="http://x", requests=3).check(w)


@pytest.mark.parametrize("url", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"])
def test_base_url(url: str) -> None:
    assert base_url(url) == "http://h:1"


def test_rescale_reads_in_simulated_seconds_and_keeps_validity_in_wall_time() -> None:
    recs = []
    for i in range(100):
        r = RequestRecord(index=i, cls="chat", warmup=False, scheduled_at=i * 0.1, sent_at=i * 0.1 + 0.001,
                          ended_at=i * 0.1 + 0.05, ok=True, first_token_at=i * 0.1 + 0.01,
                          chunk_at=[i * 0.1 + 0.01, i * 0.1 + 0.05])
        r.finish_tokens()
        recs.append(r)
    meta = {"max_dispatch_lag_s": 0.005, "loop_lag_s": {"p50": 0.0, "p99": 0.002, "max": 0.004, "samples": 9},
            "workload": {"name": "w", "classes": [{"name": "chat"}]}}
    result = RunResult(recs, meta)
    rescale(result, 0.1)
    r = result.records[3]
    assert r.e2e_s == pytest.approx(0.5) and r.ttft_s == pytest.approx(0.1) and r.chunk_at[1] == pytest.approx(3.5)
    s = summarize(result.records, result.meta)
    assert s["overall"]["e2e_s"]["p50"] == pytest.approx(0.5)
    assert s["validity"]["valid"] is True  # 1 ms of wall lag is 10 "simulated" ms, under the scaled 50 ms
    assert s["validity"]["threshold_s"] == pytest.approx(0.05) and s["run"]["time_scale"] == 0.1
