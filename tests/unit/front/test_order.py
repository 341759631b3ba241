"""The order inside a rank with TTFT targets (`front.order`), and admission and shedding by
deadline (`front.queue`, `front.admission`), on literal numbers: pushes and pops at stated
instants, and what comes out."""

from __future__ import annotations

import math

import pytest

from tailguard.front.fairqueue import FairShareScheduler
from tailguard.front.params import ClassSpec, QueueParams, Slo
from tailguard.front.queue import BaseScheduler, Pending
from tailguard.front.ranked import RankedSjfScheduler
from tailguard.types import Outcome, RejectReason

CHAT = ClassSpec(name="chat", rank=0, max_queue_len=100, max_queue_wait_s=30.0, slo=Slo(ttft_s=2.0))
KEPT = ClassSpec(name="kept", rank=0, max_queue_len=100, max_queue_wait_s=30.0, slo=Slo(ttft_s=2.0, shed=False))
PLAIN = ClassSpec(name="plain", rank=0, max_queue_len=100, max_queue_wait_s=30.0)
BATCH = ClassSpec(name="batch", rank=1, max_queue_len=100, max_queue_wait_s=600.0)
SPECS = {c.name: c for c in (CHAT, KEPT, PLAIN, BATCH)}


def req(id: str, cls: str, cost: int, at: float, due_in: float | None = None, service_s: float | None = 0.1) -> Pending:
    spec = SPECS[cls]
    if due_in is None and spec.slo is not None:
        due_in = spec.slo.ttft_s
    deadline = math.inf if due_in is None else at + due_in
    return Pending(id, cls, spec.rank, cost, at, at + spec.max_queue_wait_s, deadline_at=deadline, service_s=service_s)


def sched(aging_s: float = 10.0) -> RankedSjfScheduler:
    return RankedSjfScheduler(QueueParams(aging_s=aging_s), list(SPECS.values()))


def drain(s: BaseScheduler, now: float) -> list[str]:
    out = []
    while (p := s.pop(now)) is not None:
        out.append(p.id)
    return out


# --- the order ------------------------------------------------------------------------------------

def test_earliest_deadline_first_whatever_the_arrival_order() -> None:
    s = sched()
    s.push(req("late-due", "chat", 100, 0.0, due_in=5.0), 0.0)
    s.push(req("soon-due", "chat", 100, 0.1, due_in=1.0), 0.1)
    s.push(req("mid-due", "chat", 100, 0.2, due_in=3.0), 0.2)
    assert drain(s, 0.3) == ["soon-due", "mid-due", "late-due"]


def test_a_much_shorter_job_goes_first_while_the_earliest_deadline_can_spare_the_time() -> None:
    s = sched()
    s.push(req("long", "chat", 4000, 0.0), 0.0)
    s.push(req("short", "chat", 100, 0.1), 0.1)
    assert drain(s, 0.2) == ["short", "long"]


def test_no_shortcut_once_the_earliest_deadline_has_no_time_to_spare() -> None:
    """`long` must start by 2.0 - 0.1 = 1.9 s; a slot takes 0.5 s to free (drain rate 2/s), so at
    1.5 s it cannot let `short` go first."""
    s = sched()
    s.on_finish(None, Outcome.SUCCESS, 0.0)
    s.push(req("filler", "batch", 1, 0.0), 0.0)
    s.on_finish(None, Outcome.SUCCESS, 0.0)
    s.on_finish(None, Outcome.SUCCESS, 0.5)
    assert s.remove("filler", 0.5)
    s.push(req("long", "chat", 4000, 1.0, due_in=1.0), 1.0)
    s.push(req("short", "chat", 100, 1.1, due_in=1.0), 1.1)
    assert s.admission.slot_s() == 0.5
    assert drain(s, 1.5) == ["long", "short"]


def test_equal_deadlines_go_shortest_first() -> None:
    s = sched()
    s.push(req("b", "chat", 300, 0.0, due_in=2.0), 0.0)
    s.push(req("a", "chat", 200, 0.0, due_in=2.0), 0.0)
    assert drain(s, 0.1) == ["a", "b"]


def test_requests_that_can_no_longer_make_their_deadline_go_after_those_that_can() -> None:
    """`hopeless` can start no later than 2.0 - 1.5 = 0.5 s: at 1 s it is late, and waits behind
    `fresh`, which can still make its own (served late, but served)."""
    s = sched()
    s.push(req("hopeless", "kept", 100, 0.0, service_s=1.5), 0.0)
    s.push(req("fresh", "kept", 100, 0.9), 0.9)
    assert drain(s, 1.0) == ["fresh", "hopeless"]


def test_a_target_goes_before_no_target_in_one_rank_but_aging_bounds_the_wait() -> None:
    s = sched(aging_s=5.0)
    s.push(req("plain", "plain", 10, 0.0), 0.0)
    s.push(req("chat", "chat", 1000, 1.0), 1.0)
    assert s.head(2.0) is not None and s.head(2.0).id == "chat"  # type: ignore[union-attr]
    s.push(req("chat2", "chat", 1000, 5.5), 5.5)
    # At 6 s `plain` has waited its aging bound: it goes before every younger request of its rank.
    assert drain(s, 6.0) == ["plain", "chat", "chat2"]


def test_the_aged_request_goes_before_an_earlier_deadline() -> None:
    s = sched(aging_s=2.0)
    s.push(req("old", "chat", 100, 0.0, due_in=60.0), 0.0)
    s.push(req("urgent", "chat", 100, 2.5, due_in=0.5), 2.5)
    assert drain(s, 2.6) == ["old", "urgent"]


def test_higher_ranks_still_go_first() -> None:
    s = sched()
    s.push(req("b", "batch", 10, 0.0), 0.0)
    s.push(req("c", "chat", 5000, 1.0), 1.0)
    assert drain(s, 1.1) == ["c", "b"]


# --- with agent programs (issue 31's PLAS in the pick's keys) ------------------------------------

def call(id: str, cost: int, at: float, lvl: int = 0, program_at: float = 0.0, due_in: float = 2.0,
         caller: str | None = None) -> Pending:
    return Pending(id, "chat", 0, cost, at, at + 30.0, caller, level=lvl, program_at=program_at,
                   deadline_at=at + due_in, service_s=0.1)


def test_a_programs_level_goes_before_the_deadline_then_edf_within_a_level() -> None:
    """A call of a program that has received less goes first even with a later deadline; among
    calls of one level (here 0: new programs, or none) the earliest deadline goes first."""
    s = sched()
    s.push(call("agent-soon", 100, 0.0, lvl=1, program_at=-30.0, due_in=0.5), 0.0)
    s.push(call("new-late", 100, 0.0, due_in=1.9), 0.0)
    s.push(call("new-soon", 100, 0.0, due_in=1.0), 0.0)
    assert drain(s, 0.1) == ["new-soon", "new-late", "agent-soon"]


def test_above_level_0_the_older_program_goes_first_whatever_the_deadlines() -> None:
    s = sched()
    s.push(call("young-program", 100, 0.0, lvl=1, program_at=-5.0, due_in=0.5), 0.0)
    s.push(call("old-program", 100, 0.0, lvl=1, program_at=-50.0, due_in=1.5), 0.0)
    assert drain(s, 0.1) == ["old-program", "young-program"]


def test_a_smaller_job_overtakes_the_deadline_only_at_its_own_program_rank() -> None:
    """SJF's tie-break is `plas.overtakes`: a much smaller call of a higher level never goes
    before a level-0 call that can make its deadline."""
    s = sched()
    s.push(call("new-long", 4000, 0.0, due_in=1.9), 0.0)
    s.push(call("agent-short", 50, 0.0, lvl=1, program_at=-9.0, due_in=1.0), 0.0)
    s.push(call("new-short", 100, 0.0, due_in=1.9), 0.0)
    assert drain(s, 0.1) == ["new-short", "new-long", "agent-short"]


def test_aging_bounds_program_order_with_targets_too() -> None:
    s = sched(aging_s=1.0)
    s.push(call("agent", 100, 0.0, lvl=1, program_at=-60.0, due_in=30.0), 0.0)
    s.push(call("new", 100, 1.5, due_in=2.0), 1.5)
    assert drain(s, 1.6) == ["agent", "new"]  # it has waited its aging bound


def test_late_calls_go_by_program_level_as_without_targets() -> None:
    """Calls that can no longer make their deadline are ordered as issue 31's rule orders calls
    with no target: a lower level first."""
    s = sched()
    s.push(call("agent", 100, 0.0, lvl=1, program_at=-60.0, due_in=0.2), 0.0)
    s.push(call("new", 900, 0.1, due_in=0.2), 0.1)
    assert drain(s, 1.0) == ["new", "agent"]


def test_fair_share_then_program_level_then_deadline() -> None:
    s = FairShareScheduler(QueueParams(fair_share=True, fair_credit=0.0), list(SPECS.values()))
    s.vtc.counters.update({"heavy": 50_000.0, "light": 0.0})
    s.push(call("light-agent", 100, 0.0, lvl=1, program_at=-9.0, due_in=0.5, caller="light"), 0.0)
    s.push(call("light-new", 100, 0.0, due_in=1.5, caller="light"), 0.0)
    s.push(call("heavy-new", 100, 0.0, due_in=0.5, caller="heavy"), 0.0)
    assert [s.pop(0.1).id for _ in range(2)] == ["light-new", "light-agent"]  # type: ignore[union-attr]


# --- admission by deadline --------------------------------------------------------------------------

def draining(s: BaseScheduler, per_s: float) -> None:
    """Two completions 1/per_s apart while a request waits: the drain rate becomes `per_s`."""
    s.push(req("filler", "batch", 1, 0.0), 0.0)
    s.on_finish(None, Outcome.SUCCESS, 0.0)
    s.on_finish(None, Outcome.SUCCESS, 1.0 / per_s)
    assert s.remove("filler", 1.0 / per_s)


def test_refused_only_when_predicted_to_miss() -> None:
    """Drain rate 2/s: each request ahead is 0.5 s of wait. With a 0.2 s TTFT once started and a
    2 s target (admitted up to 0.8 x 2 = 1.6 s), the fourth request (1.5 s of wait ahead) would
    take 1.7 s: refused, told to retry once the excess has drained."""
    s = sched()
    draining(s, 2.0)
    t = 1.0
    got = [s.push(req(f"c{i}", "chat", 500, t, service_s=0.2), t) for i in range(4)]
    assert got[:3] == [None, None, None]
    refused = got[3]
    assert refused is not None and refused.reason is RejectReason.DEADLINE
    assert refused.retry_after_s == 1.0  # 0.1 s late, within the configured floor of 1 s


def test_a_class_that_does_not_shed_admits_late_requests() -> None:
    s = sched()
    draining(s, 2.0)
    assert all(s.push(req(f"k{i}", "kept", 500, 1.0, service_s=0.2), 1.0) is None for i in range(6))


def test_nothing_is_refused_by_deadline_before_the_latency_is_predicted() -> None:
    s = sched()
    draining(s, 2.0)
    assert all(s.push(req(f"c{i}", "chat", 500, 1.0, service_s=None), 1.0) is None for i in range(6))


def test_a_request_that_misses_even_alone_is_served_late_not_refused() -> None:
    s = sched()
    draining(s, 2.0)
    assert s.push(req("ahead", "chat", 500, 1.0, service_s=0.2), 1.0) is None
    assert s.push(req("huge", "chat", 90_000, 1.0, service_s=1.9), 1.0) is None


# --- shedding by cost per target met --------------------------------------------------------------

def test_a_cheap_arrival_sheds_the_costliest_queued_request() -> None:
    s = sched()
    draining(s, 2.0)
    for i, cost in enumerate((800, 3000, 500)):
        assert s.push(req(f"q{i}", "chat", cost, 1.0, service_s=0.2), 1.0) is None
    assert s.push(req("cheap", "chat", 200, 1.0, service_s=0.2), 1.0) is None
    assert [p.id for p in s.take_shed()] == ["q1"]
    assert sorted(drain(s, 1.1)) == ["cheap", "q0", "q2"]


def test_an_arrival_dearer_than_everything_queued_is_refused_instead() -> None:
    s = sched()
    draining(s, 2.0)
    for i in range(3):
        assert s.push(req(f"q{i}", "chat", 500, 1.0, service_s=0.2), 1.0) is None
    refused = s.push(req("dear", "chat", 4000, 1.0, service_s=0.2), 1.0)
    assert refused is not None and refused.reason is RejectReason.DEADLINE
    assert s.take_shed() == [] and len(s) == 3


def test_requests_already_late_are_shed_before_costlier_ones() -> None:
    """`stale` (cheap, but past its latest start) goes first: its target is missed whatever happens."""
    s = sched()
    draining(s, 2.0)
    assert s.push(req("stale", "chat", 100, 0.5, service_s=0.2), 0.5) is None
    assert s.push(req("dear", "chat", 3000, 2.2, service_s=0.2), 2.2) is None
    assert s.push(req("q", "chat", 500, 2.2, service_s=0.2), 2.2) is None
    assert s.push(req("new", "chat", 400, 2.4, service_s=0.2), 2.4) is None
    assert [p.id for p in s.take_shed()] == ["stale"]


def test_a_class_that_does_not_shed_is_never_shed() -> None:
    s = sched()
    draining(s, 2.0)
    for i in range(3):
        assert s.push(req(f"k{i}", "kept", 5000, 1.0, service_s=0.2), 1.0) is None
    refused = s.push(req("cheap", "chat", 100, 1.0, service_s=0.2), 1.0)
    assert refused is not None and refused.reason is RejectReason.DEADLINE and s.take_shed() == []


# --- leaving once late ----------------------------------------------------------------------------

def test_a_queued_request_that_can_no_longer_make_its_target_leaves_at_its_latest_start() -> None:
    """`c` is due at 2.0 s and takes 0.2 s once started: at 1.8 s it can no longer make it, and in
    a class that sheds it leaves then (the front refuses it `late`), not at its 30 s bound; one of
    a class that does not shed stays until its bound."""
    s = sched()
    assert s.push(req("c", "chat", 500, 0.0, service_s=0.2), 0.0) is None
    assert s.push(req("k", "kept", 500, 0.0, service_s=0.2), 0.0) is None
    assert s.next_wakeup() == 1.8
    assert s.expire(1.79) == []
    assert [p.id for p in s.expire(1.8)] == ["c"]
    assert s.next_wakeup() == 30.0 and drain(s, 1.9) == ["k"]


def test_only_a_request_that_could_make_its_target_is_refused_for_missing_it() -> None:
    """As at admission: with no TTFT predicted yet, or one that misses even alone (1.9 s of a 2 s
    target, past 0.8 x 2), it is served late, not refused; it leaves at its bound only."""
    s = sched()
    assert s.push(req("unknown", "chat", 500, 0.0, service_s=None), 0.0) is None
    assert s.push(req("huge", "chat", 90_000, 0.0, service_s=1.9), 0.0) is None
    assert s.next_wakeup() == 30.0 and s.expire(29.0) == []


def test_a_request_queued_before_any_prediction_leaves_at_its_latest_start_once_predicted() -> None:
    """Queued with no TTFT predicted (no fit ready yet), it waits for its bound; told its
    prediction (0.2 s) while still queued, it leaves at its latest start as if it had come with it,
    in a class that sheds only."""
    s = sched()
    assert s.push(req("c", "chat", 500, 0.0, service_s=None), 0.0) is None
    assert s.push(req("k", "kept", 500, 0.0, service_s=None), 0.0) is None
    assert s.next_wakeup() == 30.0
    told = s.predicted("c", 0.2)
    assert told is not None and told.service_s == 0.2
    s.predicted("k", 0.2)
    assert s.predicted("gone", 0.2) is None
    assert s.next_wakeup() == 1.8 and [p.id for p in s.expire(1.8)] == ["c"]
    assert s.next_wakeup() == 30.0 and drain(s, 1.9) == ["k"]


def test_a_request_resumed_after_a_suspension_is_not_refused_for_its_target() -> None:
    """Its answer has begun: it waits again for a slot up to its class's bound only."""
    s = sched()
    assert s.push(req("c", "chat", 500, 0.0, service_s=0.2), 0.0) is None
    got = s.pop(0.1)
    assert got is not None
    s.requeue(got, 0.5)
    assert s.next_wakeup() == 30.0 and s.expire(5.0) == []


# --- in the front: the decisions ------------------------------------------------------------------

def test_the_front_refuses_by_its_latency_fit_and_sheds_for_cheaper_work() -> None:
    """One backend, one slot. Twenty requests each take 0.2 s to a first token and 0.5 s in all,
    back to back with two waiting: the fit predicts 0.2 s, the queue drains 2 a second. Then
    requests queue until the next would wait past its 2 s target (x 0.8): refused with
    `deadline`; a cheaper one sheds the dearest queued request (`shed`)."""
    from tailguard.front.events import Arrive, FirstContent, Finished, Reject, Start, Tick
    from tailguard.front.front import Front
    from tailguard.front.params import BackendSpec, FrontParams

    front = Front(FrontParams([CHAT, BATCH], [BackendSpec("b", max_concurrency=1)]))
    now = 0.0
    for i in range(3):
        front.handle(Arrive(f"w{i}", "chat", 600, max_tokens=100), now)
    for i in range(20):
        front.handle(FirstContent(f"w{i}", "b"), now + 0.2)
        now += 0.5
        front.handle(Arrive(f"w{i + 3}", "chat", 600, max_tokens=100), now)
        front.handle(Finished(f"w{i}", Outcome.SUCCESS, 600), now)
    assert front.predicted_ttft_s("w20") is not None
    decisions = []  # w21 and w22 wait: a third request waits 1 s; a fourth, 1.5 s, and 0.2 s more
    for i, size in enumerate((3600, 4000)):  # the second costs more than any queued: nothing to shed
        decisions += front.handle(Arrive(f"q{i}", "chat", size, max_tokens=100), now)
    refused = [d for d in decisions if isinstance(d, Reject)]
    assert [(d.id, d.reason) for d in refused] == [("q1", RejectReason.DEADLINE)]
    assert refused[0].retry_after_s >= 1.0
    cheap = front.handle(Arrive("cheap", "chat", 150, max_tokens=50), now)
    assert [(d.id, d.reason) for d in cheap if isinstance(d, Reject)] == [("q0", RejectReason.SHED)]
    assert "cheap" in front and "q0" not in front
    assert not any(isinstance(d, Start) for d in cheap)
    # Nothing finishes any more: each queued request leaves `late` at its latest start (its 2 s
    # target less its 0.2 s predicted TTFT), long before its 30 s bound.
    due = front.next_wakeup()
    assert due is not None and now < due <= now + 1.8 + 1e-9
    late = [d for d in front.handle(Tick(), due) if isinstance(d, Reject)]
    assert late and all(d.reason is RejectReason.LATE for d in late)


def test_a_burst_queued_before_the_fit_leaves_late_once_the_fit_predicts() -> None:
    """One slot, twenty chats at once before anything is measured: all are queued (nothing can be
    predicted). Each takes 0.2 s to a first token and 0.5 s in all; at the twelfth first token the
    fit predicts, and the eight still queued, long past their latest start (2 s less 0.2 s), leave
    `late` at once instead of being served 4-10 s late."""
    from tailguard.front.events import Arrive, FirstContent, Finished, Reject, Start, Tick
    from tailguard.front.front import Front
    from tailguard.front.params import BackendSpec, FrontParams

    front = Front(FrontParams([CHAT, BATCH], [BackendSpec("b", max_concurrency=1)]))
    arrived = [front.handle(Arrive(f"c{i}", "chat", 600, max_tokens=100), 0.0) for i in range(20)]
    assert not any(isinstance(d, Reject) for ds in arrived for d in ds)
    now = 0.0
    for i in range(12):
        front.handle(FirstContent(f"c{i}", "b"), now + 0.2)
        if i < 11:
            assert front.next_wakeup() == 30.0  # not fitted yet: each waits for its bound
            now += 0.5
            started = front.handle(Finished(f"c{i}", Outcome.SUCCESS, 600), now)
            assert [d.id for d in started if isinstance(d, Start)] == [f"c{i + 1}"]
    assert front.predicted_ttft_s("c11") is not None  # the twelfth sample: the fit predicts
    assert front.next_wakeup() == pytest.approx(1.8)  # c12-c19: their latest start, long past
    late = front.handle(Tick(), now + 0.2)
    assert sorted(d.id for d in late if isinstance(d, Reject) and d.reason is RejectReason.LATE) == \
        sorted(f"c{i}" for i in range(12, 20))
    assert "c11" in front and len(front) == 0  # c11 runs; nothing waits
