"""Spacing a class's starts on each backend (`classes[].start_interval_s`, `front.pacing`), on
virtual time: the pacer alone, then the front that consults it, as both drivers do."""

from __future__ import annotations

from tailguard.front.events import Arrive, Finished, Opened, Start, StartMode, Suspend, Tick
from tailguard.front.front import Front
from tailguard.front.pacing import Pacer
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, PreemptionParams, QueueParams
from tailguard.types import Outcome

PACED = [ClassSpec(name="interactive", rank=0, max_queue_wait_s=5.0),
         ClassSpec(name="batch", rank=1, max_queue_wait_s=600.0, preemptible=True, start_interval_s=0.01)]


def test_a_paced_class_waits_its_interval_per_backend_and_others_never_do() -> None:
    p = Pacer(PACED)
    assert p.held("batch", 0.0) == [] and p.next_due() is None
    p.started("a", "batch", 1.0)
    p.started("a", "interactive", 1.0)  # not paced: sets nothing
    assert p.held("batch", 1.005) == ["a"] and p.held("interactive", 1.005) == []
    p.started("b", "batch", 1.004)
    assert p.next_due() == 1.01
    assert p.held("batch", 1.01) == ["b"]
    p.expire(1.01)
    assert p.next_due() == 1.014
    p.expire(1.02)
    assert p.held("batch", 1.02) == [] and p.next_due() is None


def test_reconfigure_changes_the_interval_for_later_starts() -> None:
    p = Pacer(PACED)
    p.started("a", "batch", 0.0)
    p.reconfigure([ClassSpec(name="interactive"), ClassSpec(name="batch", rank=1)])
    assert p.held("batch", 0.001) == []  # unpaced now
    p.started("a", "batch", 0.002)
    assert p.next_due() == 0.01  # the earlier start keeps the bound it set, until it expires


def make(cap: int) -> Front:
    return Front(FrontParams(classes=PACED, backends=[BackendSpec("a", max_concurrency=cap, continues=True)],
                             queue=QueueParams(), preemption=PreemptionParams()))


def line(f: Front, req_id: str, now: float) -> list[object]:
    return list(f.handle(Arrive(req_id, "batch", 200, resumable=True, max_tokens=64), now))


def test_lines_start_one_per_interval_with_slots_free_and_the_wakeup_says_when() -> None:
    f = make(4)
    assert line(f, "l1", 0.0) == [Start("l1", "a")]
    assert line(f, "l2", 0.0) == [] and line(f, "l3", 0.001) == []  # slots free, but paced
    assert f.next_wakeup() == 0.01
    assert list(f.handle(Tick(), 0.01)) == [Start("l2", "a")]
    assert f.next_wakeup() == 0.02
    assert list(f.handle(Tick(), 0.015)) == []  # early: nothing
    assert list(f.handle(Tick(), 0.02)) == [Start("l3", "a")]
    assert f.next_wakeup() is None  # nothing queued: no wake-up for the pacer alone


def test_a_chat_is_never_paced_and_a_suspended_line_resumes_within_the_pace() -> None:
    f = make(1)
    assert line(f, "l1", 0.0) == [Start("l1", "a")]
    f.handle(Opened("l1"), 0.0)
    chat = list(f.handle(Arrive("c1", "interactive", 50, max_tokens=20), 0.001))
    assert chat == [Suspend("l1", "a"), Start("c1", "a")]  # the chat's start waits for no pace
    assert list(f.handle(Finished("c1", Outcome.SUCCESS), 0.005)) == []  # l1 started at 0.0: held to 0.01
    assert list(f.handle(Tick(), 0.01)) == [Start("l1", "a", StartMode.CONTINUE)]


def test_pacing_takes_no_slot_from_the_class_when_lines_end_apart() -> None:
    """Lines ending one interval apart or more are replaced at once: pacing only spreads starts
    that come together."""
    f = make(2)
    line(f, "l1", 0.0)
    f.handle(Tick(), 0.01)
    line(f, "l2", 0.01)
    assert f.backend("a").in_flight == 2
    line(f, "l3", 0.02)
    assert list(f.handle(Finished("l1", Outcome.SUCCESS), 0.05)) == [Start("l3", "a")]
