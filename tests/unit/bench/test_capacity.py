"""The capacity search of `tailguard bench --find-capacity` (`bench.capacity`), on plain numbers: a
made-up service that meets its SLO below a rate, and the comparison of two searches."""

from __future__ import annotations

import pytest

from tailguard.bench.capacity import CapacitySearch, compare


def search_against(true_capacity: float, start: float, precision: float = 0.05) -> CapacitySearch:
    s = CapacitySearch(start, precision)
    while (rate := s.next_rate()) is not None:
        s.add(rate, rate <= true_capacity, valid=True, share=1.0 if rate <= true_capacity else 0.9)
    return s


@pytest.mark.parametrize("start", [0.5, 3.0, 7.0, 40.0])
def test_the_search_brackets_the_capacity_within_its_precision(start: float) -> None:
    s = search_against(7.3, start)
    lo, hi = s.result()["bracket"]
    assert lo <= 7.3 < hi and hi <= lo * 1.05
    assert s.result()["capacity_per_s"] == lo
    assert "bracketed" in (s.stopped or "")


def test_an_invalid_run_ends_the_search_and_says_why() -> None:
    s = CapacitySearch(2.0)
    assert s.next_rate() == 2.0
    s.add(2.0, True, valid=True)
    assert s.next_rate() == 4.0
    s.add(4.0, True, valid=False, reason="dispatch lag P99 12.0 ms")
    assert s.next_rate() is None
    assert s.result()["bracket"] == [2.0, 4.0]  # an invalid run counts as failing: nothing above it is known
    assert "12.0 ms" in (s.stopped or "") and "not valid" in (s.stopped or "")


def test_a_service_that_never_meets_the_slo_has_no_capacity() -> None:
    s = search_against(0.0, 1.0)
    assert s.result()["capacity_per_s"] == 0.0 and s.result()["bracket"][0] is None


def test_the_ratio_of_two_capacities_with_the_interval_their_brackets_allow() -> None:
    c = compare({"bracket": [2.0, 2.1]}, {"bracket": [5.0, 5.2]})
    assert c["ratio"] == pytest.approx(2.5)
    assert c["interval"][0] == pytest.approx(5.0 / 2.1) and c["interval"][1] == pytest.approx(5.2 / 2.0)
    assert compare({"bracket": [2.0, None]}, {"bracket": [5.0, 5.2]})["interval"] == [None, pytest.approx(2.6)]
