"""Streams that survive their backend, as the front decides them: an attempt that failed after
part of its answer reached the client is continued elsewhere (`Start` of mode `migrate`) when its
backend died or stalled and its text can be continued; otherwise it is given up (`GiveUp`, which
says why). Plain numbers, no loop."""

from __future__ import annotations

import pytest

from tailguard.front.events import Arrive, Failed, Finished, GiveUp, GiveUpReason, Start, StartMode, Wait
from tailguard.front.front import Front
from tailguard.front.tracked import State
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, HealthParams, QueueParams, RetryParams
from tailguard.front.retry import Again, retry_of
from tailguard.types import FailureKind, Outcome

CLASSES = [ClassSpec(name="interactive", rank=0, max_queue_wait_s=5.0)]


def fleet(*backends: BackendSpec, retry: RetryParams = RetryParams()) -> Front:
    return Front(FrontParams(classes=CLASSES, backends=list(backends), queue=QueueParams(), retry=retry,
                             health=HealthParams()))


def three(retry: RetryParams = RetryParams()) -> Front:
    return fleet(*(BackendSpec(n, max_concurrency=2, continues=True) for n in "abc"), retry=retry)


def stream(f: Front, req_id: str, now: float, resumable: bool = True) -> str:
    """A chat arrives and starts; the backend it went to."""
    [start] = f.handle(Arrive(req_id, "interactive", 60, resumable=resumable, max_tokens=40), now)
    assert isinstance(start, Start) and start.mode is StartMode.FRESH
    return start.backend


def died(f: Front, req_id: str, now: float, kind: FailureKind = FailureKind.DISCONNECT) -> list[object]:
    return list(f.handle(Failed(req_id, kind, delivered=True, answered=True), now))


@pytest.mark.parametrize("kind", [FailureKind.DISCONNECT, FailureKind.RESET, FailureKind.TIMEOUT_IDLE,
                                  FailureKind.CONNECT, FailureKind.TIMEOUT_CONNECT, FailureKind.STATUS])
def test_a_stream_whose_backend_died_or_stalled_goes_on_elsewhere_with_its_slot(kind: FailureKind) -> None:
    """Died, stalled, or (the refusals: only a continuation's attempt can meet them with content
    delivered) the backend a continuation went to is down too."""
    f = three()
    first = stream(f, "c1", 0.0)
    [start] = died(f, "c1", 1.0, kind)
    assert isinstance(start, Start)
    assert start == Start("c1", start.backend, StartMode.MIGRATE, kind, first) and start.backend != first
    assert f.state("c1") is State.RUNNING
    assert f.backend(first).in_flight == 0 and f.backend(start.backend).in_flight == 1
    assert list(f.handle(Finished("c1", Outcome.SUCCESS, tokens=100), 2.0)) == []
    assert all(b.in_flight == 0 for b in f.backends())


def test_a_continuation_whose_connection_was_stale_goes_once_more_to_the_same_backend() -> None:
    """Broken before any answer: a pooled keep-alive connection the server had closed, as for a
    retry; the same backend over a fresh connection once, then another."""
    f = three()
    first = stream(f, "c1", 0.0)
    [moved] = died(f, "c1", 1.0)
    assert isinstance(moved, Start)
    stale = Failed("c1", FailureKind.RESET, delivered=True, answered=False)
    # The continuation's own body again, on a fresh connection: a retry, not a move.
    assert list(f.handle(stale, 1.1)) == [Start("c1", moved.backend, StartMode.RETRY, FailureKind.RESET, moved.backend)]
    [third] = set("abc") - {first, moved.backend}
    assert list(f.handle(stale, 1.2)) == [Start("c1", third, StartMode.MIGRATE, FailureKind.RESET, moved.backend)]


def test_a_continuation_that_meets_a_hung_host_goes_on_again() -> None:
    """No response head within the first-token deadline: a hung host, as for a retry; once the
    engine answered, a late first token is not the host's failure."""
    f = three()
    first = stream(f, "c1", 0.0)
    [moved] = died(f, "c1", 1.0)
    assert isinstance(moved, Start)
    [third] = set("abc") - {first, moved.backend}
    assert list(f.handle(Failed("c1", FailureKind.TIMEOUT_FIRST_TOKEN, delivered=True, answered=False), 2.0)) == [
        Start("c1", third, StartMode.MIGRATE, FailureKind.TIMEOUT_FIRST_TOKEN, moved.backend)]
    assert retry_of(FailureKind.TIMEOUT_FIRST_TOKEN, delivered=True, answered=True, continuable=True) is Again.NO


@pytest.mark.parametrize("kind", [FailureKind.TIMEOUT_TOTAL, FailureKind.PROTOCOL, FailureKind.STREAM_ERROR])
def test_only_a_dead_or_stalled_backend_moves_a_stream(kind: FailureKind) -> None:
    """A total deadline is the request's own bound; an error event or a malformed stream came from
    an engine that answered (its text elsewhere could repeat what broke it)."""
    f = three()
    first = stream(f, "c1", 0.0)
    # The driver ends it with one error event.
    assert died(f, "c1", 1.0, kind) == [GiveUp("c1", GiveUpReason.NOT_RETRYABLE, kind, first)]


def test_a_request_that_cannot_be_continued_from_text_is_never_moved() -> None:
    """Tools, structured output, n > 1, logprobs: the intake's `resumable` is False."""
    f = three()
    first = stream(f, "t1", 0.0, resumable=False)
    assert died(f, "t1", 1.0) == [GiveUp("t1", GiveUpReason.NOT_CONTINUABLE, FailureKind.DISCONNECT, first)]
    assert retry_of(FailureKind.DISCONNECT, delivered=True, answered=True, continuable=False) is Again.NO


def test_nothing_delivered_is_still_a_retry_from_the_start() -> None:
    f = three()
    first = stream(f, "c1", 0.0)
    assert list(f.handle(Failed("c1", FailureKind.RESET, delivered=False, answered=True), 0.5)) == [
        Start("c1", first, StartMode.RETRY, FailureKind.RESET, first)]  # the same backend on a fresh connection


def test_at_most_max_migrations_and_never_back_to_a_backend_it_failed_on() -> None:
    f = three(RetryParams(max_migrations=2))
    first = stream(f, "c1", 0.0)
    [second] = died(f, "c1", 1.0)
    [third] = died(f, "c1", 2.0)
    assert isinstance(second, Start) and isinstance(third, Start)
    assert len({first, second.backend, third.backend}) == 3 and third.mode is StartMode.MIGRATE
    # The limit: the driver ends it.
    assert died(f, "c1", 3.0) == [GiveUp("c1", GiveUpReason.MIGRATIONS, FailureKind.DISCONNECT, third.backend)]


def test_only_to_a_backend_whose_kind_can_continue_a_generation() -> None:
    f = fleet(BackendSpec("a", max_concurrency=1, continues=True), BackendSpec("o", max_concurrency=9))
    on: dict[str, str] = {}
    for i in range(9):  # until one is on `a` (o, of capacity 9, still has room then)
        on[stream(f, f"c{i}", 0.1 * i)] = f"c{i}"
        if "a" in on:
            break
    assert f.backend("o").in_flight < 9
    # `o` has room but (a plain OpenAI server) cannot continue.
    assert died(f, on["a"], 1.0) == [GiveUp(on["a"], GiveUpReason.NO_BACKEND, FailureKind.DISCONNECT, "a")]


def test_with_every_slot_taken_it_waits_for_one_where_it_did_not_fail_and_continues_there() -> None:
    """No slot free elsewhere: the stream waits in the queue (`Wait`), its slot going to whoever
    waits, and continues on the next backend that frees one, never the one it failed on."""
    f = fleet(BackendSpec("a", max_concurrency=1, continues=True), BackendSpec("b", max_concurrency=1, continues=True))
    assert stream(f, "c1", 0.0) == "a"
    assert stream(f, "c2", 0.1) == "b"
    assert list(f.handle(Arrive("c3", "interactive", 60, resumable=True), 0.5)) == []  # queued
    assert died(f, "c1", 1.0) == [Wait("c1")]  # a is free, but c1 failed there (and, older, goes first)
    assert list(f.handle(Finished("c2", Outcome.SUCCESS), 1.5)) == [
        Start("c1", "b", StartMode.MIGRATE, FailureKind.DISCONNECT, "a"), Start("c3", "a")]


def test_the_retry_budget_bounds_migrations() -> None:
    f = three(RetryParams(max_migrations=1, budget_ratio=0.0, min_retries_per_s=0.1, window_s=10.0))
    stream(f, "c1", 0.0)
    stream(f, "c2", 0.0)
    [moved] = died(f, "c1", 1.0)  # the one retry the floor allows in the window
    assert isinstance(moved, Start)
    [gave_up] = died(f, "c2", 1.1)
    assert isinstance(gave_up, GiveUp) and gave_up.reason is GiveUpReason.BUDGET


def test_a_chat_text_is_kept_only_where_it_could_move() -> None:
    """`tracks`: a lone backend (the quick form with one URL) keeps the relay that parses
    nothing; migrations off likewise; a second backend that can continue turns it on."""
    one = fleet(BackendSpec("a", continues=True))
    assert not one.tracks("interactive", True)
    assert three().tracks("interactive", True) and not three().tracks("interactive", False)
    assert not three(RetryParams(max_migrations=0)).tracks("interactive", True)
    assert not fleet(BackendSpec("o1"), BackendSpec("o2")).tracks("interactive", True)
