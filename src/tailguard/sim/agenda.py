"""What falls due in a discrete-event run (`sim.des`) apart from arrivals and the front's wake-ups,
and in which order: a step's end, a header deadline, a host's death, revival or probe, the
autoscaler; pure, no I/O."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from tailguard.sim.engine import Step
from tailguard.sim.live import Autoscaler, LiveHost
from tailguard.sim.scenario import Host


@dataclass(slots=True, frozen=True)
class StepEnd:
    host: LiveHost
    step: Step


@dataclass(slots=True, frozen=True)
class HeaderDeadline:
    req_id: str
    attempt: int


# What falls due, in the order of things at the same instant (after arrivals and wake-ups): a
# probe sent as a host dies finds it dead. The last four happen to a host whatever its requests
# do, and a run with only those left is over.
STEP_END, HEADER_DEADLINE, DEATH, REVIVAL, PROBE_TIMEOUT, PROBE = range(6)
SCALE = 6  # the autoscaler reads the signal (`Autoscaler`), or (with a Host) an engine it asked for is up

Due = StepEnd | HeaderDeadline | LiveHost | Autoscaler | Host


class Agenda:
    """A heap of (at, order, sequence, what): the sequence keeps the order things were scheduled
    in among those of one order at one instant. The run's loop reads `heap` directly (it is hot)."""

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Due]] = []
        self.seq = 0

    def schedule(self, at: float, order: int, what: Due) -> None:
        heapq.heappush(self.heap, (at, order, self.seq, what))
        self.seq += 1
