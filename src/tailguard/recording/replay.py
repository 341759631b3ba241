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

from tailguard.errors import ConfigError, TailguardError
from tailguard.front.counts import COUNTED_DECISIONS, Counts
from tailguard.front.events import Event
from tailguard.front.front import Front
from tailguard.recording import legacy
from tailguard.recording.codec import Recording
from tailguard.recording.legacy import V1View


@dataclass(frozen=True, slots=True)
class Difference:
    """The first event whose decisions differ: what the recording says the front decided, and
    what the fresh front decided (or the error it raised instead)."""

    line: int
    event: Event
    expected: tuple[object, ...]
    got: tuple[object, ...] | None
    error: str | None = None

    def __str__(self) -> str:
        got = f"error {self.error}" if self.error is not None else _listed(self.got or ())
        return (f"line {self.line}: {self.event!r}\n  expected {_listed(self.expected)}\n  got      {got}")


@dataclass(frozen=True, slots=True)
class Miscount:
    """A request whose counts, as its driver recorded them when it ended, are not what the
    recorded decisions say of it (`front.counts`): a driver that counted for itself."""

    id: str
    recorded: tuple[int, ...]
    decided: tuple[int, ...]

    def __str__(self) -> str:
        names = ", ".join(COUNTED)
        return f"request {self.id!r}: recorded ({names}) {self.recorded}, its decisions say {self.decided}"


@dataclass(frozen=True, slots=True)
class Conformance:
    """How many events were replayed and decisions compared (up to and including a difference),
    and the first request whose recorded counts its decisions do not bear out."""

    events: int
    decisions: int
    difference: Difference | None
    miscount: Miscount | None = None

    @property
    def identical(self) -> bool:
        return self.difference is None and self.miscount is None

    def __str__(self) -> str:
        head = f"{self.events} events, {self.decisions} decisions"
        if self.difference is not None:
            return f"{head}; first difference at {self.difference}"
        return f"{head}, identical" if self.miscount is None else f"{head}; miscounted: {self.miscount}"


# A request line's counters, as `front.counts.Counts` has them.
COUNTED = ("attempts", "retries", "retries_denied", "migrations", "preemptions", "hedges", "hedges_won")


def counted(recording: Recording) -> dict[str, Counts]:
    """What each request's recorded decisions say of it (format version 2), counted as every
    driver counts: `front.counts`."""
    out: dict[str, Counts] = {}
    for step in recording.steps:
        for d in step.decisions:
            if type(d) in COUNTED_DECISIONS:
                out.setdefault(d.id, Counts()).apply(d)
    return out


def _miscount(recording: Recording) -> Miscount | None:
    """The first request line whose counts its decisions do not bear out (version 2 only: a
    version-1 recording's decisions did not say enough)."""
    if recording.header.version == legacy.VERSION:
        return None
    decided = counted(recording)
    for obs in recording.requests:
        c = decided.get(obs.id, Counts())
        mine, theirs = tuple(getattr(obs, n) for n in COUNTED), tuple(getattr(c, n) for n in COUNTED)
        if mine != theirs:
            return Miscount(obs.id, mine, theirs)
    return None


def conform(recording: Recording) -> Conformance:
    """Replay every recorded event on a fresh front; stop at the first difference. A recording of
    format version 1 is compared as that version wrote decisions (`legacy.V1View`). Then each
    request's counts as its driver recorded them are held to what its decisions say."""
    front = Front(recording.header.params)
    v1 = V1View() if recording.header.version == legacy.VERSION else None
    events = decisions = 0
    for step in recording.steps:
        events += 1
        decisions += len(step.decisions)
        try:
            decided = front.handle(step.event, step.now, preempt=step.preempt)
        except (TailguardError, ConfigError) as e:
            return Conformance(events, decisions, Difference(step.line, step.event, step.decisions, None, str(e)))
        got = tuple(decided) if v1 is None else v1.decisions(step.event, decided)
        if got != step.decisions:
            return Conformance(events, decisions, Difference(step.line, step.event, step.decisions, got))
    return Conformance(events, decisions, None, _miscount(recording))


def _listed(decisions: tuple[object, ...]) -> str:
    return "[" + ", ".join(repr(d) for d in decisions) + "]" if decisions else "nothing"
