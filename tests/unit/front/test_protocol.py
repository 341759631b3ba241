"""The front as a closed protocol: the front alone decides retries and health from what a failure
was (its kind, whether the answer reached the consumer, whether the engine answered), a wrong
event is a named error that changes nothing, and each call returns only its own decisions."""

from __future__ import annotations

import pytest

from tailguard.front.events import (
    Arrive, Ejected, Failed, Finished, Generated, GiveUp, GiveUpReason, HealthChanged, Opened, Probed, Start, StartMode,
    WrongEvent,
)
from tailguard.front.front import Front
from tailguard.front.tracked import State
from tailguard.front.params import BackendSpec, ClassSpec, EjectionParams, FrontParams, HealthParams
from tailguard.types import FailureKind, Outcome

CLASSES = [ClassSpec(name="interactive", rank=0, max_queue_wait_s=5.0)]
K = FailureKind


def two_backends(unhealthy_after: int = 1) -> tuple[Front, str, str]:
    """A front with backends a and b, and request r1 running on one of them (named first)."""
    f = Front(FrontParams(classes=CLASSES, backends=[BackendSpec("a", max_concurrency=2), BackendSpec("b", max_concurrency=2)],
                          health=HealthParams(unhealthy_after=unhealthy_after),
                          ejection=EjectionParams(consecutive_failures=1)))
    [start] = f.handle(Arrive("r1", "interactive", 50), 0.0)
    assert isinstance(start, Start)
    return f, start.backend, "b" if start.backend == "a" else "a"


# kind, delivered, answered -> where it goes again ("same", "other" or None), and whether it
# counts toward ejecting its backend (here after one failure).
CASES = [
    (K.RESET, False, False, "same", False),  # a stale keep-alive connection: the same backend, fresh
    (K.DISCONNECT, False, True, "same", False),
    (K.CONNECT, False, False, "other", True),
    (K.TIMEOUT_CONNECT, False, False, "other", True),
    (K.STATUS, False, True, "other", True),  # a 5xx before streaming (Envoy's consecutive 5xx)
    (K.TIMEOUT_HEADER, False, False, "other", True),  # no response head within its deadline: hung
    (K.TIMEOUT_FIRST_TOKEN, False, False, "other", True),  # not even a response head: hung
    (K.TIMEOUT_FIRST_TOKEN, False, True, None, False),  # the engine took it: it may be working
    (K.TIMEOUT_IDLE, False, True, None, False),
    (K.TIMEOUT_TOTAL, False, True, None, False),
    (K.PROTOCOL, False, True, "other", True),  # not what was asked (a gzip JSON to a stream): broken there
    (K.PROTOCOL, True, True, None, True),  # past its max_tokens mid-answer: cut, and the backend is broken
    (K.STREAM_ERROR, False, True, None, False),
    (K.RESET, True, True, None, False),  # some of the answer reached the consumer: never again
    (K.CONNECT, True, False, None, True),
]


@pytest.mark.parametrize(("kind", "delivered", "answered", "where", "hurts"), CASES)
def test_the_front_alone_decides_whether_and_where_a_failed_attempt_goes_again(
        kind: FailureKind, delivered: bool, answered: bool, where: str | None, hurts: bool) -> None:
    f, first, other = two_backends()
    out = list(f.handle(Failed("r1", kind, delivered=delivered, answered=answered), 0.1))
    ejected = [d.backend for d in out if isinstance(d, Ejected)]
    starts = [d for d in out if isinstance(d, (Start, GiveUp))]
    assert ejected == ([first] if hurts else [])
    # An answer under way that this request (tools, say: not `resumable`) cannot have continued;
    # one cut for breaking its bound is no failure a continuation follows at all.
    continuable = delivered and kind is not K.PROTOCOL
    gave_up = GiveUp("r1", GiveUpReason.NOT_CONTINUABLE if continuable else GiveUpReason.NOT_RETRYABLE, kind, first)
    expected = {"same": [Start("r1", first, StartMode.RETRY, kind, first)],
                "other": [Start("r1", other, StartMode.RETRY, kind, first)], None: [gave_up]}[where]
    assert starts == expected
    # Retried, or given up: it keeps its slot until the driver ends it.
    assert f.state("r1") is (State.RUNNING if where else State.FAILED)
    f.handle(Finished("r1", Outcome.UPSTREAM_ERROR), 0.2)
    assert "r1" not in f and all(b.in_flight == 0 for b in f.backends())


def test_an_upstream_4xx_ends_the_request_and_tells_the_front_its_backend_is_alive() -> None:
    f, first, _ = two_backends(unhealthy_after=1)
    assert list(f.handle(Probed(first, False), 0.1)) == [HealthChanged(first, False)]
    # A request running there since before gets a 400 the client caused: the engine answered.
    assert list(f.handle(Finished("r1", Outcome.CLIENT_ERROR), 0.2)) == [HealthChanged(first, True)]


@pytest.mark.parametrize("event", [
    Failed("q", K.RESET), Opened("q"), Generated("q", 3),  # q is queued, not running
    Failed("nobody", K.RESET), Finished("nobody", Outcome.SUCCESS), Arrive("x", "no-such-class", 10),
    Arrive("r1", "interactive", 10),  # in the front already
])
def test_a_wrong_event_is_a_named_error_and_changes_nothing(event: object) -> None:
    f = Front(FrontParams(classes=CLASSES, backends=[BackendSpec("a", max_concurrency=1)]))
    f.handle(Arrive("r1", "interactive", 50), 0.0)
    f.handle(Arrive("q", "interactive", 50), 0.0)
    before = (len(f), f.state("r1"), f.state("q"), f.backend("a"))
    with pytest.raises(WrongEvent) as err:
        f.handle(event, 0.1)  # type: ignore[arg-type]
    assert err.value.event == event and repr(event) in str(err.value)
    assert (len(f), f.state("r1"), f.state("q"), f.backend("a")) == before
    # The next call answers for itself alone.
    assert list(f.handle(Finished("r1", Outcome.SUCCESS), 0.2)) == [Start("q", "a")]


def test_a_late_probe_of_a_backend_that_has_left_changes_nothing() -> None:
    f = Front(FrontParams(classes=CLASSES, backends=[BackendSpec("a", max_concurrency=1)]))
    assert list(f.handle(Probed("gone", False), 0.0)) == []
    assert list(f.handle(Probed("gone", True), 0.0)) == []


def test_a_backend_is_unknown_until_probed_then_failing_before_unhealthy() -> None:
    f = Front(FrontParams(classes=CLASSES, backends=[BackendSpec("a", max_concurrency=1)],
                          health=HealthParams(unhealthy_after=2)))
    assert f.backend("a").state == "unknown" and f.backend("a").healthy  # it serves before any probe
    f.handle(Probed("a", False, busy=True), 0.1)
    assert f.backend("a").state == "unknown"  # a busy probe says nothing either way
    f.handle(Probed("a", True), 0.2)
    assert f.backend("a").state == "healthy"
    f.handle(Probed("a", False), 0.3)
    assert f.backend("a").state == "failing" and f.backend("a").healthy
    f.handle(Probed("a", False), 0.4)
    assert f.backend("a").state == "unhealthy"
    f.handle(Probed("a", True), 0.5)
    assert f.backend("a").state == "healthy"
