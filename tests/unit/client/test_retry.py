"""Backoff, Retry-After and the retry budget, driven with literal numbers and a seeded rng."""

from __future__ import annotations

import math
import random
from email.utils import formatdate

import pytest

from tailguard.client import RetryBudget
from tailguard.client.retry import NoRetry, RetryAfter, RetryPolicy, parse_retry_after


def test_full_jitter_draws_from_a_doubling_window_up_to_the_cap() -> None:
    policy = RetryPolicy(max_attempts=100, base_delay=1.0, max_delay=8.0)
    rng = random.Random(1)
    for attempts, window in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0), (40, 8.0)):
        draws = [policy.decide(attempts, 503, None, rng) for _ in range(2000)]
        delays = [d.delay_s for d in draws if isinstance(d, RetryAfter)]
        assert len(delays) == 2000
        assert 0 <= min(delays) < 0.05 * window  # full jitter: from zero ...
        assert 0.95 * window < max(delays) <= window  # ... to the window
        assert abs(sum(delays) / len(delays) - window / 2) < 0.05 * window


def test_429_backs_off_over_a_longer_window_than_503() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay=1.0, max_delay=8.0, overload_factor=2.0)
    rng = random.Random(2)
    d503 = [policy.decide(1, 503, None, rng) for _ in range(2000)]
    d429 = [policy.decide(1, 429, None, rng) for _ in range(2000)]
    assert max(d.delay_s for d in d503 if isinstance(d, RetryAfter)) <= 1.0
    assert 1.9 < max(d.delay_s for d in d429 if isinstance(d, RetryAfter)) <= 2.0


def test_retry_after_is_a_floor_the_jitter_is_added_to() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay=1.0, max_delay=8.0)
    rng = random.Random(3)
    delays = [d.delay_s for d in (policy.decide(1, 429, 5.0, rng) for _ in range(1000)) if isinstance(d, RetryAfter)]
    assert min(delays) >= 5.0 and max(delays) <= 7.0
    assert max(delays) - min(delays) > 1.5  # callers told the same instant still spread out


def test_give_up_reasons() -> None:
    policy = RetryPolicy(max_attempts=3, max_retry_after=60)
    rng = random.Random(0)
    assert policy.decide(1, 400, None, rng) == NoRetry("not_retryable")
    assert policy.decide(1, 401, None, rng) == NoRetry("not_retryable")
    assert policy.decide(1, 500, None, rng) == NoRetry("not_retryable")
    assert policy.decide(3, 503, None, rng) == NoRetry("attempts")
    assert policy.decide(1, 429, 61.0, rng) == NoRetry("retry_after_too_long")
    assert policy.decide(1, 429, math.inf, rng) == NoRetry("retry_after_too_long")
    for status in (None, 408, 409, 429, 502, 503, 504):
        assert isinstance(policy.decide(1, status, None, rng), RetryAfter)


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base_delay=-1)


NOW = 1_700_000_000.0


@pytest.mark.parametrize("headers,expected", [
    ({}, None),
    ({"Retry-After": "3"}, 3.0),
    ({"retry-after": "0.25"}, 0.25),
    ({"Retry-After": "-5"}, 0.0),
    ({"retry-after-ms": "1500", "Retry-After": "9"}, 1.5),
    ({"retry-after-ms": "soon", "Retry-After": "2"}, 2.0),
    ({"Retry-After": formatdate(NOW + 120, usegmt=True)}, 120.0),
    ({"Retry-After": formatdate(NOW - 120, usegmt=True)}, 0.0),
    ({"Retry-After": "198300"}, 198300.0),
    ({"Retry-After": "1e400"}, math.inf),
    ({"Retry-After": "next tuesday"}, None),
    ({"Retry-After": "nan"}, None),
])
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, NOW) == expected


def test_budget_allows_a_share_of_recent_calls_plus_a_floor() -> None:
    budget = RetryBudget(ratio=0.2, min_per_s=0.5, ttl_s=10.0)  # floor: 5 retries per 10 s
    for i in range(100):
        budget.record_call(i * 0.01)
    granted = sum(budget.try_withdraw(1.0) for _ in range(100))
    assert granted == 5 + 20


def test_budget_deposits_and_withdrawals_expire_after_ttl() -> None:
    budget = RetryBudget(ratio=0.0, min_per_s=0.1, ttl_s=10.0)  # one retry per 10 s
    assert budget.try_withdraw(0.0)
    assert not budget.try_withdraw(5.0)
    assert budget.try_withdraw(10.5)
    for _ in range(50):
        budget.record_call(11.0)
    assert not budget.try_withdraw(11.0)  # ratio 0: calls buy no retries


def test_budget_with_no_floor_refuses_a_client_that_sent_nothing() -> None:
    assert not RetryBudget(ratio=0.2, min_per_s=0.0).try_withdraw(0.0)
