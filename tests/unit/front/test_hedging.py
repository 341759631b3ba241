"""Hedged requests on virtual time: a request of a hedged class with no content past its class's
TTFT quantile goes to a second backend too; the first to stream wins and the other is dropped;
hedges stay within their budget; a failed attempt leaves the other alone."""

from __future__ import annotations

from tailguard.front.events import Arrive, Drop, Failed, Finished, FirstContent, Start, StartMode, Tick, WrongEvent
from tailguard.front.front import Front
from tailguard.front.hedging import Hedger
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, HedgeParams
from tailguard.types import FailureKind, Outcome

CLASSES = [ClassSpec(name="interactive", rank=0, max_queue_wait_s=5.0),
           ClassSpec(name="batch", rank=1, max_queue_wait_s=60.0)]
HEDGE = HedgeParams(enabled=True, min_samples=5, min_delay_s=0.01, max_share=0.5, window_s=10.0)


def fleet(hedge: HedgeParams = HEDGE) -> Front:
    return Front(FrontParams(classes=CLASSES, backends=[BackendSpec("a", 4), BackendSpec("b", 4)], hedging=hedge))


def warm(f: Front, ttft: float = 0.1, n: int = 6, now: float = 0.0) -> float:
    """`n` interactive requests served with TTFT `ttft`: the class's quantile is known."""
    for i in range(n):
        [start] = f.handle(Arrive(f"w{i}", "interactive", 50), now)
        assert isinstance(start, Start)
        f.handle(FirstContent(f"w{i}", start.backend), now + ttft)
        now += ttft + 0.01
        f.handle(Finished(f"w{i}", Outcome.SUCCESS), now)
    return now


def test_the_delay_is_the_quantile_of_recent_ttfts_once_enough_are_known() -> None:
    h = Hedger(HedgeParams(enabled=True, min_samples=3, quantile=0.95, factor=1.0, min_delay_s=0.0))
    assert h.delay("interactive") is None
    for t in (0.1, 0.2, 0.3):
        h.observe("interactive", t)
    assert h.delay("interactive") == 0.3
    assert h.delay("batch") is None  # not a hedged class


def test_no_content_past_the_delay_sends_a_second_attempt_and_the_first_to_stream_wins() -> None:
    f = fleet()
    now = warm(f, ttft=0.1)
    [start] = f.handle(Arrive("r", "interactive", 50), now)
    assert isinstance(start, Start)
    first, other = start.backend, "b" if start.backend == "a" else "a"
    assert f.next_wakeup() == now + 0.1  # its hedge is due after the class's TTFT P95
    assert list(f.handle(Tick(), now + 0.1)) == [Start("r", other, StartMode.HEDGE)]
    assert f.backend(other).in_flight == 1 and f.backend(first).in_flight == 1  # a slot each, meanwhile
    assert list(f.handle(FirstContent("r", other), now + 0.12)) == [Drop("r", first, other)]
    assert f.backend(first).in_flight == 0 and f.backend(other).in_flight == 1
    f.handle(Finished("r", Outcome.SUCCESS), now + 0.2)
    assert all(b.in_flight == 0 for b in f.backends())


def test_content_before_the_delay_means_no_hedge() -> None:
    f = fleet()
    now = warm(f, ttft=0.1)
    [start] = f.handle(Arrive("r", "interactive", 50), now)
    assert isinstance(start, Start)
    assert list(f.handle(FirstContent("r", start.backend), now + 0.05)) == []
    assert list(f.handle(Tick(), now + 0.1)) == []


def test_hedges_stay_within_their_share_of_requests() -> None:
    f = fleet(HedgeParams(enabled=True, min_samples=5, min_delay_s=0.01, max_share=0.1, window_s=10.0))
    now = warm(f, ttft=0.1, n=10)  # 10 requests: a budget of one hedge
    for i in range(3):
        f.handle(Arrive(f"s{i}", "interactive", 50), now)
    hedges = [d for d in f.handle(Tick(), now + 0.2) if isinstance(d, Start) and d.mode is StartMode.HEDGE]
    assert len(hedges) == 1


def test_a_failed_attempt_of_a_hedged_request_leaves_the_other_running() -> None:
    f = fleet()
    now = warm(f, ttft=0.1)
    [start] = f.handle(Arrive("r", "interactive", 50), now)
    assert isinstance(start, Start)
    [hedge] = f.handle(Tick(), now + 0.1)
    assert isinstance(hedge, Start) and hedge.mode is StartMode.HEDGE
    # No retry: the other attempt is the request's from now on.
    assert list(f.handle(Failed("r", FailureKind.RESET, backend=start.backend), now + 0.11)) == [
        Drop("r", start.backend, hedge.backend, failed=True)]
    assert f.backend(start.backend).in_flight == 0
    assert list(f.handle(FirstContent("r", hedge.backend), now + 0.15)) == []  # nothing left to drop
    f.handle(Finished("r", Outcome.SUCCESS), now + 0.2)
    assert all(b.in_flight == 0 for b in f.backends())


def test_a_request_that_ends_while_hedged_frees_both_slots() -> None:
    f = fleet()
    now = warm(f, ttft=0.1)
    f.handle(Arrive("r", "interactive", 50), now)
    f.handle(Tick(), now + 0.1)
    f.handle(Finished("r", Outcome.CLIENT_GONE), now + 0.11)
    assert all(b.in_flight == 0 for b in f.backends())


def test_off_by_default_and_never_for_unhedged_classes() -> None:
    f = Front(FrontParams(classes=CLASSES, backends=[BackendSpec("a", 4), BackendSpec("b", 4)]))
    warm(f)
    assert not f.hedges("interactive")
    g = fleet()
    now = warm(g)
    g.handle(Arrive("j", "batch", 50), now)
    assert g.next_wakeup() is None or g.next_wakeup() > now + 1.0


def test_a_first_content_or_a_failure_from_an_attempt_the_request_does_not_run_is_refused_unchanged() -> None:
    """h11's rule: the check comes before any change. A `FirstContent` from a third backend must not
    mark the request as started nor disarm its hedge; a `Failed` of one must not move its slots."""
    f = Front(FrontParams(classes=CLASSES, backends=[BackendSpec("a", 4), BackendSpec("b", 4), BackendSpec("c", 4)],
                          hedging=HEDGE))
    now = warm(f, ttft=0.1)
    [start] = f.handle(Arrive("r", "interactive", 50), now)
    assert isinstance(start, Start)
    [hedge] = f.handle(Tick(), now + 0.1)
    assert isinstance(hedge, Start) and hedge.mode is StartMode.HEDGE
    third = ({"a", "b", "c"} - {start.backend, hedge.backend}).pop()
    before = [(b.name, b.in_flight) for b in f.backends()]
    for wrong in (FirstContent("r", third), Failed("r", FailureKind.RESET, backend=third)):
        try:
            f.handle(wrong, now + 0.11)
        except WrongEvent as e:
            assert third in str(e)
        else:
            raise AssertionError(f"{wrong} was taken")
        assert [(b.name, b.in_flight) for b in f.backends()] == before
    # The right one still wins and drops the other: both slots came back in order.
    assert list(f.handle(FirstContent("r", hedge.backend), now + 0.12)) == [Drop("r", start.backend, hedge.backend)]
    f.handle(Finished("r", Outcome.SUCCESS), now + 0.2)
    assert all(b.in_flight == 0 for b in f.backends())
