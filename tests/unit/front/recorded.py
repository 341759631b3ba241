"""A front that writes down what its driver hands it, as `tailguard serve --record` does: for
tests that record a walk or a DES run and replay it."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tailguard.front.events import Decision, Event
from tailguard.front.front import Front
from tailguard.front.params import FrontParams
from tailguard.recording.codec import Header, header_line, step_line


class RecordedFront(Front):
    """`lines`: the recording so far (its header first), one JSON text per line."""

    def __init__(self, params: FrontParams) -> None:
        super().__init__(params)
        self.lines = [json.dumps(header_line(Header(params)))]

    def handle(self, event: Event, now: float, *, preempt: bool = True) -> Sequence[Decision]:
        decisions = super().handle(event, now, preempt=preempt)
        self.lines.append(json.dumps(step_line(event, now, preempt, decisions)))
        return decisions
