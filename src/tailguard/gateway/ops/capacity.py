"""How many backends the load needs to keep every class inside its queue bound (the autoscaler's
signal, `tailguard_capacity_needed`); pure, no I/O, told the time.

By Little's law the slots busy on average are the arrival rate times the mean service time (bound
to the end). A backlog must also drain within the tightest class bound, which takes its size over
that bound in extra arrivals per second. Their sum in slots, over one backend's slots, rounded up,
is the backends needed:

    needed = ceil((rate + queued / bound_s) * service_s / slots_per_backend)

The rate counts every request that ended, refused ones too: a request shed for want of capacity
is demand the fleet did not meet, and counting only those served would cap the signal at what
the fleet already does.
"""

from __future__ import annotations

import math
from collections import deque


class CapacitySignal:
    """Requests that ended in the last `window_s`, and the service time of those that ran.

        signal = CapacitySignal(window_s=60.0)
        signal.ended(now, service_s=2.5)      # each request, as it ends (None: it never ran)
        signal.needed(now, queued=12, bound_s=1.0, slots_per_backend=8)
    """

    __slots__ = ("window_s", "_ends", "_service_sum", "_served", "_started_at")

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._ends: deque[tuple[float, float | None]] = deque()
        self._service_sum = 0.0
        self._served = 0
        self._started_at: float | None = None

    def ended(self, now: float, service_s: float | None) -> None:
        if self._started_at is None:
            self._started_at = now
        self._ends.append((now, service_s))
        if service_s is not None:
            self._service_sum += service_s
            self._served += 1
        self._expire(now)

    def needed(self, now: float, queued: int, bound_s: float, slots_per_backend: float) -> int:
        """Backends needed now: 0 while nothing has run in the window (nothing to size from)."""
        self._expire(now)
        if not self._served or slots_per_backend <= 0 or self._started_at is None:
            return 0
        # A gateway up for less than a window has seen less than a window of requests.
        span_s = min(self.window_s, max(now - self._started_at, 1.0))
        rate = len(self._ends) / span_s
        service_s = self._service_sum / self._served
        slots = (rate + queued / max(bound_s, 1e-3)) * service_s
        return math.ceil(slots / slots_per_backend - 1e-9)

    def _expire(self, now: float) -> None:
        ends = self._ends
        while ends and ends[0][0] < now - self.window_s:
            _, service_s = ends.popleft()
            if service_s is not None:
                self._service_sum -= service_s
                self._served -= 1
