"""The window `tailguard top` reads: rates and quantiles over snapshots, with literal numbers."""

from __future__ import annotations

import math

from tailguard.doctor.evidence import Samples
from tailguard.doctor.window import Window, top


def _page(requests: float, fast: float, slow: float) -> Samples:
    cls = ("class", "chat")
    return {
        ("tailguard_requests_total", (cls, ("outcome", "success"))): requests,
        ("tailguard_ttft_seconds_bucket", (cls, ("le", "0.1"))): fast,
        ("tailguard_ttft_seconds_bucket", (cls, ("le", "1.0"))): fast + slow,
        ("tailguard_ttft_seconds_bucket", (cls, ("le", "+Inf"))): fast + slow,
    }


def test_rates_and_quantiles_cover_only_the_window() -> None:
    w = Window(span_s=60.0)
    w.add(0.0, _page(100, 100, 0))
    w.add(5.0, _page(110, 100, 0))
    w.add(70.0, _page(130, 190, 10))  # the base is the last snapshot at or before 70 - 60 s: the one at 5 s
    assert w.rate("tailguard_requests_total", "class") == {"chat": 20 / 65}
    p50 = w.quantile("tailguard_ttft_seconds", 0.5, "class")["chat"]
    p99 = w.quantile("tailguard_ttft_seconds", 0.99, "class")["chat"]
    assert p50 is not None and math.isclose(p50, 0.05 * 100 / 90)  # 50 of the 90 fast ones
    assert p99 is not None and 0.1 < p99 <= 1.0


def test_a_restarted_gateway_counts_from_zero_and_an_idle_class_has_no_quantile() -> None:
    w = Window()
    w.add(0.0, _page(500, 10, 0))
    w.add(10.0, _page(20, 10, 0))  # restarted: its counters began again
    assert w.rate("tailguard_requests_total", "class") == {"chat": 2.0}
    assert w.quantile("tailguard_ttft_seconds", 0.99, "class") == {"chat": None}


def test_top_breaks_ties_by_name() -> None:
    assert top({"b": 1.0, "a": 1.0, "c": 5.0}, 2) == [("c", 5.0), ("a", 1.0)]
