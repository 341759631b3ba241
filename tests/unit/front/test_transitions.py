"""The front's transition table (h11's `_state.py` shape): every event type has a row, every pair
of a request's state and an event the table does not hold is a `WrongEvent` with the front left
exactly as it was, a decision or a stranger handed in is a `NotAnEvent`, a `now` that goes back is
a `ClockWentBack`, and a handler that fails past its checks leaves the front broken, every later
call refused, never half-changed and going on."""

from __future__ import annotations

import typing
from collections.abc import Callable

import pytest

from tailguard.front.events import (
    Arrive, ClockWentBack, Decision, Event, Failed, Finished, FirstContent, FrontBroken, Generated, GiveUp, NotAnEvent,
    Opened, Probed, Reject, Start, StartMode, Suspend, Tick, WrongEvent,
)
from tailguard.front.front import FRONT_EVENTS, TRANSITIONS, Front
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, HedgeParams, PreemptionParams
from tailguard.front.tracked import State
from tailguard.types import FailureKind, Outcome, RejectReason
from tests.unit.front.snapshot import snapshot

CLASSES = [ClassSpec(name="interactive", rank=0, max_queue_wait_s=5.0),
           ClassSpec(name="batch", rank=1, max_queue_wait_s=60.0, preemptible=True)]
REQUEST_EVENTS = sorted({event for _, event in TRANSITIONS}, key=lambda t: t.__name__)


def busy_front() -> Front:
    """A front with a request in every state: `queued`, `hedged` (running, with a second attempt),
    `suspended` and `failed` (given up); `gone` has ended. Four backends of one slot each."""
    f = Front(FrontParams(classes=CLASSES, backends=[BackendSpec(n, 1, continues=True) for n in "abcd"],
                          preemption=PreemptionParams(enabled=True, min_run_s=0.0),
                          hedging=HedgeParams(enabled=True, classes=("interactive",), min_samples=1, min_delay_s=0.01,
                                              max_share=1.0)))
    # One served chat teaches the hedger the class's TTFT.
    [warm] = f.handle(Arrive("w", "interactive", 50), 0.0)
    assert isinstance(warm, Start)
    f.handle(FirstContent("w", warm.backend), 0.1)
    f.handle(Finished("w", Outcome.SUCCESS), 0.2)
    now = 1.0
    f.handle(Arrive("suspended", "batch", 500, resumable=True, max_tokens=400), now)
    f.handle(Opened("suspended"), now)
    f.handle(Arrive("failed", "batch", 500, max_tokens=400), now)  # not resumable: never suspended
    assert [type(d) for d in f.handle(Failed("failed", FailureKind.STREAM_ERROR, answered=True), now)] == [GiveUp]
    f.handle(Arrive("hedged", "interactive", 50), now)
    assert any(isinstance(d, Start) and d.mode is StartMode.HEDGE for d in f.handle(Tick(), now + 0.5))
    # Every slot is taken: a chat suspends the batch job, the next one waits.
    assert any(isinstance(d, Suspend) for d in f.handle(Arrive("running", "interactive", 50), now + 0.5))
    f.handle(Arrive("queued", "interactive", 50), now + 0.5)
    f.handle(Arrive("gone", "interactive", 50), now + 0.5)
    f.handle(Finished("gone", Outcome.CLIENT_GONE), now + 0.6)
    states = {r: f.state(r) for r in ("queued", "hedged", "running", "suspended", "failed")}
    assert states == {"queued": State.QUEUED, "hedged": State.RUNNING, "running": State.RUNNING,
                      "suspended": State.SUSPENDED, "failed": State.FAILED}, states
    assert "gone" not in f
    return f


LAST_NOW = 1.6
STATE_OF = {"queued": State.QUEUED, "running": State.RUNNING, "suspended": State.SUSPENDED, "failed": State.FAILED,
            "gone": None}
EVENT_OF: dict[type, Callable[[str], Event]] = {
    Arrive: lambda r: Arrive(r, "interactive", 10), Opened: Opened, Generated: lambda r: Generated(r, 3),
    Failed: lambda r: Failed(r, FailureKind.RESET), FirstContent: lambda r: FirstContent(r, "a"),
    Finished: lambda r: Finished(r, Outcome.SUCCESS),
}
ILLEGAL = [(r, t) for r, state in STATE_OF.items() for t in REQUEST_EVENTS if (state, t) not in TRANSITIONS]


def test_every_event_has_one_row_and_every_request_event_a_state_that_takes_it() -> None:
    events = set(typing.get_args(Event))
    assert set(FRONT_EVENTS) | {t for _, t in TRANSITIONS} == events
    assert not set(FRONT_EVENTS) & {t for _, t in TRANSITIONS}
    assert set(EVENT_OF) == {t for _, t in TRANSITIONS}
    assert all((state, Finished) in TRANSITIONS for state in State)  # a request in any state may end


@pytest.mark.parametrize(("req", "kind"), ILLEGAL, ids=[f"{r}-{t.__name__}" for r, t in ILLEGAL])
def test_an_event_its_state_does_not_take_is_refused_with_the_front_unchanged(req: str, kind: type) -> None:
    f = busy_front()
    before = snapshot(f)
    event = EVENT_OF[kind](req)
    with pytest.raises(WrongEvent) as err:
        f.handle(event, LAST_NOW)
    assert err.value.event == event and repr(event) in str(err.value)
    assert snapshot(f) == before


def _elsewhere(f: Front) -> str:
    """A backend the hedged request runs neither of its attempts on."""
    r = f._reqs["hedged"]
    return next(b.name for b in f.backends() if b.name not in (r.backend, r.hedge))


@pytest.mark.parametrize("make", [
    lambda f: FirstContent("hedged", _elsewhere(f)),
    lambda f: Failed("hedged", FailureKind.RESET, backend=_elsewhere(f)),
    lambda f: Arrive("new", "no-such-class", 10),
], ids=["first-content-elsewhere", "failed-elsewhere", "unknown-class"])
def test_an_event_that_fails_its_rows_own_check_is_refused_with_the_front_unchanged(
        make: Callable[[Front], Event]) -> None:
    f = busy_front()
    before = snapshot(f)
    with pytest.raises(WrongEvent):
        f.handle(make(f), LAST_NOW)
    assert snapshot(f) == before


@pytest.mark.parametrize("thing", [
    Start("queued", "a"), Reject("queued", RejectReason.QUEUE_FULL, 1.0), Suspend("suspended", "a"), "Tick", None,
], ids=["Start", "Reject", "Suspend", "a-string", "None"])
def test_a_decision_or_anything_else_handed_in_is_named_and_changes_nothing(thing: object) -> None:
    f = busy_front()
    before = snapshot(f)
    with pytest.raises(NotAnEvent) as err:
        f.handle(thing, LAST_NOW)  # type: ignore[arg-type]
    is_decision = isinstance(thing, typing.get_args(Decision))
    assert ("is a decision" in str(err.value)) == is_decision
    assert snapshot(f) == before


def test_a_now_earlier_than_the_last_is_named_and_changes_nothing() -> None:
    f = busy_front()
    before = snapshot(f)
    with pytest.raises(ClockWentBack, match="before the last instant"):
        f.handle(Tick(), LAST_NOW - 0.001)
    assert snapshot(f) == before
    f.handle(Probed("a", True), LAST_NOW)  # the same instant again is fine


def test_a_handler_that_fails_past_its_checks_leaves_the_front_broken_for_every_later_call() -> None:
    f = busy_front()

    def fails(*_: object) -> None:
        raise RuntimeError("a bug in a policy")

    f._queue.push = fails  # type: ignore[method-assign]  # the scheduler fails as a new request queues
    with pytest.raises(FrontBroken, match="a bug in a policy") as err:
        f.handle(Arrive("x", "interactive", 10), LAST_NOW)
    assert isinstance(err.value.cause, RuntimeError) and f.broken is err.value
    for later in (Tick(), Finished("queued", Outcome.CLIENT_GONE), Probed("a", True)):
        with pytest.raises(FrontBroken):
            f.handle(later, LAST_NOW + 1)
