"""A recording replayed on a fresh front: the conformance check of its drivers; pure, no I/O.

The front decides from its events and the `now` it is told, nothing else, so a fresh `Front`
built from the recording's parameters and handed the recorded events at their recorded instants
must decide exactly what the gateway's front decided. Any difference is a driver that decided
something itself, or a front that read something other than its events (a clock, a random
draw, a set's order): the first one is reported with the line it came from.

    result = conform(read(open(path)))
    print(result)      # "1234 events, 1302 decisions, identical", or the first difference
"""

from __future__ import annotations

from dataclasses import dataclass

from tailguard.errors import ConfigError
from tailguard.front.events import Decision, Event, WrongEvent
from tailguard.front.front import Front
from tailguard.recording.codec import Recording


@dataclass(frozen=True, slots=True)
class Difference:
    """The first event whose decisions differ: what the recording says the front decided, and
    what the fresh front decided (or the error it raised instead)."""

    line: int
    event: Event
    expected: tuple[Decision, ...]
    got: tuple[Decision, ...] | None
    error: str | None = None

    def __str__(self) -> str:
        got = f"error {self.error}" if self.error is not None else _listed(self.got or ())
        return (f"line {self.line}: {self.event!r}\n  expected {_listed(self.expected)}\n  got      {got}")


@dataclass(frozen=True, slots=True)
class Conformance:
    """How many events were replayed and decisions compared (up to and including a difference)."""

    events: int
    decisions: int
    difference: Difference | None

    @property
    def identical(self) -> bool:
        return self.difference is None

    def __str__(self) -> str:
        head = f"{self.events} events, {self.decisions} decisions"
        return f"{head}, identical" if self.difference is None else f"{head}; first difference at {self.difference}"


def conform(recording: Recording) -> Conformance:
    """Replay every recorded event on a fresh front; stop at the first difference."""
    front = Front(recording.header.params)
    events = decisions = 0
    for step in recording.steps:
        events += 1
        decisions += len(step.decisions)
        try:
            got = tuple(front.handle(step.event, step.now, preempt=step.preempt))
        except (WrongEvent, ConfigError) as e:
            return Conformance(events, decisions, Difference(step.line, step.event, step.decisions, None, str(e)))
        if got != step.decisions:
            return Conformance(events, decisions, Difference(step.line, step.event, step.decisions, got))
    return Conformance(events, decisions, None)


def _listed(decisions: tuple[Decision, ...]) -> str:
    return "[" + ", ".join(repr(d) for d in decisions) + "]" if decisions else "nothing"
