"""Clocks: one interface for the asyncio drivers (scaled real time) and the discrete-event run
(virtual time). Policies never read a clock; drivers do, and pass `now` in.

`time_scale` means wall seconds per simulated second (simpy's `factor`): 0.1 runs ten times
faster than real time.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Simulated seconds since the clock started."""
        ...

    def wall_delay(self, until: float) -> float:
        """Real seconds to wait before simulated instant `until` (0 if it has passed)."""
        ...


class ScaledClock:
    def __init__(self, time_scale: float = 1.0, source: Callable[[], float] = time.monotonic) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.time_scale = time_scale
        self._source = source
        self._start = source()

    def now(self) -> float:
        return (self._source() - self._start) / self.time_scale

    def wall_delay(self, until: float) -> float:
        return max(0.0, (until - self.now()) * self.time_scale)

    def to_wall(self, duration_s: float) -> float:
        """Wall seconds that a simulated duration takes."""
        return duration_s * self.time_scale


class VirtualClock:
    """Never sleeps: the discrete-event driver and unit tests move it forward explicitly."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def wall_delay(self, until: float) -> float:
        return 0.0

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"cannot move a VirtualClock back from {self._now} to {t}")
        self._now = t


# A clock as the gateway's parts are given it: seconds, read by a call.
Now = Callable[[], float]

# The gateway's one clock, which its composer (`gateway.http.app.create_app`) passes to every part
# that reads the time; no part reads it for itself (tests/test_layering.py), so a test hands them
# a clock of its own. The front is told it, and every instant of a request's record,
# `Server-Timing`, the access log, the watchdog's deadlines and the probes read it, so any two
# instants of the gateway can be subtracted. Monotonic with sub-microsecond resolution; not the
# event loop's `loop.time()`, which uvloop keeps in whole milliseconds.
monotonic: Now = time.perf_counter
