"""The retry budget the front and the client share, driven with literal times. (The client's
cases are in tests/unit/client/test_retry.py, the front's in tests/unit/front/test_front.py.)"""

from __future__ import annotations

import pytest

from tailguard.front.params import RetryParams
from tailguard.front.retry import retry_budget
from tailguard.retry_budget import RetryBudget


def withdrawn(budget: RetryBudget, now: float, tries: int = 1000) -> int:
    return sum(budget.try_withdraw(now) for _ in range(tries))


def test_calls_leave_the_window_a_slice_at_a_time() -> None:
    budget = RetryBudget(ratio=1.0, min_per_s=0.0, ttl_s=10.0)  # slices of 1 s
    for t in (0.0, 0.5, 3.2, 9.9):
        budget.record_call(t)
    assert withdrawn(budget, 9.9) == 4
    budget = RetryBudget(ratio=1.0, min_per_s=0.0, ttl_s=10.0)
    for t in (0.0, 0.5, 3.2, 9.9):
        budget.record_call(t)
    assert withdrawn(budget, 10.0) == 2  # the slice [0, 1) left the window: 3.2 and 9.9 remain
    assert withdrawn(budget, 19.99) == 0  # 9.9's slice left too; the two retries still count
    budget.record_call(20.0)
    assert withdrawn(budget, 20.0) == 1  # the retries left with their slice [10, 11)

def test_any_window_is_ten_slices_and_the_floor_is_per_second_of_it() -> None:
    budget = RetryBudget(ratio=0.0, min_per_s=4.0, ttl_s=0.5)  # 2 retries per half second, slices of 50 ms
    assert withdrawn(budget, 0.0) == 2
    assert withdrawn(budget, 0.49) == 0
    assert withdrawn(budget, 0.5) == 2
    # The front rounded a window up to whole seconds before (3.5 s: 4 s and a floor of 4 retries).
    assert withdrawn(RetryBudget(ratio=0.0, min_per_s=1.0, ttl_s=3.5), 0.0) == 3


def test_a_clock_that_steps_back_counts_in_the_newest_slice() -> None:
    budget = RetryBudget(ratio=1.0, min_per_s=0.0, ttl_s=10.0)
    budget.record_call(100.0)
    budget.record_call(95.0)  # not in a slice of the past that the window has reused
    assert withdrawn(budget, 100.0) == 2
    assert withdrawn(budget, 110.0) == 0  # both left with the newest slice


def test_a_long_silence_empties_the_window_at_once() -> None:
    budget = RetryBudget(ratio=1.0, min_per_s=0.0, ttl_s=10.0)
    for i in range(100):
        budget.record_call(i * 0.1)
    assert withdrawn(budget, 1e9) == 0


def test_the_front_builds_its_budget_from_its_parameters() -> None:
    budget = retry_budget(RetryParams(budget_ratio=0.5, min_retries_per_s=0.2, window_s=10.0))
    assert (budget.ratio, budget.min_per_s, budget.ttl_s) == (0.5, 0.2, 10.0)
    for _ in range(10):
        budget.record_call(0.0)
    assert withdrawn(budget, 0.0) == 7  # 50% of 10 plus 0.2/s over 10 s


def test_nonsense_is_refused() -> None:
    for kw in ({"ratio": -0.1}, {"min_per_s": -1.0}, {"ttl_s": 0.0}):
        with pytest.raises(ValueError):
            RetryBudget(**kw)
