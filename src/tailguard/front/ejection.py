"""Passive health: backends taken out for a while after failing requests in a row; pure, no I/O.

Envoy's outlier detection, in its shape: `consecutive_failures` failed attempts in a row on one
backend (refused or timed-out connections, 5xx, a response head that never came: what a dead,
hung or broken host does) eject it for `base_s` x the number of times it has been ejected, capped
at `max_s`; an answered request resets the count. At most `max_ejected_share` of a pool may be out
at once, but one backend always may be (Envoy's `always_eject_one_host`: in a fleet of two,
the dead one must be able to leave). When an
ejection ends the backend takes requests again: a host that still fails is found by its next
failures, and stays out longer each time.

Active probes (`front.slots`: healthy/unhealthy) and ejection are kept apart: a probe sees
whether a server answers its health page; ejection sees what its requests meet. A backend takes
requests when it is healthy and not ejected.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailguard.front.params import EjectionParams


@dataclass(slots=True)
class _Record:
    failures: int = 0  # consecutive failed attempts
    times: int = 0  # how many times it has been ejected
    until: float | None = None  # ejected until this instant (None: not ejected)


@dataclass(frozen=True, slots=True)
class Ejection:
    """One ejection decided: for how long, after how many failures in a row."""

    backend: str
    for_s: float
    failures: int
    times: int


class Ejector:
    """Consecutive failures and ejections per backend.

        ej = Ejector(params)
        ej.failed("b1", now, pool_members)   # an Ejection when this failure ejects it
        ej.answered("b1")
        ej.ejected("b1")
        ej.returns(now)                       # backends whose ejection is over
    """

    def __init__(self, params: EjectionParams) -> None:
        self.params = params
        self._by: dict[str, _Record] = {}
        self._out = 0  # backends ejected now (their `until` set)

    def ejected(self, backend: str) -> bool:
        r = self._by.get(backend)
        return r is not None and r.until is not None

    def failed(self, backend: str, now: float, pool: list[str]) -> Ejection | None:
        """A failed attempt on `backend`, a member of `pool` (the backends it shares a pool
        with, itself included). An `Ejection` when it is taken out now."""
        p = self.params
        r = self._by.setdefault(backend, _Record())
        r.failures += 1
        if not p.enabled or r.until is not None or r.failures < p.consecutive_failures:
            return None
        out = sum(1 for b in pool if self.ejected(b))
        if out and (out + 1) > p.max_ejected_share * len(pool):
            return None  # enough of its pool is out; it stays in, its failures still counted
        r.times += 1
        for_s = min(p.base_s * r.times, p.max_s)
        r.until = now + for_s
        self._out += 1
        return Ejection(backend, for_s, r.failures, r.times)

    def answered(self, backend: str) -> None:
        """An attempt on `backend` got an answer: its run of failures is over."""
        r = self._by.get(backend)
        if r is not None:
            r.failures = 0

    def next_return(self) -> float | None:
        """When the earliest ejection ends, or None."""
        if not self._out:
            return None
        return min(r.until for r in self._by.values() if r.until is not None)

    def returns(self, now: float) -> list[str]:
        """The backends whose ejection has ended by `now`, taken back in."""
        if not self._out:
            return []
        back = [b for b, r in self._by.items() if r.until is not None and r.until <= now]
        for b in back:
            r = self._by[b]
            r.until, r.failures = None, 0
            self._out -= 1
        return back

    def reconfigure(self, params: EjectionParams) -> None:
        self.params = params

    def forget(self, backend: str) -> None:
        r = self._by.pop(backend, None)
        if r is not None and r.until is not None:
            self._out -= 1
