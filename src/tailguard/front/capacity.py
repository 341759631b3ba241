"""How many backends the load needs to keep every class inside its queue bound (the autoscaler's
signal, `tailguard_capacity_needed`); pure, no I/O, told the time. Both drivers compute it with
this code: the gateway for `/metrics`, the discrete-event fleet run to add engines as it says.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tailguard.front.front import Front

DEFAULT_POOL = "default"  # the pool of a backend that names none (`front.params.BackendSpec.pool`)


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


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """One pool's reading: the backends its load needs, and those taking requests now."""

    needed: int
    ready: int


class Capacity:
    """The signal of each pool of a front's fleet. A request counts in its backend's pool, or in
    its class's first pool if it never reached one (as the last reading saw the front).

        capacity = Capacity()
        capacity.ended(backend, cls, now, service_s)    # each request, as it ends
        capacity.measure(front, now)                     # {pool: PoolCapacity(needed, ready)}
    """

    __slots__ = ("window_s", "signals", "_pool_of", "_class_pool")

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self.signals: dict[str, CapacitySignal] = {}
        self._pool_of: dict[str, str] = {}
        self._class_pool: dict[str, str] = {}

    def ended(self, backend: str | None, cls: str, now: float, service_s: float | None) -> None:
        pool = (self._pool_of.get(backend) if backend is not None else None) or self._class_pool.get(cls) \
            or DEFAULT_POOL
        signal = self.signals.get(pool)
        if signal is None:
            signal = self.signals[pool] = CapacitySignal(self.window_s)
        signal.ended(now, service_s)

    def measure(self, front: Front, now: float) -> dict[str, PoolCapacity]:
        """Per pool of the front's backends (those a reload is removing left out): its classes'
        queue and tightest bound, its backends' mean slots, the signal; a pool gone is forgotten."""
        views = [b for b in front.backends() if not b.retiring]
        self._pool_of = {b.name: b.pool for b in views}
        specs = front.params.classes
        self._class_pool = {spec.name: spec.pools[0] if spec.pools else DEFAULT_POOL for spec in specs}
        pools = sorted({b.pool for b in views})
        for gone in set(self.signals) - set(pools):
            del self.signals[gone]
        out: dict[str, PoolCapacity] = {}
        for pool in pools:
            members = [b for b in views if b.pool == pool]
            served = [spec for spec in specs if self._class_pool[spec.name] == pool] or list(specs)
            queued = sum(front.queue_len(spec.name) for spec in served)
            bound_s = min(spec.max_queue_wait_s for spec in served)
            slots = sum(b.max_concurrency for b in members) / len(members)
            signal = self.signals.setdefault(pool, CapacitySignal(self.window_s))
            out[pool] = PoolCapacity(signal.needed(now, queued, bound_s, slots),
                                     sum(1 for b in members if b.healthy and not b.ejected))
        return out
