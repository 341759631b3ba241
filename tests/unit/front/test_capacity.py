"""The capacity signal with literal numbers: Little's law plus the backlog drained within the
tightest bound, over one backend's slots."""

from __future__ import annotations

from tailguard.front.capacity import CapacitySignal


def _steady(signal: CapacitySignal, rate: float, service_s: float, until: float) -> None:
    n = int(rate * until)
    for i in range(n):
        signal.ended(i / rate, service_s)


def test_no_history_says_nothing() -> None:
    assert CapacitySignal().needed(10.0, queued=5, bound_s=1.0, slots_per_backend=8) == 0


def test_steady_load_needs_its_busy_slots_over_a_backends_slots() -> None:
    s = CapacitySignal(window_s=60.0)
    _steady(s, rate=20.0, service_s=2.0, until=60.0)  # 40 slots busy on average
    assert s.needed(60.0, queued=0, bound_s=1.0, slots_per_backend=8) == 5
    assert s.needed(60.0, queued=0, bound_s=1.0, slots_per_backend=16) == 3


def test_a_backlog_must_drain_within_the_tightest_bound() -> None:
    s = CapacitySignal(window_s=60.0)
    _steady(s, rate=20.0, service_s=2.0, until=60.0)
    # 40 queued to start within 2 s: 20 more starts a second, 40 more slots busy.
    assert s.needed(60.0, queued=40, bound_s=2.0, slots_per_backend=8) == 10


def test_refused_requests_are_demand_and_old_ones_leave_the_window() -> None:
    s = CapacitySignal(window_s=10.0)
    for i in range(100):  # 10/s served for 1 s each, and as many refused (never ran)
        s.ended(i * 0.1, 1.0)
        s.ended(i * 0.1, None)
    assert s.needed(10.0, queued=0, bound_s=1.0, slots_per_backend=4) == 5  # 20/s x 1 s / 4
    assert s.needed(100.0, queued=0, bound_s=1.0, slots_per_backend=4) == 0  # nothing left in the window
