"""The validity verdict: which requests lagged, by how much, the likely cause and its advice, and
the threshold stated in the run's own units."""

from __future__ import annotations

from typing import Any

from tailguard.bench.recorder import RequestRecord
from tailguard.bench.validity import validity, verdict_line

META: dict[str, Any] = {"max_dispatch_lag_s": 0.005, "mode": "closed", "loop_lag_s": {"p99": 0.001, "max": 0.002}}


def recs(lags: list[float]) -> list[RequestRecord]:
    return [RequestRecord(index=i, cls="chat", warmup=False, scheduled_at=i * 0.1, sent_at=i * 0.1 + lag,
                          ended_at=i * 0.1 + 0.5, ok=True) for i, lag in enumerate(lags)]


def test_on_time_is_valid_and_says_its_threshold() -> None:
    v = validity(recs([0.0001] * 40), META)
    assert v["valid"] is True and v["late"] == {"count": 0, "of": 40, "worst": []} and v["cause"] is None
    assert verdict_line(v).startswith("VALID run: dispatch lag P99 0.1 ms, threshold 5.0 ms")


def test_a_cold_first_request_is_named_and_the_advice_is_warmup() -> None:
    v = validity(recs([0.0113] + [0.00006] * 39), META)
    assert v["valid"] is False and v["cause"] == "start"
    assert v["late"] == {"count": 1, "of": 40, "worst": [{"index": 0, "lag_s": 0.0113}]}
    assert "1 of 40 requests were sent late (#0 by 11.3 ms)" in v["reason"]
    assert "--warmup 1" in v["advice"] and "rate" not in v["advice"]


def test_an_open_loop_that_falls_behind_is_told_to_lower_the_rate() -> None:
    v = validity(recs([0.0001] * 50 + [0.001 * i for i in range(50)]), {**META, "mode": "open"})
    assert v["valid"] is False and v["cause"] == "rate" and "lower --rate" in v["advice"]
    assert v["late"]["count"] == 44 and [w["index"] for w in v["late"]["worst"]] == [99, 98, 97]
    assert "and 41 more" in v["reason"]


def test_scattered_lag_with_a_stalled_loop_blames_the_cpu_not_the_rate() -> None:
    lags = [0.0001] * 100
    for i in (20, 45, 70, 95):
        lags[i] = 0.02
    stalled = validity(recs(lags), {**META, "mode": "open", "loop_lag_s": {"p99": 0.003, "max": 0.03}})
    assert stalled["cause"] == "stall" and "core of its own" in stalled["advice"]
    busy = validity(recs(lags), META)
    assert busy["cause"] == "busy" and "--concurrency" in busy["advice"]


def test_a_time_scaled_run_states_the_threshold_in_simulated_units_and_why() -> None:
    # Times divided by the time scale 0.25: 0.4 ms of wall lag reads 1.6 ms, the 5 ms threshold 20 ms.
    v = validity(recs([0.0016] * 40), {**META, "max_dispatch_lag_s": 0.02, "time_scale": 0.25})
    assert v["valid"] is True and v["threshold_wall_s"] == 0.005
    line = verdict_line(v)
    assert "1.6 ms simulated" in line and "threshold 20.0 ms simulated (5 ms wall / time scale 0.25" in line


def stalled(share_waiting: float, share_running: float) -> dict[str, Any]:
    return {**META, "mode": "open", "loop_lag_s": {"p99": 0.003, "max": 0.2},
            "loop_stalls": {"count": 4, "wall_s": 0.84, "late_s": 0.8, "waiting_s": 0.8 * share_waiting,
                            "running_s": 0.8 * share_running, "source": "/proc/thread-self/schedstat"},
            "host": {"cpus": 2, "load_average": [11.64, 7.79, 3.65]}}


def test_a_stall_measured_by_the_kernel_names_where_its_time_went() -> None:
    lags = [0.0001] * 100
    for i in (20, 45, 70, 95):
        lags[i] = 0.02
    starved = validity(recs(lags), stalled(0.9, 0.05))
    assert starved["cause"] == "starved" and starved["loop_stalls"]["count"] == 4
    assert ("was late 4 times (0.80 s past due in all, wall); its thread waited for a CPU 90% of that and ran its "
            "own code 5% (load average 11.64 on 2 CPUs at the end): other processes held the CPUs") in starved["advice"]
    # waiting that began before the tick was due (runnable at a chunk's arrival) counts at most all of it
    assert "waited for a CPU 100% of that" in validity(recs(lags), stalled(1.3, 0.0))["advice"]
    own = validity(recs(lags), stalled(0.2, 0.7))
    assert own["cause"] == "own-work" and "--workers N" in own["advice"]
    blocked = validity(recs(lags), stalled(0.1, 0.1))
    assert blocked["cause"] == "blocked" and "a call blocked its loop" in blocked["advice"]
    # no measurement (not Linux, or an older run.json): the guess, as before
    guessed = validity(recs(lags), {**stalled(0.9, 0.05), "loop_stalls": None})
    assert guessed["cause"] == "stall" and "loop_stalls" not in guessed
