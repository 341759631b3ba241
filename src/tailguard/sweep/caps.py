"""A backend's in-flight cap over a discrete-event run, read from the front after every event
(`sim.des.run(..., watch=history.watch)`): what an adaptive cap settled at; pure, no I/O.

    history = CapHistory("engine")
    run(engine, arrivals, clock, front, watch=history.watch)
    history.mean(30.0, 60.0), history.range(30.0, 60.0)
"""

from __future__ import annotations

from tailguard.front.front import Front


class CapHistory:
    """`backend`'s cap at each change: (since, cap)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.caps: list[tuple[float, int]] = []

    def watch(self, now: float, front: Front) -> None:
        """After an event at `now`: note the cap if it changed."""
        cap = front.backend(self.backend).cap
        if not self.caps or cap != self.caps[-1][1]:
            self.caps.append((now, cap))

    def mean(self, start: float, end: float) -> float:
        """The cap's mean over [start, end), weighted by time."""
        total = 0.0
        for (t, cap), (t_next, _) in zip(self.caps, [*self.caps[1:], (end, 0)]):
            total += cap * max(0.0, min(t_next, end) - max(t, start))
        return total / (end - start)

    def range(self, start: float, end: float) -> tuple[int, int]:
        """The lowest and highest cap in force during [start, end)."""
        during = [cap for (t, cap), (t_next, _) in zip(self.caps, [*self.caps[1:], (end, 0)])
                  if t < end and t_next > start]
        return min(during), max(during)
