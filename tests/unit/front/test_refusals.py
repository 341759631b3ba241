"""Every refusal is the front's: the bodies waiting for a first start held to their budget, the
replicas' shared verdict on a caller, and this replica's share of each limit while Redis is away
(`LocalShare`), each a `Reject` that says what its words need; plain numbers, no loop."""

from __future__ import annotations

from tailguard.front.events import Arrive, Finished, LocalShare, Reject, SharedVerdict, Start, Tick
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, CallerSpec, ClassSpec, FrontParams, QueueParams
from tailguard.types import Outcome, RejectReason

CLASSES = [ClassSpec(name="interactive", rank=0, max_queue_wait_s=5.0)]


def front(budget: int | None = 1000, callers: list[CallerSpec] | None = None, slots: int = 1) -> Front:
    return Front(FrontParams(classes=CLASSES, backends=[BackendSpec("a", slots)],
                             queue=QueueParams(max_queued_body_bytes=budget), callers=callers or []))


def test_queued_bodies_are_held_to_their_budget_until_they_first_start_or_leave() -> None:
    f = front(1000)
    assert [type(d) for d in f.handle(Arrive("r0", "interactive", 10, body_bytes=900), 0.0)] == [Start]  # not queued
    assert list(f.handle(Arrive("r1", "interactive", 10, body_bytes=600), 0.1)) == []  # waits: 600 held
    assert list(f.handle(Arrive("r2", "interactive", 10, body_bytes=500), 0.2)) == [
        Reject("r2", RejectReason.QUEUE_FULL, 1.0, 1000, 600)]
    assert list(f.handle(Arrive("r3", "interactive", 10, body_bytes=400), 0.3)) == []  # 1000 exactly: in
    assert list(f.handle(Finished("r0", Outcome.SUCCESS), 0.4)) == [Start("r1", "a")]  # r1 started: 600 back
    assert list(f.handle(Arrive("r4", "interactive", 10, body_bytes=600), 0.5)) == []
    f.handle(Finished("r3", Outcome.CLIENT_GONE), 0.6)  # left while queued: 400 back
    assert list(f.handle(Arrive("r5", "interactive", 10, body_bytes=400), 0.7)) == []
    [*expired] = f.handle(Tick(), 5.6)  # r4 waited past its bound (5 s): its body goes too
    assert [d.id for d in expired if isinstance(d, Reject)] == ["r4"]
    assert list(f.handle(Arrive("r6", "interactive", 10, body_bytes=600), 5.65)) == []


def test_no_budget_bounds_nothing() -> None:
    f = front(None)
    f.handle(Arrive("r0", "interactive", 10, body_bytes=10**9), 0.0)
    assert list(f.handle(Arrive("r1", "interactive", 10, body_bytes=10**9), 0.1)) == []


def test_the_shared_verdict_on_a_caller_is_the_fronts_refusal_and_a_grant_still_meets_its_own_limits() -> None:
    f = front(None, [CallerSpec("team", requests_per_minute=1)], slots=4)
    over = SharedVerdict(RejectReason.RATE_LIMIT_TOKENS, 2.5, 1000, 998)
    assert list(f.handle(Arrive("r0", "interactive", 10, caller="team", shared=over), 0.0)) == [
        Reject("r0", RejectReason.RATE_LIMIT_TOKENS, 2.5, 1000, 998, shared=True)]
    gone = SharedVerdict(RejectReason.SHARED_STATE_UNAVAILABLE, 1.0)
    [unavailable] = f.handle(Arrive("r1", "interactive", 10, caller="team", shared=gone), 0.1)
    assert isinstance(unavailable, Reject) and unavailable.reason is RejectReason.SHARED_STATE_UNAVAILABLE
    granted = SharedVerdict()
    assert [type(d) for d in f.handle(Arrive("r2", "interactive", 10, caller="team", shared=granted), 0.2)] == [Start]
    [own] = f.handle(Arrive("r3", "interactive", 10, caller="team", shared=granted), 0.3)
    assert isinstance(own, Reject) and (own.reason, own.limit, own.used, own.shared) == (
        RejectReason.RATE_LIMIT_REQUESTS, 1, 1, False)


def test_while_redis_is_away_each_limit_is_a_share_here_and_whole_again_once_it_is_back() -> None:
    f = front(None, [CallerSpec("team", max_parallel=6)], slots=10)
    f.handle(LocalShare(3), 0.0)
    starts = [f.handle(Arrive(f"r{i}", "interactive", 10, caller="team"), 0.1)[0] for i in range(3)]
    assert [type(d) for d in starts] == [Start, Start, Reject]  # 6 / 3 here
    refused = starts[2]
    assert isinstance(refused, Reject) and (refused.reason, refused.limit, refused.used) == (
        RejectReason.RATE_LIMIT_PARALLEL, 2, 2)
    f.handle(LocalShare(None), 0.2)
    assert [type(f.handle(Arrive(f"s{i}", "interactive", 10, caller="team"), 0.3)[0]) for i in range(5)] == [
        Start, Start, Start, Start, Reject]  # 6 in all with the two running


def test_a_share_spent_while_redis_was_away_does_not_bind_once_it_is_back() -> None:
    """Redis decided the caller's tokens before and after: the front's own bucket is fresh at each
    change, so a replica that spent its local share lets the caller in again once Redis is back."""
    f = front(None, [CallerSpec("team", tokens_per_minute=3000)], slots=100)
    f.handle(LocalShare(2), 0.0)
    local = [f.handle(Arrive(f"r{i}", "interactive", 100, caller="team"), 0.1)[0] for i in range(16)]
    assert [type(d) for d in local].count(Start) == 15  # 1500 of 3000 here
    f.handle(LocalShare(None), 0.2)
    back = [f.handle(Arrive(f"s{i}", "interactive", 100, caller="team", shared=SharedVerdict()), 0.3)[0]
            for i in range(4)]
    assert [type(d) for d in back] == [Start] * 4
