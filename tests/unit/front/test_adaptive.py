"""The adaptive cap (front/adaptive.py) with literal latencies, and the front driving it: the
ledger's cap, shares and reservation follow it, a cap that grows lets the queue in, a reload keeps
or restarts it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tailguard.front.adaptive import AdaptiveCap, AdaptiveParams
from tailguard.front.events import Arrive, Decision, Finished, Observed, Reconfigure, Start
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams
from tailguard.front.slots import BackendPool
from tailguard.types import Outcome

LOOSE = AdaptiveParams(min_cap=2, max_cap=64)


def feed(cap: AdaptiveCap, n: int, ttft_s: float | None, itl_s: float | None, in_flight: int | None = None) -> int:
    """`n` samples, each with the backend full (in flight = the cap) unless told otherwise."""
    for _ in range(n):
        cap.observe(ttft_s, itl_s, cap.cap if in_flight is None else in_flight)
    return cap.cap


def test_it_starts_at_the_backends_cap_or_its_own_start_within_the_bounds() -> None:
    assert AdaptiveCap(LOOSE, 8).cap == 8
    assert AdaptiveCap(AdaptiveParams(min_cap=2, max_cap=64, initial=20), 8).cap == 20
    assert AdaptiveCap(LOOSE, 500).cap == 64
    assert AdaptiveCap(AdaptiveParams(min_cap=4, max_cap=64), 1).cap == 4


def test_bounds_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="min"):
        AdaptiveParams(min_cap=9, max_cap=4)


def test_steady_latency_on_a_full_backend_grows_the_cap_to_its_max() -> None:
    cap = AdaptiveCap(LOOSE, 4)
    seen = [feed(cap, 10, 0.05, 0.01) for _ in range(40)]
    assert seen == sorted(seen) and seen[0] >= 4
    assert seen[-1] == 64


def test_a_backend_that_is_not_full_does_not_grow_its_cap() -> None:
    cap = AdaptiveCap(LOOSE, 16)
    assert feed(cap, 200, 0.05, 0.01, in_flight=7) == 16  # fewer than half in flight: not what limits


def test_latency_that_doubles_brings_the_cap_down_and_it_holds_once_latency_settles() -> None:
    cap = AdaptiveCap(LOOSE, 48)
    feed(cap, 100, 0.05, 0.01)
    high = cap.cap
    low = feed(cap, 60, 0.5, 0.05)  # the engine queues: TTFT 10x, ITL 5x
    assert low < high / 2
    assert feed(cap, 3, 0.05, 0.01) >= low  # back to normal: the long average is pulled down, it grows again


def test_one_outlier_costs_at_most_a_twentieth_of_the_cap() -> None:
    cap = AdaptiveCap(LOOSE, 40)
    feed(cap, 20, 0.05, None)
    before = cap._estimate
    cap.observe(50.0, None, 40)
    assert cap._estimate >= before * 0.95


def test_itl_alone_moves_it_and_no_latency_leaves_it() -> None:
    cap = AdaptiveCap(LOOSE, 32)
    assert feed(cap, 5, None, None) == 32
    feed(cap, 20, None, 0.01)
    assert feed(cap, 60, None, 0.04) < 32
    assert AdaptiveCap(LOOSE, 32).observe(None, None, 32) == 32


def test_it_never_leaves_its_bounds() -> None:
    cap = AdaptiveCap(AdaptiveParams(min_cap=3, max_cap=10), 10)
    assert feed(cap, 20, 0.05, 0.01) == 10
    assert feed(cap, 25, 5.0, 1.0) == 3  # 100x slower: 10 -> 3 in 18 samples, and no lower


# --- the ledger and the front -----------------------------------------------------------------

CLASSES = [ClassSpec("chat", rank=0), ClassSpec("bulk", rank=1, max_share=0.5)]


def params(adaptive: AdaptiveParams | None = LOOSE, cap: int = 8, continues: bool = True) -> FrontParams:
    return FrontParams(classes=CLASSES, backends=[BackendSpec("gpu", max_concurrency=cap, continues=continues,
                                                              adaptive=adaptive)])


def slow_down(front: Front, now: float, n: int = 30) -> None:
    """Ten quick samples, then `n` twenty times slower: the cap falls by about a tenth a sample."""
    for _ in range(10):
        front.handle(Observed("gpu", 0.05, 0.01), now)
    for _ in range(n):
        front.handle(Observed("gpu", 1.0, 0.1), now)


def starts(decisions: Sequence[Decision]) -> list[str]:
    return [d.id for d in decisions if isinstance(d, Start)]


def fill(front: Front, prefix: str, n: int, now: float) -> list[str]:
    started = []
    for i in range(n):
        started += starts(front.handle(Arrive(f"{prefix}{i}", "chat", 100), now))
    return started


def test_shares_and_the_reservation_follow_the_cap() -> None:
    classes = [ClassSpec("chat", rank=0), ClassSpec("bulk", rank=1)]
    pool = BackendPool(params(continues=False, cap=16).backends, classes)  # no suspending: a quarter reserved
    assert (pool["gpu"].cap, pool.slots_for("gpu", "bulk")) == (16, 12)
    for _ in range(16):
        pool.acquire("gpu", "chat")
    for _ in range(10):
        pool.observe("gpu", 0.05, 0.01)  # quick: 16 -> 20
    assert (pool["gpu"].cap, pool.slots_for("gpu", "bulk")) == (20, 15)
    for _ in range(14):
        pool.observe("gpu", 1.0, 0.1)  # twenty times slower: 20 -> 9
    assert (pool["gpu"].cap, pool.slots_for("gpu", "bulk"), pool.slots_for("gpu", "chat")) == (9, 7, 9)
    assert not pool.has_capacity("gpu", "chat")  # 16 in flight over a cap of 9: nothing new until 8 end


def test_a_fixed_cap_ignores_latency_and_so_does_a_backend_nobody_knows() -> None:
    front = Front(params(adaptive=None))
    slow_down(front, 0.0)
    assert front.backend("gpu").cap == 8
    assert front.handle(Observed("gone", 1.0, 1.0), 0.0) == ()


def test_a_slower_backend_holds_fewer_and_a_faster_one_lets_the_queue_in() -> None:
    front = Front(params(cap=8))
    assert len(fill(front, "a", 8, 0.0)) == 8
    slow_down(front, 1.0)
    low = front.backend("gpu").cap
    assert low == 2
    assert fill(front, "b", 6, 1.5) == []
    started: list[str] = []
    for i in range(8):  # the eight running end: only `low` of the six waiting start
        started += starts(front.handle(Finished(f"a{i}", Outcome.SUCCESS), 2.0))
    assert started == ["b0", "b1"] and front.backend("gpu").in_flight == low
    for _ in range(400):  # quick again: each step up of the cap starts whoever waits
        started += starts(front.handle(Observed("gpu", 0.05, 0.01), 3.0))
    assert started == [f"b{i}" for i in range(6)] and front.backend("gpu").cap > 6


def test_a_reload_keeps_what_was_learnt_unless_the_adaptive_settings_change() -> None:
    front = Front(params(cap=8))
    fill(front, "a", 8, 0.0)
    slow_down(front, 1.0)
    learnt = front.backend("gpu").cap
    front.handle(Reconfigure(params(cap=12)), 2.0)
    assert front.backend("gpu").cap == learnt and front.backend("gpu").max_concurrency == 12
    front.handle(Reconfigure(params(AdaptiveParams(min_cap=2, max_cap=32), cap=12)), 3.0)
    assert front.backend("gpu").cap == 12
    front.handle(Reconfigure(params(None, cap=6)), 4.0)
    assert front.backend("gpu").cap == 6
