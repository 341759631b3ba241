"""The slot ledger: slot shares by rank, reservations, acquire/release, health flips."""

from __future__ import annotations

import pytest

from tailguard.front.params import BackendSpec, ClassSpec, HealthParams
from tailguard.front.slots import BackendPool

THREE = [
    ClassSpec(name="interactive", rank=0),
    ClassSpec(name="standard", rank=1, max_share=0.75),
    ClassSpec(name="batch", rank=2, max_share=0.5),
]


def pool(max_concurrency: int = 8, classes: list[ClassSpec] = THREE, **health: int) -> BackendPool:
    return BackendPool(
        [BackendSpec(name="a", max_concurrency=max_concurrency, continues=True)], classes,
        HealthParams(**health),  # type: ignore[arg-type]
    )


def fill(p: BackendPool, cls: str) -> int:
    n = 0
    while p.has_capacity("a", cls):
        p.acquire("a", cls)
        n += 1
    return n


def test_shares_are_rounded_down_with_at_least_one_slot() -> None:
    assert pool(8).slots_for("a", "batch") == 4
    assert pool(7).slots_for("a", "standard") == 5  # floor(5.25)
    assert pool(1).slots_for("a", "batch") == 1  # a class is never locked out entirely
    assert pool(8).slots_for("a", "interactive") == 8


def test_lower_ranks_share_one_budget_and_leave_the_rest_to_higher_ranks() -> None:
    p = pool(8)
    assert fill(p, "batch") == 4
    # standard and batch together may hold 6: two more for standard.
    assert fill(p, "standard") == 2
    assert fill(p, "interactive") == 2
    assert p.in_flight("a") == 8 and p.in_flight("a", "batch") == 4


def test_release_frees_a_slot_for_that_class() -> None:
    p = pool(8)
    fill(p, "batch")
    assert not p.has_capacity("a", "batch")
    p.release("a", "batch")
    assert p.has_capacity("a", "batch")


def test_acquire_without_capacity_and_release_without_acquire_are_errors() -> None:
    p = pool(1)
    p.acquire("a", "batch")
    with pytest.raises(RuntimeError, match="no free slot"):
        p.acquire("a", "interactive")
    p.release("a", "batch")
    with pytest.raises(RuntimeError, match="release without acquire"):
        p.release("a", "batch")


def test_unhealthy_after_consecutive_failures_and_back_after_successes() -> None:
    p = pool(unhealthy_after=3, healthy_after=2)
    assert p.is_healthy("a")
    assert p.mark_failure("a") is False
    assert p.mark_failure("a") is False
    p.mark_success("a")  # resets the streak
    assert p.mark_failure("a") is False and p.mark_failure("a") is False
    assert p.mark_failure("a") is True and not p.is_healthy("a") and not p.any_healthy()
    assert p.mark_failure("a") is False  # already unhealthy: no second flip
    assert p.mark_success("a") is False
    assert p.mark_success("a") is True and p.is_healthy("a")


def test_a_backend_that_cannot_continue_keeps_a_quarter_of_its_slots_for_the_top_rank() -> None:
    classes = [ClassSpec(name="interactive", rank=0), ClassSpec(name="batch", rank=1)]
    p = BackendPool([BackendSpec(name="a", max_concurrency=8)], classes)
    assert fill(p, "batch") == 6  # 8 // 4 = 2 kept for chats
    assert fill(p, "interactive") == 2
    one = BackendPool([BackendSpec(name="a", max_concurrency=1)], classes)
    assert fill(one, "batch") == 1  # a single slot cannot be split


def test_reservation_follows_the_kind_and_an_explicit_setting() -> None:
    classes = [ClassSpec(name="interactive", rank=0), ClassSpec(name="batch", rank=1)]
    p = BackendPool([BackendSpec(name="a", max_concurrency=4)], classes)
    assert p.slots_for("a", "batch") == 3
    p.set_continues("a", True)  # detected: a kind that can be preempted needs no reservation
    assert p.slots_for("a", "batch") == 4
    fixed = BackendPool([BackendSpec(name="a", max_concurrency=4, continues=True, reserved_slots=2)], classes)
    assert fixed.slots_for("a", "batch") == 2 and fixed.slots_for("a", "interactive") == 4
