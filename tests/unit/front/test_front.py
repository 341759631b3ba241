"""The front driven through event sequences on plain numbers: what goes in at which `now`, and the
decisions that come out. No loop, no socket: the same calls the gateway and the DES make."""

from __future__ import annotations

import pytest

from tailguard.front.events import (
    Arrive, Close, Ejected, Failed, Finished, Generated, GiveUp, GiveUpReason, HealthChanged, KindLearned, Opened,
    Probed, Readmitted, Reject, Start, StartMode, Suspend, Tick, WrongEvent,
)
from tailguard.front.front import Front
from tailguard.front.tracked import State
from tailguard.front.params import (
    BackendSpec, ClassSpec, EjectionParams, FrontParams, HealthParams, PreemptionParams, QueueParams, RetryParams,
)
from tailguard.types import FailureKind, Outcome

CLASSES = [ClassSpec(name="interactive", rank=0, max_queue_wait_s=5.0),
           ClassSpec(name="batch", rank=1, max_queue_wait_s=600.0, preemptible=True)]


def make(*backends: BackendSpec, retry: RetryParams = RetryParams(), unhealthy_after: int = 3,
         preemption: bool = True, ejection: EjectionParams = EjectionParams()) -> Front:
    return Front(FrontParams(
        classes=CLASSES, backends=list(backends) or [BackendSpec("a", max_concurrency=1, continues=True)],
        queue=QueueParams(), preemption=PreemptionParams(enabled=preemption), retry=retry,
        health=HealthParams(unhealthy_after=unhealthy_after), ejection=ejection,
    ))


def batch(f: Front, req_id: str, now: float, max_tokens: int = 1000) -> list[object]:
    return list(f.handle(Arrive(req_id, "batch", 100 + max_tokens, resumable=True, max_tokens=max_tokens), now))


def chat(f: Front, req_id: str, now: float) -> list[object]:
    return list(f.handle(Arrive(req_id, "interactive", 50, max_tokens=20), now))


def test_a_free_slot_is_bound_at_once_and_a_finish_hands_it_on() -> None:
    f = make()
    assert chat(f, "c1", 0.0) == [Start("c1", "a")]
    assert chat(f, "c2", 0.1) == []
    assert f.state("c2") is State.QUEUED and len(f) == 1
    assert list(f.handle(Finished("c1", Outcome.SUCCESS), 0.5)) == [Start("c2", "a")]
    assert list(f.handle(Finished("c2", Outcome.SUCCESS), 0.9)) == []
    assert "c2" not in f and len(f) == 0


def test_a_chat_suspends_a_running_batch_job_which_resumes_after_it() -> None:
    f = make()
    assert batch(f, "b1", 0.0) == [Start("b1", "a")]
    assert list(f.handle(Generated("b1", 300), 0.05)) == []  # what a preemption weighs; decides nothing
    assert list(f.handle(Opened("b1"), 0.1)) == []  # nobody waits yet
    assert chat(f, "c1", 1.0) == [Suspend("b1", "a"), Start("c1", "a")]
    assert f.state("b1") is State.SUSPENDED
    assert list(f.handle(Finished("c1", Outcome.SUCCESS), 1.2)) == [Start("b1", "a", StartMode.CONTINUE)]
    assert list(f.handle(Finished("b1", Outcome.SUCCESS), 3.0)) == []


def test_no_suspension_before_the_upstream_is_open_then_at_once() -> None:
    f = make()
    batch(f, "b1", 0.0)
    assert chat(f, "c1", 0.01) == []  # b1's relay has no upstream yet: nothing to stop
    assert list(f.handle(Opened("b1"), 0.02)) == [Suspend("b1", "a"), Start("c1", "a")]


def test_without_preemption_or_for_a_non_resumable_body_the_chat_waits() -> None:
    f = make(preemption=False)
    batch(f, "b1", 0.0)
    f.handle(Opened("b1"), 0.0)
    assert chat(f, "c1", 0.1) == []
    g = make()
    assert list(g.handle(Arrive("b1", "batch", 500, resumable=False), 0.0)) == [Start("b1", "a")]
    g.handle(Opened("b1"), 0.0)
    assert chat(g, "c1", 0.1) == []


def test_a_kind_that_cannot_continue_keeps_a_slot_for_chats_instead() -> None:
    f = make(BackendSpec("a", max_concurrency=4))  # continues=False: one slot reserved
    for i in range(4):
        batch(f, f"b{i}", 0.0)
    assert f.state("b3") is State.QUEUED  # the fourth slot is the chats'
    assert chat(f, "c1", 0.1) == [Start("c1", "a")]
    assert list(f.handle(KindLearned("a", True), 0.2)) == []  # detected later: no reservation, but the slot is taken
    assert list(f.handle(Finished("c1", Outcome.SUCCESS), 0.3)) == [Start("b3", "a")]


def test_a_reset_is_retried_on_the_same_backend_once_then_elsewhere() -> None:
    f = make(BackendSpec("a", max_concurrency=2, continues=True), BackendSpec("b", max_concurrency=2, continues=True))
    [start] = chat(f, "c1", 0.0)
    assert isinstance(start, Start)
    first = start.backend
    other = "b" if first == "a" else "a"
    reset = FailureKind.RESET
    assert list(f.handle(Failed("c1", reset), 0.1)) == [Start("c1", first, StartMode.RETRY, reset, first)]  # fresh
    assert list(f.handle(Failed("c1", reset), 0.2)) == [Start("c1", other, StartMode.RETRY, reset, first)]
    # max_attempts (3) used up: the driver ends it.
    assert list(f.handle(Failed("c1", reset), 0.3)) == [GiveUp("c1", GiveUpReason.ATTEMPTS, reset, other)]
    f.handle(Finished("c1", Outcome.UPSTREAM_ERROR), 0.3)
    assert all(b.in_flight == 0 for b in f.backends())


def test_a_refused_connection_goes_elsewhere_and_ejects_its_backend_for_a_while() -> None:
    f = make(BackendSpec("a", max_concurrency=1, continues=True), BackendSpec("b", max_concurrency=1, continues=True),
             ejection=EjectionParams(consecutive_failures=1, base_s=3.0))
    [start] = chat(f, "c1", 0.0)
    assert isinstance(start, Start)
    bad = start.backend
    good = "b" if bad == "a" else "a"
    assert list(f.handle(Failed("c1", FailureKind.CONNECT), 0.1)) == [
        Ejected(bad, 3.0, 1, FailureKind.CONNECT, 1), Start("c1", good, StartMode.RETRY, FailureKind.CONNECT, bad)]
    assert f.backend(bad).state == "ejected"
    assert chat(f, "c2", 0.2) == []  # the only backend in is busy; the ejected one is skipped
    assert f.next_wakeup() == pytest.approx(3.1)  # the ejection ends before c2's wait bound
    f.handle(Finished("c1", Outcome.SUCCESS), 1.0)  # c2 takes the good one's slot
    chat(f, "c3", 1.1)
    assert list(f.handle(Tick(), 3.1)) == [Readmitted(bad), Start("c3", bad)]


def test_with_one_backend_a_refusal_is_not_retried_and_deadlines_never_are() -> None:
    f = make()
    chat(f, "c1", 0.0)
    # Nowhere else to go, and never back to the backend that refused.
    assert list(f.handle(Failed("c1", FailureKind.CONNECT), 0.1)) == [
        GiveUp("c1", GiveUpReason.NO_BACKEND, FailureKind.CONNECT, "a")]
    f.handle(Finished("c1", Outcome.UPSTREAM_ERROR), 0.1)
    chat(f, "c2", 0.2)
    assert list(f.handle(Failed("c2", FailureKind.TIMEOUT_FIRST_TOKEN, answered=True), 0.3)) == [
        GiveUp("c2", GiveUpReason.NOT_RETRYABLE, FailureKind.TIMEOUT_FIRST_TOKEN, "a")]


def test_the_retry_budget_bounds_retries_to_a_share_of_requests() -> None:
    f = make(BackendSpec("a", max_concurrency=100, continues=True),
             retry=RetryParams(budget_ratio=0.1, min_retries_per_s=0.0, window_s=10.0))
    retried = 0
    for i in range(50):
        chat(f, f"c{i}", 0.01 * i)
        if any(isinstance(d, Start) for d in f.handle(Failed(f"c{i}", FailureKind.RESET), 0.01 * i)):
            retried += 1
    assert retried == 5  # 10% of 50


def test_a_client_gone_while_queued_or_suspended_leaves_no_trace() -> None:
    f = make()
    batch(f, "b1", 0.0)
    f.handle(Opened("b1"), 0.0)
    chat(f, "c1", 0.1)  # b1 suspended
    chat(f, "c2", 0.2)  # queued behind c1
    assert list(f.handle(Finished("c2", Outcome.CLIENT_GONE), 0.3)) == []
    assert list(f.handle(Finished("b1", Outcome.CLIENT_GONE), 0.4)) == []
    assert list(f.handle(Finished("c1", Outcome.SUCCESS), 0.5)) == []  # nobody left to start
    assert len(f) == 0 and f.backend("a").in_flight == 0


def test_a_request_ends_once() -> None:
    f = make()
    chat(f, "c1", 0.0)
    f.handle(Finished("c1", Outcome.SUCCESS), 0.1)
    with pytest.raises(WrongEvent, match="not in the front"):
        f.handle(Finished("c1", Outcome.SUCCESS), 0.2)
    with pytest.raises(WrongEvent, match="already"):
        chat(f, "c2", 0.3)
        chat(f, "c2", 0.3)


def test_a_queued_request_expires_at_its_bound_and_rejected_ones_are_gone() -> None:
    f = make()
    chat(f, "c1", 0.0)
    chat(f, "c2", 1.0)
    assert f.next_wakeup() == 6.0  # 1.0 + interactive's 5 s
    assert list(f.handle(Tick(), 5.9)) == []
    [rej] = f.handle(Tick(), 6.0)
    assert isinstance(rej, Reject) and (rej.id, rej.reason) == ("c2", "queue_timeout") and rej.retry_after_s >= 1.0
    assert "c2" not in f
    with pytest.raises(WrongEvent):
        f.handle(Finished("c2", Outcome.CLIENT_GONE), 6.1)


def test_sustained_overload_is_refused_at_once_and_what_is_admitted_waits_within_its_bound() -> None:
    """40 completions/s, 200 chats/s for 20 s: admitted chats wait at most their bound (5 s);
    the rest are refused on arrival with a Retry-After, none expires in the queue."""
    f = make(BackendSpec("a", max_concurrency=4, continues=True))
    running: list[tuple[float, str]] = []  # (ends at, id)
    waits, refused, expired = [], 0, 0
    arrived: dict[str, float] = {}
    t, n, service = 0.0, 0, 4 / 40.0

    def apply(decisions: object, now: float) -> None:
        nonlocal expired
        for d in decisions:  # type: ignore[attr-defined]
            if isinstance(d, Start):
                waits.append(now - arrived[d.id])
                running.append((now + service, d.id))
            elif isinstance(d, Reject):
                expired += 1

    while t < 20.0:
        running.sort()
        while running and running[0][0] <= t:
            end, rid = running.pop(0)
            apply(f.handle(Finished(rid, Outcome.SUCCESS), end), end)
        apply(f.handle(Tick(), t), t)
        rid = f"c{n}"
        arrived[rid] = t
        out = f.handle(Arrive(rid, "interactive", 50), t)
        if out and isinstance(out[0], Reject):
            assert out[0].reason in ("wait_bound", "queue_full") and out[0].retry_after_s >= 1.0
            refused += 1
        else:
            apply(out, t)
        n += 1
        t += 1 / 200.0
    assert refused > 0.7 * n  # about 80% is more than the engine can do
    assert expired < 0.01 * n
    assert max(waits) <= 5.0


def test_a_busy_backend_s_late_probes_count_neither_way() -> None:
    # Probes that time out while the backend streams to requests in flight: loaded, not dead.
    f = make(unhealthy_after=2)
    for t in (0.0, 0.1, 0.2):
        assert list(f.handle(Probed("a", False, busy=True), t)) == []
    assert f.is_healthy("a")
    f.handle(Probed("a", False), 0.3)  # one real failure, then a busy one: still one in a row
    f.handle(Probed("a", False, busy=True), 0.4)
    assert f.is_healthy("a")
    assert list(f.handle(Probed("a", False), 0.5)) == [HealthChanged("a", False)]
    assert list(f.handle(Probed("a", False, busy=True), 0.6)) == []  # nor does it bring one back
    assert not f.is_healthy("a")


def test_no_healthy_backend_and_shutdown_refuse_on_arrival() -> None:
    f = make(unhealthy_after=1)
    assert list(f.handle(Probed("a", False), 0.0)) == [HealthChanged("a", False)]
    [rej] = chat(f, "c1", 0.1)
    assert isinstance(rej, Reject) and rej.reason == "no_healthy_backend"
    f.handle(Probed("a", True), 0.2)
    chat(f, "c2", 0.3)
    chat(f, "c3", 0.3)
    assert [(d.id, d.reason) for d in f.handle(Close(), 0.4) if isinstance(d, Reject)] == [("c3", "shutting_down")]
    [rej] = chat(f, "c4", 0.5)
    assert isinstance(rej, Reject) and rej.reason == "shutting_down"
    f.handle(Finished("c2", Outcome.SUCCESS), 0.6)  # a running request still ends normally


def test_a_suspended_request_resumes_only_where_a_generation_can_be_continued() -> None:
    f = make(BackendSpec("engine", max_concurrency=1, continues=True), BackendSpec("plain", max_concurrency=1))
    [start] = batch(f, "b1", 0.0)
    assert isinstance(start, Start) and start.backend == "engine"
    f.handle(Opened("b1"), 0.1)
    chat(f, "p1", 0.2)  # takes plain
    assert Suspend("b1", "engine") in chat(f, "c1", 0.3)  # b1 makes room on engine
    f.handle(Finished("p1", Outcome.SUCCESS), 0.4)  # plain frees: b1 cannot be continued there
    assert f.state("b1") is State.SUSPENDED and f.backend("plain").in_flight == 0
    f.handle(Finished("c1", Outcome.SUCCESS), 0.5)
    assert f.state("b1") is State.RUNNING and f.backend("engine").in_flight == 1


def test_an_end_told_without_preemption_suspends_nothing_until_an_event_that_may() -> None:
    """The DES tells a step's ends with `preempt=False` (another request ending in the same step
    must not be suspended before its own end is told), then a `Tick` that may preempt."""
    f = make(BackendSpec("a", max_concurrency=2, continues=True))
    for b in ("b1", "b2"):
        batch(f, b, 0.0)
        f.handle(Opened(b), 0.0)
    f.handle(Arrive("c1", "interactive", 50), 0.5, preempt=False)  # mid-step: waits
    f.handle(Arrive("c2", "interactive", 50), 0.5, preempt=False)
    assert list(f.handle(Finished("b1", Outcome.SUCCESS), 1.0, preempt=False)) == [Start("c1", "a")]
    assert f.state("b2") is State.RUNNING  # c2 still waits: b2 might be ending in this very step
    assert list(f.handle(Tick(), 1.0)) == [Suspend("b2", "a"), Start("c2", "a")]


def test_an_allotment_caps_a_shared_backend_and_lets_the_queue_in_when_it_grows() -> None:
    """Replicas share a backend's slots (`Allotted`, the gateway's leases in Redis): this one may
    use its part only; lowered below what runs, nothing is cancelled; grown, the queue goes in."""
    from tailguard.front.events import Allotted

    f = make(BackendSpec("a", max_concurrency=4, continues=True))
    assert list(f.handle(Allotted("a", 1), 0.0)) == []
    assert [type(d) for d in chat(f, "r1", 0.0)] == [Start]
    assert chat(f, "r2", 0.0) == []  # queued: its part is 1 of the 4
    assert list(f.handle(Allotted("a", 0), 0.1)) == []  # below what runs: r1 goes on
    assert f.backend("a").in_flight == 1
    assert list(f.handle(Allotted("a", None), 0.2)) == [Start("r2", "a")]  # the whole cap again
    assert list(f.handle(Allotted("gone", 2), 0.3)) == []  # a backend that is not here ignores it
