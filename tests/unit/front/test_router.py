"""Router: least relative load among healthy backends with room for the class; round-robin ties."""

from __future__ import annotations

from tailguard.front.slots import BackendPool
from tailguard.front.params import BackendSpec, ClassSpec, HealthParams, PreemptionParams, QueueParams
from tailguard.front.router import choose
from tailguard.front.queue import Pending

CLASSES = [ClassSpec(name="interactive", rank=0), ClassSpec(name="batch", rank=1, max_share=0.5)]


def pending(cls: str = "interactive") -> Pending:
    return Pending("r", cls, 0 if cls == "interactive" else 1, 10, 0.0, 30.0)


def make(*specs: tuple[str, int, float]) -> BackendPool:
    backends = [BackendSpec(name=n, max_concurrency=c, weight=w) for n, c, w in specs]
    return BackendPool(backends, CLASSES, HealthParams(unhealthy_after=1))


def take(pool: BackendPool, cls: str = "interactive") -> str | None:
    b = choose(pool, pending(cls), 0.0)
    if b is not None:
        pool.acquire(b, cls)
    return b


def test_equal_backends_take_turns() -> None:
    pool = make(("a", 4, 1.0), ("b", 4, 1.0), ("c", 4, 1.0))
    assert [take(pool) for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]


def test_least_relative_load_wins() -> None:
    pool = make(("small", 2, 1.0), ("big", 8, 1.0))
    order = [take(pool) for _ in range(10)]
    # Load = in_flight / max_concurrency: big fills to 1/2 before small takes its second.
    assert order == ["small", "big", "big", "big", "big", "small", "big", "big", "big", "big"]
    assert take(pool) is None


def test_weight_scales_capacity_in_the_comparison() -> None:
    pool = make(("a", 8, 1.0), ("b", 8, 3.0))
    order = [take(pool) for _ in range(4)]
    assert order == ["a", "b", "b", "b"]


def test_unhealthy_and_excluded_backends_are_skipped() -> None:
    pool = make(("a", 4, 1.0), ("b", 4, 1.0))
    pool.mark_failure("a")
    assert choose(pool, pending(), 0.0) == "b"
    assert choose(pool, pending(), 0.0, exclude=("b",)) is None
    pool.mark_success("a")
    assert choose(pool, pending(), 0.0, exclude=("b",)) == "a"


def test_class_share_limits_the_choice() -> None:
    pool = make(("a", 4, 1.0), ("b", 2, 1.0))
    # batch may hold 2 slots of a and 1 of b.
    assert [take(pool, "batch") for _ in range(4)] == ["a", "b", "a", None]
    # Both half full now: the tie goes to b, acquired less recently; then a has the lower load.
    assert [take(pool, "interactive") for _ in range(4)] == ["b", "a", "a", None]
