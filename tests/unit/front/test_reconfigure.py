"""`Front.reconfigure`, the live reload, on plain numbers: new parameters take effect for what
comes next, and every queued, running and suspended request is kept."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from tailguard.errors import ConfigError
from tailguard.front.events import Arrive, Failed, Finished, Opened, Probed, Reconfigure, Retired, Start, StartMode, Suspend
from tailguard.front.front import Front, State
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, PreemptionParams, QueueParams
from tailguard.types import FailureKind, Outcome

CLASSES = (ClassSpec(name="interactive", rank=0, max_queue_wait_s=5.0),
           ClassSpec(name="batch", rank=1, max_queue_wait_s=600.0, preemptible=True))


def params(cap: int = 1, policy: str = "ranked-sjf", preemption: bool = True,
           classes: tuple[ClassSpec, ...] = CLASSES, reserved: int | None = None) -> FrontParams:
    return FrontParams(classes=classes,
                       backends=[BackendSpec("a", max_concurrency=cap, continues=True, reserved_slots=reserved)],
                       queue=QueueParams(policy=policy), preemption=PreemptionParams(enabled=preemption))


def chat(f: Front, req_id: str, now: float) -> list[object]:
    return list(f.handle(Arrive(req_id, "interactive", 50, max_tokens=20), now))


def batch(f: Front, req_id: str, now: float) -> list[object]:
    return list(f.handle(Arrive(req_id, "batch", 1100, resumable=True, max_tokens=1000), now))


def test_a_raised_cap_binds_the_queued_requests_at_once() -> None:
    f = Front(params(cap=1))
    for i in range(3):
        chat(f, f"c{i}", 0.1 * i)
    assert list(f.handle(Reconfigure(params(cap=3)), 1.0)) == [Start("c1", "a"), Start("c2", "a")]
    assert f.backend("a").max_concurrency == 3 and len(f) == 0


def test_a_lowered_cap_cancels_nothing_and_new_binds_wait_until_it_is_met() -> None:
    f = Front(params(cap=3))
    for i in range(4):
        chat(f, f"c{i}", 0.1 * i)
    assert list(f.handle(Reconfigure(params(cap=1)), 1.0)) == []
    assert all(f.state(f"c{i}") is State.RUNNING for i in range(3)) and f.state("c3") is State.QUEUED
    assert list(f.handle(Finished("c0", Outcome.SUCCESS), 1.1)) == []  # 2 in flight, cap 1
    assert list(f.handle(Finished("c1", Outcome.SUCCESS), 1.2)) == []  # 1 in flight, cap 1
    assert list(f.handle(Finished("c2", Outcome.SUCCESS), 1.3)) == [Start("c3", "a")]


def test_a_new_policy_re_sorts_the_queued_requests_without_refusing_any() -> None:
    f = Front(params(policy="fcfs"))
    chat(f, "c0", 0.0)
    batch(f, "b1", 0.1)
    chat(f, "c1", 0.2)
    assert list(f.handle(Reconfigure(params(policy="ranked-sjf")), 0.3)) == []
    assert len(f) == 2
    assert list(f.handle(Finished("c0", Outcome.SUCCESS), 0.4)) == [Start("c1", "a")]  # fcfs would start b1
    assert list(f.handle(Finished("c1", Outcome.SUCCESS), 0.5)) == [Start("b1", "a")]


def test_new_ranks_apply_to_queued_requests() -> None:
    f = Front(params())
    chat(f, "c0", 0.0)
    chat(f, "c1", 0.1)
    batch(f, "b1", 0.2)
    swapped = (replace(CLASSES[0], rank=1), replace(CLASSES[1], rank=0))
    f.handle(Reconfigure(params(classes=swapped)), 0.3)
    assert list(f.handle(Finished("c0", Outcome.SUCCESS), 0.4)) == [Start("b1", "a")]


def test_a_suspended_request_survives_a_reload_and_resumes() -> None:
    f = Front(params())
    batch(f, "b1", 0.0)
    f.handle(Opened("b1"), 0.1)
    assert chat(f, "c1", 0.2) == [Suspend("b1", "a"), Start("c1", "a")]
    assert list(f.handle(Reconfigure(params(preemption=False)), 0.3)) == []
    assert f.state("b1") is State.SUSPENDED
    assert list(f.handle(Finished("c1", Outcome.SUCCESS), 0.4)) == [Start("b1", "a", StartMode.CONTINUE)]


def test_preemption_turned_off_leaves_a_running_batch_job_running() -> None:
    f = Front(params())
    batch(f, "b1", 0.0)
    f.handle(Opened("b1"), 0.1)
    f.handle(Reconfigure(params(preemption=False)), 0.2)
    assert chat(f, "c1", 0.3) == []
    assert f.state("b1") is State.RUNNING and not f.may_suspend("batch")


def test_a_class_no_longer_preemptible_is_never_suspended() -> None:
    f = Front(params())
    batch(f, "b1", 0.0)
    fixed = (CLASSES[0], replace(CLASSES[1], preemptible=False))
    f.handle(Reconfigure(params(classes=fixed)), 0.1)
    assert list(f.handle(Opened("b1"), 0.2)) == []
    assert chat(f, "c1", 0.3) == []


def test_a_reservation_takes_effect_for_new_binds() -> None:
    f = Front(params(cap=2))
    f.handle(Reconfigure(params(cap=2, reserved=1)), 0.0)
    assert batch(f, "b1", 0.1) == [Start("b1", "a")]
    assert batch(f, "b2", 0.2) == []  # the second slot is the chats' now
    assert chat(f, "c1", 0.3) == [Start("c1", "a")]


@pytest.mark.parametrize("change", [
    lambda p: replace(p, classes=p.classes[:1]),
    lambda p: replace(p, classes=(*p.classes, ClassSpec(name="bulk", rank=2))),
    lambda p: replace(p, queue=QueueParams(policy="lifo")),
])
def test_other_classes_or_an_unknown_policy_change_nothing(
        change: Callable[[FrontParams], FrontParams]) -> None:
    before = params(cap=1)
    f = Front(before)
    chat(f, "c0", 0.0)
    chat(f, "c1", 0.1)
    with pytest.raises(ConfigError):
        f.handle(Reconfigure(change(params(cap=4))), 0.2)
    assert f.params is before and f.backend("a").max_concurrency == 1
    assert list(f.handle(Finished("c0", Outcome.SUCCESS), 0.3)) == [Start("c1", "a")]


def test_the_refusal_says_what_changed_and_that_a_restart_is_needed() -> None:
    f = Front(params())
    with pytest.raises(ConfigError, match=r"classes changed \(removed batch\).*restart"):
        f.handle(Reconfigure(params(classes=CLASSES[:1])), 0.0)


# --- backends added and removed ------------------------------------------------------------------

def fleet(*caps: tuple[str, int]) -> FrontParams:
    return replace(params(), backends=[BackendSpec(name, max_concurrency=cap, continues=True) for name, cap in caps])


def test_a_new_backend_takes_the_queued_requests_at_once() -> None:
    f = Front(fleet(("a", 1)))
    for i in range(3):
        chat(f, f"c{i}", 0.1 * i)
    assert list(f.handle(Reconfigure(fleet(("a", 1), ("b", 2))), 1.0)) == [Start("c1", "b"), Start("c2", "b")]
    assert tuple(b.name for b in f.backends()) == ("a", "b") and f.backend("b").healthy  # a new backend starts healthy, as at start


def test_a_removed_backend_takes_nothing_new_and_retires_when_its_last_request_ends() -> None:
    f = Front(fleet(("a", 2), ("b", 2)))
    assert chat(f, "c0", 0.0) == [Start("c0", "a")] and chat(f, "c1", 0.1) == [Start("c1", "b")]
    assert list(f.handle(Reconfigure(fleet(("b", 2))), 0.2)) == []  # c0 still runs on a
    assert f.backend("a").retiring and f.state("c0") is State.RUNNING
    assert chat(f, "c2", 0.3) == [Start("c2", "b")]  # a has a free slot, but takes nothing new
    assert chat(f, "c3", 0.4) == [] and f.state("c3") is State.QUEUED
    assert list(f.handle(Finished("c0", Outcome.SUCCESS), 0.5)) == [Retired("a")]
    assert tuple(b.name for b in f.backends()) == ("b",)
    assert list(f.handle(Finished("c1", Outcome.SUCCESS), 0.6)) == [Start("c3", "b")]
    assert list(f.handle(Probed("a", False), 0.7)) == [] and list(f.handle(Probed("a", True), 0.8)) == []  # a late probe of it


def test_a_removed_backend_with_nothing_in_flight_leaves_at_once() -> None:
    f = Front(fleet(("a", 2), ("b", 2)))
    assert list(f.handle(Reconfigure(fleet(("b", 2))), 0.0)) == [Retired("a")]
    assert tuple(b.name for b in f.backends()) == ("b",)


def test_a_backend_named_again_before_it_left_is_kept() -> None:
    f = Front(fleet(("a", 1), ("b", 1)))
    chat(f, "c0", 0.0)
    f.handle(Reconfigure(fleet(("b", 1))), 0.1)
    assert list(f.handle(Reconfigure(fleet(("a", 2), ("b", 1))), 0.2)) == []
    assert not f.backend("a").retiring and f.backend("a").in_flight == 1 and f.backend("a").max_concurrency == 2
    assert list(f.handle(Finished("c0", Outcome.SUCCESS), 0.3)) == []  # no Retired: it is configured again


def test_a_failed_attempt_on_a_retiring_backend_is_retried_elsewhere() -> None:
    f = Front(fleet(("a", 1), ("b", 1)))
    chat(f, "c0", 0.0)  # on a
    f.handle(Reconfigure(fleet(("b", 1))), 0.1)
    # A reset is retried on the same backend, except one that is leaving: it goes to b.
    assert list(f.handle(Failed("c0", FailureKind.RESET), 0.2)) == [
        Start("c0", "b", StartMode.RETRY, FailureKind.RESET, "a"), Retired("a")]


def test_only_retiring_backends_left_refuse_new_requests() -> None:
    f = Front(fleet(("a", 1), ("b", 1)))
    chat(f, "c0", 0.0)
    f.handle(Reconfigure(fleet(("b", 1))), 0.1)
    f.handle(Probed("b", False), 0.2)
    f.handle(Probed("b", False), 0.3)
    f.handle(Probed("b", False), 0.4)  # b is unhealthy; a is healthy, but leaving
    assert [d.reason for d in f.handle(Arrive("c1", "interactive", 50), 0.5)] == ["no_healthy_backend"]  # type: ignore[union-attr]
