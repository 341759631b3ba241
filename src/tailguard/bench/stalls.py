"""Where the generator's event-loop stalls went: running its own code, waiting for a CPU that
other processes held, or neither (blocked in a call). An invalid run's verdict said "the event loop
stalled (another process took its CPU, or ...)" as a guess; this makes it a measurement, so a
user knows whether to move the servers off the generator's cores or to spread the generator.

Linux's scheduler statistics (`/proc/thread-self/schedstat`: nanoseconds on a CPU, nanoseconds
runnable but waiting on a run queue, timeslices; the "sched_info" of
Documentation/scheduler/sched-stats.rst) are read once per tick of the loop-lag ticker, one
`pread` of a file held open (a few microseconds). A tick that came late by more than the
dispatch-lag threshold is a stall: its wall time, its time past due, and the CPU and run-queue
time the loop's thread got in it, are added up (the shares the verdict gives are of the time past
due: the 10 ms the ticker asked to sleep is nobody's fault). Elsewhere (no such file) nothing is measured and the verdict keeps its
guess.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

SCHEDSTAT = "/proc/thread-self/schedstat"

class SchedClock:
    """The calling thread's (on-CPU, waiting-for-a-CPU) seconds so far, or None where the kernel
    does not say. Open it on the thread that runs the event loop."""

    def __init__(self, path: str = SCHEDSTAT) -> None:
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> tuple[float, float] | None:
        if self._fd is None:
            return None
        try:
            on_cpu, waiting = os.pread(self._fd, 128, 0).split()[:2]
            return int(on_cpu) / 1e9, int(waiting) / 1e9
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(slots=True)
class Stalls:
    """The run's stalls added up, in wall seconds (a property of the generator's machine, never
    rescaled to a simulator's clock)."""

    measured: bool = False  # the kernel said (no stall at all is a measurement too)
    count: int = 0
    wall_s: float = 0.0  # the late ticks' whole intervals, the 10 ms asked for included
    late_s: float = 0.0  # their time past due: what the verdict's shares are of
    running_s: float = 0.0
    waiting_s: float = 0.0

    def add(self, wall_s: float, late_s: float, before: tuple[float, float] | None,
            after: tuple[float, float] | None) -> None:
        if before is None or after is None:
            return
        self.count += 1
        self.wall_s += wall_s
        self.late_s += late_s
        self.running_s += max(0.0, after[0] - before[0])
        self.waiting_s += max(0.0, after[1] - before[1])

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, **{key: round(getattr(self, key), 6) for key in _SECONDS}, "source": SCHEDSTAT}


_SECONDS = ("wall_s", "late_s", "running_s", "waiting_s")


def merged(parts: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The stalls of a run spread over processes: each worker's added up (None if one did not measure)."""
    if not parts or any(p is None for p in parts):
        return None
    seconds = {key: round(sum(p[key] for p in parts if p is not None), 6) for key in _SECONDS}
    return {"count": sum(p["count"] for p in parts if p is not None), **seconds, "source": SCHEDSTAT}


def host() -> dict[str, Any]:
    """The machine the generator ran on, as it stood at the run's end: its CPUs and load average."""
    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cpus": os.cpu_count(), "load_average": load}
