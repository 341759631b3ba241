"""Version 1 of the recording format (tailguard before its decisions said everything), read as it
was written and compared as it was: a recording made then still replays; pure, no I/O.

A version-1 `Start` said only whether it was `resumed` (it was for any start of a request that had
waited, a retry after a `Wait` included, and for a continuation after a failure); a hedge was a
`Hedge` decision; a `Drop` named only the loser; a failure the front gave up on, and the failed
half of a hedge, gave no decision at all. `V1View` turns what today's front decides into what a
version-1 front wrote for the same events, so a replay compares like with like.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tailguard.front.events import (
    Decision, Drop, Event, Failed, Finished, GiveUp, Reject, Start, StartMode, Wait,
)

VERSION = 1


@dataclass(frozen=True, slots=True)
class StartV1:
    id: str
    backend: str
    resumed: bool = False


@dataclass(frozen=True, slots=True)
class HedgeV1:
    id: str
    backend: str


@dataclass(frozen=True, slots=True)
class DropV1:
    id: str
    backend: str


# A version-1 recording's decision types, by the name it wrote; the others are today's.
RENAMED: dict[str, type] = {"Start": StartV1, "Hedge": HedgeV1, "Drop": DropV1}
GONE_SINCE = frozenset({"GiveUp"})  # no version-1 recording holds one


class V1View:
    """Today's decisions for each event, as a version-1 front wrote them (feed every step in
    order: which requests wait is remembered between them)."""

    def __init__(self) -> None:
        self._waiting: set[str] = set()

    def decisions(self, event: Event, decisions: Sequence[Decision]) -> tuple[object, ...]:
        out: list[object] = []
        for d in decisions:
            if isinstance(d, Start):
                out.append(self._start(event, d))
            elif isinstance(d, Drop):
                if not d.failed:
                    out.append(DropV1(d.id, d.loser))
            elif isinstance(d, Wait):
                self._waiting.add(d.id)
                out.append(d)
            elif isinstance(d, Reject):  # without what version 2 adds for its words
                self._waiting.discard(d.id)
                out.append(replace(d, limit=None, used=None, shared=False))
            elif not isinstance(d, GiveUp):
                out.append(d)
        if isinstance(event, Finished):
            self._waiting.discard(event.id)
        return tuple(out)

    def _start(self, event: Event, d: Start) -> object:
        if d.mode is StartMode.HEDGE:
            return HedgeV1(d.id, d.backend)
        waited = d.id in self._waiting
        self._waiting.discard(d.id)
        if d.mode is StartMode.RETRY:  # a retry after a wait, or a stale continuation's, was "resumed"
            failed = isinstance(event, Failed) and event.id == d.id and event.delivered
            return StartV1(d.id, d.backend, waited or failed)
        return StartV1(d.id, d.backend, d.mode is not StartMode.FRESH)
