"""Callers' limits on plain numbers: a bucket a minute deep per limit, requests counted as they are
let in, tokens charged as requests end (a debt the caller waits out), and `Front.arrive` refusing
a caller over its limits before its request takes a place in the queue."""

from __future__ import annotations

import pytest

from tailguard.front.events import Arrive, Finished, Reject, Start
from tailguard.front.front import Front
from tailguard.front.limits import CallerLimits, Refusal, Standing
from tailguard.front.params import BackendSpec, CallerSpec, ClassSpec, FrontParams
from tailguard.types import Outcome


def test_a_caller_may_burst_its_rpm_and_then_goes_at_its_pace() -> None:
    limits = CallerLimits([CallerSpec("app", requests_per_minute=3)])
    for _ in range(3):
        assert limits.refusal("app", 0.0) is None
        limits.take_request("app", 0.0)
    refusal = limits.refusal("app", 0.0)
    assert refusal is not None and refusal.reason == "rate_limit_requests"
    assert refusal.retry_after_s == pytest.approx(20.0)  # 3 a minute: one every 20 s
    assert limits.refusal("app", 19.9) is not None and limits.refusal("app", 20.0) is None


def test_tokens_are_charged_at_the_end_and_a_debt_is_waited_out() -> None:
    limits = CallerLimits([CallerSpec("reports", tokens_per_minute=6000)])  # 100 a second
    assert limits.refusal("reports", 0.0) is None  # nothing used yet: a long request may start
    limits.charge("reports", 9000, 1.0)  # it ended having used 1.5 minutes' worth
    refusal = limits.refusal("reports", 1.0)
    assert refusal == Refusal("rate_limit_tokens", pytest.approx(30.01))  # 3001 short at 100/s
    assert limits.refusal("reports", 31.0) is not None and limits.refusal("reports", 31.02) is None


def test_who_has_no_limits_is_never_refused() -> None:
    limits = CallerLimits([CallerSpec("free"), CallerSpec("app", requests_per_minute=1)])
    for caller in (None, "free", "unknown"):
        for _ in range(100):
            limits.take_request(caller, 0.0)
            limits.charge(caller, 10**6, 0.0)
        assert limits.refusal(caller, 0.0) is None


def test_a_reload_keeps_what_a_caller_used_under_its_new_limits() -> None:
    limits = CallerLimits([CallerSpec("app", requests_per_minute=60), CallerSpec("gone", requests_per_minute=1)])
    for _ in range(60):
        limits.take_request("app", 0.0)
    limits.take_request("gone", 0.0)
    limits.reconfigure([CallerSpec("app", requests_per_minute=120), CallerSpec("new", tokens_per_minute=10)])
    assert limits.refusal("app", 0.0) is not None  # its bucket is still empty
    assert limits.refusal("app", 0.5) is None  # and refills at the new pace: 2 a second
    assert limits.refusal("gone", 0.0) is None  # no limits any more
    assert limits.refusal("new", 0.0) is None  # a new caller starts full


def test_the_front_refuses_a_caller_over_its_limits_before_it_is_queued() -> None:
    f = Front(FrontParams(classes=[ClassSpec(name="interactive", rank=0)], backends=[BackendSpec("a", max_concurrency=1)],
                          callers=[CallerSpec("app", requests_per_minute=2, tokens_per_minute=600)]))
    assert list(f.handle(Arrive("r1", "interactive", 50, caller="app"), 0.0)) == [Start("r1", "a")]
    assert list(f.handle(Arrive("r2", "interactive", 50, caller="app"), 0.0)) == []  # queued behind r1
    refused = list(f.handle(Arrive("r3", "interactive", 50, caller="app"), 0.0))
    assert refused == [Reject("r3", "rate_limit_requests", pytest.approx(30.0))] and "r3" not in f
    assert list(f.handle(Arrive("other", "interactive", 50, caller="web"), 0.0)) == []  # another caller is not held up
    f.handle(Finished("r1", Outcome.SUCCESS, tokens=1200), 1.0)  # two minutes' worth of tokens
    assert [d.reason for d in f.handle(Arrive("r4", "interactive", 50, caller="app"), 40.0)] == ["rate_limit_tokens"]  # type: ignore[union-attr]


def test_where_a_callers_limits_stand() -> None:
    limits = CallerLimits([CallerSpec("app", requests_per_minute=60, tokens_per_minute=600)])
    limits.take_request("app", 0.0)
    limits.charge("app", 900, 0.0)
    requests, tokens = limits.standing("app", 0.0)
    assert requests == Standing(60, 59, pytest.approx(1.0)) and tokens == Standing(600, 0, pytest.approx(90.0))
    assert limits.standing("nobody", 0.0) == (None, None)
