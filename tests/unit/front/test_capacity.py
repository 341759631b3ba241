"""The capacity signal with literal numbers: Little's law plus the backlog drained within the
tightest bound, over one backend's slots."""

from __future__ import annotations

import math

from tailguard.front.capacity import Capacity, CapacitySignal, PoolCapacity
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams


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


def test_each_pool_is_read_from_the_front_and_a_request_counts_where_it_ran() -> None:
    """Two pools: a request counts in its backend's pool, one that never ran in its class's first
    pool; each pool's reading uses its own classes' queue and bound and its own backends' slots."""
    front = Front(FrontParams(
        [ClassSpec("chat", max_queue_wait_s=1.0, pools=("gpu",)), ClassSpec("bulk", rank=1, max_queue_wait_s=10.0,
                                                                           pools=("cpu",))],
        [BackendSpec("g1", max_concurrency=8, pool="gpu"), BackendSpec("g2", max_concurrency=8, pool="gpu"),
         BackendSpec("c1", max_concurrency=2, pool="cpu")]))
    capacity = Capacity(window_s=60.0)
    assert capacity.measure(front, 0.0) == {"cpu": PoolCapacity(0, 1), "gpu": PoolCapacity(0, 2)}
    for i in range(1200):  # 20/s for 60 s, 2 s each, on the gpu pool: 40 slots busy, 5 backends of 8
        capacity.ended("g1", "chat", i / 20, 2.0)
    capacity.ended(None, "bulk", 59.0, None)  # refused before it ran: demand on the bulk class's pool
    capacity.ended("c1", "bulk", 59.5, 4.0)
    readings = capacity.measure(front, 60.0)
    assert readings["gpu"] == PoolCapacity(5, 2)
    # cpu: its signal began at 59 s, so 2 requests over its first second, the one that ran 4 s long.
    assert readings["cpu"] == PoolCapacity(math.ceil(2 / 1.0 * 4.0 / 2), 1)
    one_pool = Front(FrontParams([ClassSpec("chat", pools=("gpu",)), ClassSpec("bulk", rank=1, pools=("cpu",))],
                                 [BackendSpec("g1", pool="gpu")]))
    assert set(capacity.measure(one_pool, 61.0)) == {"gpu"} and set(capacity.signals) == {"gpu"}
