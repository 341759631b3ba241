"""The admission estimate on plain numbers: completions in, drain rate, predicted waits,
refusals and Retry-After out."""

from __future__ import annotations

import math

import pytest

from tailguard.front.admission import Admission
from tailguard.front.params import QueueParams


def measured(interval_s: float, cfg: QueueParams = QueueParams()) -> Admission:
    """Two completions `interval_s` apart with requests queued: a rate of 1/interval."""
    a = Admission(cfg)
    a.completed(0.0, queued=1)
    a.completed(interval_s, queued=1)
    return a


def test_the_example_in_the_docstring() -> None:
    a = Admission(QueueParams())
    a.completed(now=0.0, queued=3)
    a.completed(now=0.5, queued=2)
    predicted_s = a.predict_s(ahead=4)
    assert predicted_s == pytest.approx(2.0)
    assert a.refusal_s(predicted_s, budget_s=1.0) == pytest.approx(1.0)


def test_nothing_is_known_before_two_completions_while_backlogged() -> None:
    a = Admission(QueueParams())
    assert a.drain_rate() is None and a.predict_s(5) is None
    a.completed(0.0, queued=3)
    assert a.drain_rate() is None
    # With no prediction every request is admitted, and Retry-After is the configured minimum.
    assert a.refusal_s(None, budget_s=0.0) is None
    assert a.queue_full_s(10) == 1.0 and a.retry_after_s() == 1.0


def test_completions_after_an_idle_gap_start_the_window_afresh() -> None:
    a = Admission(QueueParams())
    a.completed(0.0, queued=0)
    a.completed(100.0, queued=1)  # nothing was queued in between: the gap measures demand
    assert a.drain_rate() is None
    a.completed(101.0, queued=1)
    assert a.drain_rate() == pytest.approx(1.0)
    a.emptied()  # the queue ran empty: the next gap may be idle time
    a.completed(200.0, queued=1)
    assert a.drain_rate() is None


def test_the_rate_is_counted_over_a_window_of_the_latest_completions() -> None:
    a = Admission(QueueParams(drain_ewma_weight=0.5))  # window max(8, 4 / 0.5) = 8
    for i in range(8):
        a.completed(float(i), queued=1)  # one a second
    assert a.drain_rate() == pytest.approx(1.0)
    for i in range(7):
        a.completed(8.0 + 0.5 * i, queued=1)  # then two a second
    # The window holds 7.0 .. 11.0 only: the first seven, at the slower pace, have left it.
    assert a.drain_rate() == pytest.approx(7 / 4.0)
    a.completed(11.0, queued=1)
    a.completed(11.0, queued=1)  # a burst: the window is now 8.5 .. 11.0, three of them at 11
    assert a.drain_rate() == pytest.approx(7 / 2.5)


def test_completions_at_one_instant_give_an_infinite_rate_and_no_wait() -> None:
    a = measured(0.0)
    assert a.drain_rate() == math.inf
    assert a.predict_s(3) == 0.0
    assert a.retry_after_s() == 1.0  # 1 / inf, floored at the minimum


def test_predicted_wait_is_the_work_ahead_over_the_rate() -> None:
    a = measured(0.25)  # 4 per s
    assert a.predict_s(0) == 0.0
    assert a.predict_s(6) == pytest.approx(1.5)


def test_a_request_is_refused_past_the_admit_share_of_its_budget() -> None:
    a = measured(1.0)
    # 0.8 of a 10 s budget is 8 s: an 8 s wait is admitted, 8.5 s is not.
    assert a.refusal_s(8.0, budget_s=10.0) is None
    assert a.refusal_s(8.5, budget_s=10.0) == 1.0  # 8.5 - 10 < 0: floored at the minimum
    assert a.refusal_s(12.0, budget_s=10.0) == pytest.approx(2.0)
    # A bound already past: retry after the whole expected wait.
    assert a.refusal_s(5.0, budget_s=-3.0) == pytest.approx(5.0)
    # Nothing ahead is admitted whatever the budget left.
    assert a.refusal_s(0.0, budget_s=0.0) is None


def test_retry_after_stays_within_the_configured_bounds() -> None:
    cfg = QueueParams(retry_after_min_s=2.0, retry_after_max_s=30.0)
    a = measured(100.0, cfg)  # 0.01 per s
    assert a.retry_after_s() == 30.0
    assert a.queue_full_s(0) == 30.0
    assert a.refusal_s(1000.0, budget_s=10.0) == 30.0
    fast = measured(0.1, cfg)
    assert fast.retry_after_s() == 2.0
    assert fast.queue_full_s(4) == pytest.approx(2.0)  # (4 + 1) / 10 = 0.5, floored
    assert fast.queue_full_s(99) == pytest.approx(10.0)  # (99 + 1) / 10


def test_waits_longer_than_predicted_scale_later_predictions_up() -> None:
    a = measured(1.0, QueueParams(drain_ewma_weight=0.5))
    assert a.refusal_s(4.0, budget_s=10.0) is None  # 4 s <= 8 s
    # Predicted 0.9 s, waited 2.9 s: sample (2.9 + 0.1) / (0.9 + 0.1) = 3; factor 1 -> 2.
    a.learn(0.9, waited_s=2.9)
    assert a.refusal_s(4.0, budget_s=10.0) is None  # 4 * 2 = 8 s, just within
    a.learn(0.9, waited_s=2.9)  # factor 2 -> 2.5
    assert a.refusal_s(4.0, budget_s=10.0) == pytest.approx(1.0)  # 10 s expected: 10 - 10, floored
    assert a.refusal_s(6.0, budget_s=10.0) == pytest.approx(5.0)  # 15 - 10


def test_the_wait_factor_stays_within_its_bounds_and_ignores_unpredicted_waits() -> None:
    a = measured(1.0, QueueParams(drain_ewma_weight=1.0))
    a.learn(None, waited_s=1000.0)  # a requeued request: no prediction to compare with
    assert a.refusal_s(8.0, budget_s=10.0) is None
    a.learn(0.0, waited_s=1000.0)  # a huge ratio: capped at 8
    assert a.refusal_s(1.0, budget_s=10.0) is None  # 8 s
    assert a.refusal_s(1.1, budget_s=10.0) is not None  # 8.8 s
    a.learn(1000.0, waited_s=0.0)  # a tiny ratio: floored at 0.5
    assert a.refusal_s(16.0, budget_s=10.0) is None  # 8 s
    assert a.refusal_s(16.5, budget_s=10.0) is not None


def test_carry_over_keeps_the_measurements_under_new_bounds() -> None:
    a = measured(0.5, QueueParams(drain_ewma_weight=1.0))
    a.learn(0.9, waited_s=1.9)  # factor 2
    b = a.carry_over(QueueParams(retry_after_min_s=0.1))
    assert b.drain_rate() == pytest.approx(2.0)
    assert b.refusal_s(4.5, budget_s=10.0) == pytest.approx(0.1)  # 9 s expected > 8 s; 9 - 10, floored
    # Still backlogged: the next completion extends the window instead of restarting it.
    b.completed(1.0, queued=0)
    assert b.drain_rate() == pytest.approx(2.0)
    assert a.drain_rate() == pytest.approx(2.0)  # the old one is left as it was


def test_a_target_is_admitted_by_the_last_backlogs_rate_until_this_one_is_measured() -> None:
    """After an idle spell the window starts afresh (the wait bound predicts nothing), but a TTFT
    target still has the rate the last backlog drained at."""
    a = Admission(QueueParams())
    a.completed(0.0, queued=1)
    a.completed(0.5, queued=1)
    a.emptied()
    a.completed(100.0, queued=1)
    assert a.predict_s(4) is None
    assert a.recent_predict_s(4) == pytest.approx(2.0)
    assert Admission(QueueParams()).recent_predict_s(4) is None
