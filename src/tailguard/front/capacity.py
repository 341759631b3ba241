"""How many backends the load needs to keep every class inside its queue bound and its TTFT target
(the autoscaler's signal, `tailguard_capacity_needed`); pure, no I/O, told the time. Both drivers
compute it with this code: the gateway for `/metrics`, the discrete-event fleet run to add engines
as it says.

By Little's law the slots busy on average are the arrival rate times the mean service time (bound
to the end). A backlog must also drain within the tightest class bound, which takes its size over
that bound in extra arrivals per second. Their sum in slots, over one backend's slots, rounded up,
is the backends needed:

    needed = ceil((rate + queued / bound_s) * service_s / slots_per_backend)

The rate counts every request that ended, refused ones too: a request shed for want of capacity
is demand the fleet did not meet, and counting only those served would cap the signal at what
the fleet already does.

A pool that serves a class with a TTFT target (`classes[].slo.ttft_s`) must also start its requests
soon enough: a request's wait for a slot may be at most the target (times `slo_margin`, as
admission holds it) less its TTFT once started, which the front's latency fit measures
(`Front.start_ttft_s`: `front.latency`, the same model that admits and routes). The slots form an
M/M/c queue (Erlang C): with `c` slots, offered load `a = rate x service_s`, the share of requests
that wait longer than `t` is `C(c, a) x exp(-(c - a) t / service_s)`. The backends needed are the
fewest whose slots keep that share within 1% at the budget (`SLO_SHARE`), and never fewer than the
queue bound asks for. So the signal says how many replicas hold the SLOs at the current arrival rate.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tailguard.front.front import Front
    from tailguard.front.params import ClassSpec
    from tailguard.front.tracked import BackendView

DEFAULT_POOL = "default"  # the pool of a backend that names none (`front.params.BackendSpec.pool`)
SLO_SHARE = 0.99  # of a TTFT target's requests that must get a slot within its budget (a P99 objective)


def backends_for_wait(load: float, service_s: float, budget_s: float, slots_per_backend: int,
                      max_backends: int) -> int:
    """The fewest backends of `slots_per_backend` slots each with which an M/M/c queue of offered
    `load` (Erlangs) and mean service `service_s` keeps P(wait > budget_s) within 1 - SLO_SHARE
    (`max_backends` if none up to it does). Erlang B by its recurrence, one slot at a time, so the
    whole search is one pass over the slots."""
    b = 1.0  # Erlang B with 0 servers
    c = 0
    for n in range(1, max_backends + 1):
        for _ in range(slots_per_backend):
            c += 1
            b = load * b / (c + load * b)
        if c <= load:
            continue
        erlang_c = c * b / (c - load * (1.0 - b))
        if erlang_c * math.exp(-(c - load) * budget_s / service_s) <= 1.0 - SLO_SHARE:
            return n
    return max_backends


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
        load = self._load(now)
        if load is None or slots_per_backend <= 0:
            return 0
        rate, service_s = load
        slots = (rate + queued / max(bound_s, 1e-3)) * service_s
        return math.ceil(slots / slots_per_backend - 1e-9)

    def needed_for_ttft(self, now: float, budget_s: float, slots_per_backend: int, max_backends: int = 1024) -> int:
        """Backends needed for all but `1 - SLO_SHARE` of requests to wait at most `budget_s` for a
        slot (Erlang C, see the module docstring); 0 while nothing has run in the window."""
        load = self._load(now)
        if load is None or slots_per_backend <= 0 or load[1] <= 0:
            return 0
        rate, service_s = load
        return backends_for_wait(rate * service_s, service_s, max(budget_s, 0.0), slots_per_backend, max_backends)

    def _load(self, now: float) -> tuple[float, float] | None:
        """The requests per second that ended in the window and the mean service time of those
        that ran; None while nothing has run in it."""
        self._expire(now)
        if not self._served or self._started_at is None:
            return None
        # A gateway up for less than a window has seen less than a window of requests.
        span_s = min(self.window_s, max(now - self._started_at, 1.0))
        return len(self._ends) / span_s, self._service_sum / self._served

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
            needed = signal.needed(now, queued, bound_s, slots)
            budget_s = _ttft_budget_s(front, served, members)
            if budget_s is not None:
                needed = max(needed, signal.needed_for_ttft(now, budget_s, max(1, round(slots))))
            out[pool] = PoolCapacity(needed, sum(1 for b in members if b.healthy and not b.ejected))
        return out


def _ttft_budget_s(front: Front, served: list[ClassSpec], members: list[BackendView]) -> float | None:
    """How long a request of the pool's tightest TTFT target may wait for a slot: the target times
    `slo_margin`, less the pool's slowest recent TTFT from a start (None: no class has a target)."""
    targets = [c.slo.ttft_s for c in served if c.slo is not None and c.slo.ttft_s is not None]
    if not targets:
        return None
    starts = [t for b in members if (t := front.start_ttft_s(b.name)) is not None]
    return min(targets) * front.params.queue.slo_margin - (max(starts) if starts else 0.0)
