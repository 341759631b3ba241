"""A recording replayed on a fresh front: the seeded random walks of `test_front_walk` (retries,
suspensions, reloads, probes, expiries), written through the codec as text and read back, give
the identical decisions; a recording whose decisions were changed is caught at the changed line,
with what was expected and what came instead."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from tailguard.front.events import Arrive, Decision, Finished, Retired, Start
from tailguard.recording.codec import Recording, read, step_line
from tailguard.recording.replay import conform
from tailguard.types import Outcome
from tests.unit.front import test_front_walk
from tests.unit.front.recorded import RecordedFront
from tests.unit.front.test_front_walk import STEPS, fleet


def walk(seed: int) -> RecordedFront:
    front = test_front_walk.walk(seed, RecordedFront)[0].front
    assert isinstance(front, RecordedFront)
    return front


@pytest.mark.parametrize("seed", range(10))
def test_a_random_walk_replays_identically(seed: int) -> None:
    rec = read(walk(seed).lines)
    result = conform(rec)
    assert result.identical, str(result)
    assert result.events == len(rec.steps) >= STEPS
    assert result.decisions == sum(len(s.decisions) for s in rec.steps) > 0
    assert str(result) == f"{result.events} events, {result.decisions} decisions, identical"


def _tampered(rec: Recording, index: int, decisions: tuple[Decision, ...]) -> Recording:
    steps = list(rec.steps)
    steps[index] = replace(steps[index], decisions=decisions)
    return replace(rec, steps=tuple(steps))


def test_a_changed_decision_is_found_and_named() -> None:
    rec = read(walk(3).lines)
    i = next(i for i, s in enumerate(rec.steps) if any(isinstance(d, Start) for d in s.decisions))
    real = rec.steps[i].decisions
    forged = tuple(replace(d, backend="elsewhere") if isinstance(d, Start) else d for d in real)
    result = conform(_tampered(rec, i, forged))
    assert not result.identical and result.events == i + 1
    diff = result.difference
    assert diff is not None
    assert (diff.line, diff.event, diff.expected, diff.got) == (rec.steps[i].line, rec.steps[i].event, forged, real)
    assert f"first difference at line {diff.line}: {diff.event!r}" in str(result)
    assert "backend='elsewhere'" in str(result)


def test_a_missing_or_extra_decision_is_a_difference() -> None:
    rec = read(walk(5).lines)
    i = next(i for i, s in enumerate(rec.steps) if s.decisions)
    assert conform(_tampered(rec, i, rec.steps[i].decisions[1:])).difference is not None
    assert conform(_tampered(rec, i, (*rec.steps[i].decisions, Retired("nowhere")))).difference is not None


def test_an_event_the_fresh_front_refuses_is_a_difference_with_its_error() -> None:
    front = RecordedFront(fleet(random.Random(0)))
    front.handle(Arrive("r1", "interactive", 10), 0.0)
    front.handle(Finished("r1", Outcome.SUCCESS), 1.0)
    # The same ending once more, as a driver that ended a request twice would have recorded it
    # had the gateway's front let it through.
    front.lines.append(json.dumps(step_line(Finished("r1", Outcome.SUCCESS), 2.0, True, ())))
    result = conform(read(front.lines))
    diff = result.difference
    assert diff is not None and diff.line == 4 and diff.got is None
    assert diff.error is not None and "not in the front" in diff.error
    assert "got      error" in str(diff)
