"""The recording codec: every event and decision type, the parameters and a request's ending go
to JSON lines and come back equal; a line that is not exactly what was written is an error
naming its line and what is wrong."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tailguard.front.adaptive import AdaptiveParams
from tailguard.front.events import (
    Allotted, Arrive, Close, Drop, Ejected, Failed, Finished, FirstContent, Generated, GiveUp, GiveUpReason,
    HealthChanged, KindLearned, Loaded, LocalShare, Observed, Opened, Probed, Readmitted, Reconfigure, Reject,
    Retired, Served, ServedElsewhere, SharedVerdict, Start, StartMode, Suspend, Tick, Wait,
)
from tailguard.front.params import (
    BackendSpec, CallerSpec, ClassSpec, FrontParams, HealthParams, PreemptionParams, QueueParams, RetryParams,
)
from tailguard.recording.codec import (
    DECISION_TYPES, EVENT_TYPES, Header, Observation, RecordingError, header_line, read, request_line, step_line,
)
from tailguard.types import FailureKind, Outcome, RejectReason

# Nothing at its default, so a field the codec dropped would come back different.
PARAMS = FrontParams(
    classes=[ClassSpec("chat", rank=0, max_queue_len=7, max_queue_wait_s=2.5, max_share=0.5, min_share=0.25),
             ClassSpec("bulk", rank=3, preemptible=True)],
    backends=[BackendSpec("a", max_concurrency=3, weight=2.0, continues=True, reserved_slots=1),
              BackendSpec("b", adaptive=AdaptiveParams(min_cap=2, max_cap=40, initial=5, smoothing=0.3, tolerance=1.2,
                                                       long_window=300, short_window=5))],
    queue=QueueParams(policy="fcfs", aging_s=3.0, sjf_size_ratio=2.0, drain_ewma_weight=0.3, retry_after_min_s=0.5,
                      retry_after_max_s=9.0),
    preemption=PreemptionParams(enabled=False, max_preemptions_per_request=2, min_run_s=0.1),
    health=HealthParams(unhealthy_after=5, healthy_after=2),
    retry=RetryParams(max_attempts=4, budget_ratio=0.5, min_retries_per_s=1.0, window_s=5.0),
    callers=[CallerSpec("alice", requests_per_minute=60), CallerSpec("bob", tokens_per_minute=1000)],
)
EVENTS = [
    Arrive("r1", "bulk", 1200, resumable=True, max_tokens=1000, caller="alice"), Arrive("r2", "chat", 50),
    Arrive("r3", "chat", 60, model="llama", prefix=(11, -7, 2**63 - 1)), Served("a", ("llama", "qwen")),
    Served("b", None), Loaded("a", 7), FirstContent("r3", "b"), Failed("r3", FailureKind.RESET, backend="a"),
    Opened("r1"), Generated("r1", 17), Failed("r1", FailureKind.TIMEOUT_FIRST_TOKEN, delivered=True, answered=True),
    Finished("r1", Outcome.CLIENT_GONE, tokens=300), Probed("a", False, busy=True), Observed("b", 0.25, 0.0125),
    Observed("a", itl_s=0.5), KindLearned("b", True), Tick(), Allotted("a", 3), Allotted("b", None),
    ServedElsewhere({"alice": 412.5, "bob": -3.0}), LocalShare(3), LocalShare(None),
    Arrive("r4", "chat", 70, caller="alice", body_bytes=2048,
           shared=SharedVerdict(RejectReason.RATE_LIMIT_TOKENS, 1.5, 1000, 990)),
    Close(), Reconfigure(PARAMS),
]
DECISIONS = [Start("r1", "a", StartMode.CONTINUE), Start("r1", "b", StartMode.MIGRATE, FailureKind.RESET, "a"),
             Suspend("r1", "a"), Reject("r2", RejectReason.RATE_LIMIT_TOKENS, 12.5, 1000, 950, True), Start("r3", "b", StartMode.HEDGE),
             Drop("r3", "a", "b"), Drop("r3", "b", "a", failed=True), Wait("r3"),
             GiveUp("r3", GiveUpReason.ATTEMPTS, FailureKind.STATUS, "a"), HealthChanged("b", False),
             Ejected("a", 30.0, 3, FailureKind.CONNECT, 1), Readmitted("a"), Retired("a")]
SEEN = Observation("r1", "bulk", Outcome.SUCCESS, 100, 900, 10.0, 19.5, bound_at=10.25, first_content_at=10.5,
                   backend="a", caller="alice", attempts=2, preemptions=1, retries=1, retries_denied=1, migrations=1,
                   hedges=1, hedges_won=1)


def lines(*objs: dict[str, Any]) -> list[str]:
    return [json.dumps(o) for o in (header_line(Header(PARAMS)), *objs)]


def test_every_event_and_decision_type_is_covered() -> None:
    assert {type(e).__name__ for e in EVENTS} == set(EVENT_TYPES)
    assert {type(d).__name__ for d in DECISIONS} == set(DECISION_TYPES)


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_an_event_and_its_decisions_come_back_equal(event: object) -> None:
    rec = read(lines(step_line(event, 812.125, False, DECISIONS)))  # type: ignore[arg-type]
    (step,) = rec.steps
    assert (step.line, step.event, step.now, step.preempt, step.decisions) == (2, event, 812.125, False, tuple(DECISIONS))


def test_the_header_and_a_request_come_back_equal() -> None:
    header = Header(PARAMS, "abc123", {"backends": [{"name": "a"}]}, {"now": "the gateway's one clock"})
    rec = read([json.dumps(header_line(header)), json.dumps(request_line(SEEN))])
    assert rec.header == header and rec.requests == (SEEN,) and rec.steps == ()
    assert read(lines()).header == Header(PARAMS)


def test_an_instant_keeps_every_bit() -> None:
    now = 1023.0649999999998  # the replay compares decisions exactly: nothing may round on the way
    assert read(lines(step_line(Tick(), now, True, ()))).steps[0].now == now


def _step(event: dict[str, Any], decisions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"now": 1.0, "preempt": True, "event": event, "decisions": decisions or []}


@pytest.mark.parametrize("line,message", [
    ("{not json", "line 2: not JSON"),
    (json.dumps({"now": 1.0, "event": {"type": "Tick"}, "decisions": []}), "line 2: the line: missing field(s) preempt"),
    (json.dumps({**_step({"type": "Tick"}), "extra": 1}), "line 2: the line: unknown field(s) extra"),
    (json.dumps({"request": {"id": "r"}, "x": 1}), "line 2: the line: unknown field(s) x"),
    (json.dumps(_step({"type": "Arive", "id": "r"})), "line 2: event: unknown type 'Arive' (known: Arrive, Opened"),
    (json.dumps(_step({"id": "r"})), "line 2: event: expected an object with a type"),
    (json.dumps(_step({"type": "Opened", "id": "r", "tokens": 3})), "line 2: event Opened: unknown field(s) tokens"),
    (json.dumps(_step({"type": "Opened"})), "line 2: event Opened: missing field(s) id"),
    (json.dumps(_step({"type": "Generated", "id": "r", "tokens": 3.0})),
     "line 2: event Generated.tokens: expected int, got 3.0"),
    (json.dumps(_step({"type": "Generated", "id": "r", "tokens": True})),
     "line 2: event Generated.tokens: expected int, got True"),
    (json.dumps(_step({"type": "Failed", "id": "r", "kind": "gone"})),
     "line 2: event Failed.kind: 'gone' is not a FailureKind (known: connect,"),
    (json.dumps(_step({"type": "Tick"}, [{"type": "Start", "id": "r"}])),
     "line 2: decisions[0] Start: missing field(s) backend"),
    (json.dumps(_step({"type": "Tick"}, [{"type": "Go", "id": "r"}])), "line 2: decisions[0]: unknown type 'Go'"),
    (json.dumps({**_step({"type": "Tick"}), "now": "1"}), "line 2: now: expected float, got '1'"),
    (json.dumps({"request": {**request_line(SEEN)["request"], "outcome": "fine"}}),
     "line 2: request.outcome: 'fine' is not a Outcome"),
    (json.dumps(_step({"type": "Reconfigure", "params": {"classes": [], "backends": [{"nam": "a"}]}})),
     "line 2: event Reconfigure.params.backends[0]: unknown field(s) nam"),
])
def test_a_line_that_is_not_exactly_a_recording_line_is_named(line: str, message: str) -> None:
    with pytest.raises(RecordingError) as e:
        read([lines()[0], line])
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize("first,message", [
    ("", "empty recording: no header line"),
    (json.dumps({"now": 1.0}), "line 1: not a front recording"),
    (json.dumps({**header_line(Header(PARAMS)), "version": 3}), "line 1: recording format version 3; this tailguard reads"),
    (json.dumps({**header_line(Header(PARAMS)), "mode": "x"}), "line 1: the header: unknown field(s) mode"),
    (json.dumps({**header_line(Header(PARAMS)), "params": {"classes": []}}), "line 1: params: missing field(s) backends"),
])
def test_a_file_without_a_header_is_refused(first: str, message: str) -> None:
    with pytest.raises(RecordingError) as e:
        read([first] if first else [])
    assert str(e.value).startswith(message), str(e.value)
