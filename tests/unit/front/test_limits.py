"""Callers' limits on plain numbers: a bucket a minute deep per limit, a request's tokens reserved
as it is let in (all of its caller's buckets at once or none) and settled against what it really
used as it leaves, whatever the outcome; requests at once; and `Front` holding one reservation per
request through its retries, suspensions and every way it can end."""

from __future__ import annotations

import random

import pytest

from tailguard.front.events import Arrive, Close, Failed, Finished, Generated, Opened, Reject, Start, StartMode, Suspend, Tick
from tailguard.front.front import Front
from tailguard.front.limits import CallerLimits, Standing
from tailguard.front.refusal import Refusal
from tailguard.front.params import BackendSpec, CallerSpec, ClassSpec, FrontParams, RetryParams
from tailguard.types import FailureKind, Outcome


def tokens_left(limits: CallerLimits | Front, caller: str, now: float) -> int:
    s = limits.standing(caller, now)[1]
    assert s is not None
    return s.remaining


def why(r: Refusal | None) -> tuple[str, float] | None:
    """A refusal's reason and wait (its limit and use are `test_refusals`')."""
    return None if r is None else (r.reason, r.retry_after_s)


def test_a_caller_may_burst_its_rpm_and_then_goes_at_its_pace() -> None:
    limits = CallerLimits([CallerSpec("app", requests_per_minute=3)])
    for _ in range(3):
        assert limits.refusal("app", 10, 0.0) is None
        limits.take("app", 10, 0.0)
    refusal = limits.refusal("app", 10, 0.0)
    assert refusal is not None and refusal.reason == "rate_limit_requests"
    assert refusal.retry_after_s == pytest.approx(20.0)  # 3 a minute: one every 20 s
    assert limits.refusal("app", 10, 19.9) is not None and limits.refusal("app", 10, 20.0) is None


def test_tokens_are_reserved_on_arrival_and_the_unused_part_refunded_at_the_end() -> None:
    limits = CallerLimits([CallerSpec("app", tokens_per_minute=6000)])  # 100 a second
    held = limits.take("app", 1000, 0.0)
    assert held == 1000 and tokens_left(limits, "app", 0.0) == 5000
    # 5500 is 500 short: five seconds at 100 a second.
    assert why(limits.refusal("app", 5500, 0.0)) == ("rate_limit_tokens", pytest.approx(5.0))
    limits.settle("app", held, 300, 0.0)  # it used 300 of its 1000
    assert tokens_left(limits, "app", 0.0) == 5700 and limits.refusal("app", 5500, 0.0) is None


def test_an_estimate_that_fell_short_is_charged_as_debt_and_waited_out() -> None:
    limits = CallerLimits([CallerSpec("reports", tokens_per_minute=6000)])
    held = limits.take("reports", 500, 0.0)
    limits.settle("reports", held, 9000, 1.0)  # used far more than it held: 2900 in debt (100 refilled)
    assert tokens_left(limits, "reports", 1.0) == 0
    assert why(limits.refusal("reports", 100, 1.0)) == ("rate_limit_tokens", pytest.approx(30.0))
    assert limits.refusal("reports", 100, 31.0) is None


def test_a_request_larger_than_a_minute_waits_for_a_full_bucket_then_goes_into_debt() -> None:
    limits = CallerLimits([CallerSpec("big", tokens_per_minute=600)])
    limits.settle("big", limits.take("big", 300, 0.0), 300, 0.0)
    assert why(limits.refusal("big", 5000, 0.0)) == ("rate_limit_tokens", pytest.approx(30.0))
    assert limits.refusal("big", 5000, 30.0) is None
    assert limits.take("big", 5000, 30.0) == 5000 and tokens_left(limits, "big", 30.0) == 0


def test_all_buckets_or_none() -> None:
    limits = CallerLimits([CallerSpec("app", requests_per_minute=1, tokens_per_minute=600)])
    limits.take("app", 100, 0.0)
    assert why(limits.refusal("app", 100, 0.0)) == ("rate_limit_requests", pytest.approx(60.0))
    assert tokens_left(limits, "app", 0.0) == 500  # the refused request took no tokens
    limits.take("app", 500, 60.0)  # a minute on: its request came back; its tokens too, but 500 went
    assert limits.refusal("app", 200, 120.0) is None
    tight = CallerLimits([CallerSpec("t", requests_per_minute=10, tokens_per_minute=60)])
    tight.take("t", 60, 0.0)
    assert tight.refusal("t", 10, 0.0) is not None
    assert tight.standing("t", 0.0)[0] == Standing(10, 9, pytest.approx(6.0))  # the refusal took no request


def test_requests_at_once_are_bounded_and_freed_as_each_ends() -> None:
    limits = CallerLimits([CallerSpec("app", max_parallel=2)])
    a, b = limits.take("app", 10, 0.0), limits.take("app", 10, 0.0)
    assert why(limits.refusal("app", 10, 0.0)) == ("rate_limit_parallel", 1.0)
    limits.settle("app", a, 10, 1.0)
    assert limits.refusal("app", 10, 1.0) is None
    limits.settle("app", b, 10, 1.0)


def test_concurrent_reservations_never_overspend() -> None:
    """Hundreds of requests of random sizes arriving over a few seconds, each let in only when
    it fits: what is held at any instant never passes the minute's capacity plus what refilled."""
    rng = random.Random(7)
    limits = CallerLimits([CallerSpec("app", tokens_per_minute=6000)])
    admitted, t = 0, 0.0
    for _ in range(500):
        t += rng.expovariate(50.0)  # ~10 s in all
        need = rng.randint(1, 800)
        if limits.refusal("app", need, t) is None:
            admitted += limits.take("app", need, t)
    assert admitted <= 6000 + 100 * t  # none is settled: everything admitted is still held
    assert admitted > 6000 + 100 * t - 800  # and the bucket was used to within one request


def test_who_has_no_limits_is_never_refused() -> None:
    limits = CallerLimits([CallerSpec("free"), CallerSpec("app", requests_per_minute=1)])
    for caller in ("free", "unknown"):
        for _ in range(100):
            limits.settle(caller, limits.take(caller, 10**6, 0.0), 10**6, 0.0)
        assert limits.refusal(caller, 10**6, 0.0) is None


def test_a_reload_keeps_what_a_caller_used_under_its_new_limits() -> None:
    limits = CallerLimits([CallerSpec("app", requests_per_minute=60), CallerSpec("gone", requests_per_minute=1)])
    for _ in range(60):
        limits.take("app", 0, 0.0)
    limits.take("gone", 0, 0.0)
    limits.reconfigure([CallerSpec("app", requests_per_minute=120), CallerSpec("new", tokens_per_minute=10)])
    assert limits.refusal("app", 0, 0.0) is not None  # its bucket is still empty
    assert limits.refusal("app", 0, 0.5) is None  # and refills at the new pace: 2 a second
    assert limits.refusal("gone", 0, 0.0) is None  # no limits any more
    assert limits.refusal("new", 0, 0.0) is None  # a new caller starts full
    limits.settle("gone", 0, 5, 1.0)  # one that ends after its limits went changes nothing


# --- through the front -----------------------------------------------------------------------------

CLASSES = [ClassSpec(name="interactive", rank=0, max_queue_wait_s=5.0),
           ClassSpec(name="batch", rank=1, max_queue_wait_s=600.0, preemptible=True)]


def front(max_concurrency: int = 1, **caller: int) -> Front:
    return Front(FrontParams(classes=CLASSES, backends=[BackendSpec("a", max_concurrency=max_concurrency, continues=True),
                                                        BackendSpec("b", max_concurrency=max_concurrency)],
                             retry=RetryParams(max_attempts=3), callers=[CallerSpec("app", **caller)]))


def test_the_front_refuses_a_caller_over_its_limits_before_it_is_queued() -> None:
    f = Front(FrontParams(classes=CLASSES, backends=[BackendSpec("a", max_concurrency=1)],
                          callers=[CallerSpec("app", requests_per_minute=2, tokens_per_minute=600)]))
    assert list(f.handle(Arrive("r1", "interactive", 50, caller="app"), 0.0)) == [Start("r1", "a")]
    assert list(f.handle(Arrive("r2", "interactive", 50, caller="app"), 0.0)) == []  # queued behind r1
    refused = list(f.handle(Arrive("r3", "interactive", 50, caller="app"), 0.0))
    assert refused == [Reject("r3", "rate_limit_requests", pytest.approx(30.0), 2, 2)] and "r3" not in f
    assert list(f.handle(Arrive("other", "interactive", 50, caller="web"), 0.0)) == []  # another caller is not held up
    f.handle(Finished("r1", Outcome.SUCCESS, tokens=1200), 1.0)  # two minutes' worth of tokens
    assert [d.reason for d in f.handle(Arrive("r4", "interactive", 50, caller="app"), 40.0)] == ["rate_limit_tokens"]  # type: ignore[union-attr]


@pytest.mark.parametrize("outcome", list(Outcome))
def test_every_outcome_settles_to_exactly_what_was_used(outcome: Outcome) -> None:
    f = front(tokens_per_minute=6000)
    f.handle(Arrive("r", "interactive", 700, caller="app"), 0.0)
    assert tokens_left(f, "app", 0.0) == 5300
    f.handle(Finished("r", outcome, tokens=120), 0.0)  # 0 where no engine answered: all goes back
    assert tokens_left(f, "app", 0.0) == 5880


def test_a_request_that_expires_or_is_shut_out_of_the_queue_gets_all_back() -> None:
    f = Front(FrontParams(classes=[ClassSpec(name="interactive", max_queue_wait_s=1.0),
                                   ClassSpec(name="batch", rank=1, max_queue_wait_s=600.0)],
                          backends=[BackendSpec("a", max_concurrency=2, reserved_slots=0)],
                          callers=[CallerSpec("app", tokens_per_minute=6000)]))  # 100 a second
    f.handle(Arrive("run", "interactive", 100, caller="app"), 0.0)
    f.handle(Arrive("run2", "interactive", 100, caller="app"), 0.0)
    f.handle(Arrive("late", "interactive", 1000, caller="app"), 0.0)  # both slots taken: it queues
    f.handle(Arrive("shut", "batch", 2000, caller="app"), 0.0)
    assert tokens_left(f, "app", 0.0) == 2800
    assert [d.id for d in f.handle(Tick(), 1.0) if isinstance(d, Reject)] == ["late"]
    assert tokens_left(f, "app", 1.0) == 2800 + 100 + 1000  # a second's refill, and all it held
    assert [d for d in f.handle(Close(), 1.0) if isinstance(d, Reject)] == [Reject("shut", "shutting_down", 1.0)]
    assert tokens_left(f, "app", 1.0) == 5900  # only the two running still hold theirs


def test_retries_and_a_suspension_share_the_requests_one_reservation() -> None:
    f = front(tokens_per_minute=6000)
    assert list(f.handle(Arrive("c", "interactive", 500, caller="app"), 0.0)) == [Start("c", "a")]
    f.handle(Failed("c", FailureKind.RESET), 0.0)  # tried again: nothing more reserved
    f.handle(Failed("c", FailureKind.RESET), 0.0)
    assert tokens_left(f, "app", 0.0) == 5500
    f.handle(Finished("c", Outcome.UPSTREAM_ERROR, tokens=0), 0.0)
    assert tokens_left(f, "app", 0.0) == 6000

    f.handle(Arrive("b1", "batch", 1100, resumable=True, max_tokens=1000, caller="app"), 1.0)
    f.handle(Arrive("b2", "batch", 1100, resumable=True, max_tokens=1000, caller="app"), 1.0)
    f.handle(Generated("b1", 300), 1.0)
    f.handle(Opened("b1"), 1.0)
    assert Suspend("b1", "a") in f.handle(Arrive("c2", "interactive", 100, caller="app"), 1.0)
    assert tokens_left(f, "app", 1.0) == 6000 - 2300
    assert Start("b1", "a", StartMode.CONTINUE) in f.handle(Finished("c2", Outcome.SUCCESS, tokens=60), 1.0)
    f.handle(Finished("b1", Outcome.SUCCESS, tokens=900), 1.0)  # resumed on its one reservation
    f.handle(Finished("b2", Outcome.CLIENT_GONE, tokens=40), 1.0)  # streamed, then its client left
    assert tokens_left(f, "app", 1.0) == 6000 - 60 - 900 - 40
