"""Where a request goes: the least-loaded healthy backend that has a slot its class may take;
pure, no I/O, reads the pool and changes nothing.
"""

from __future__ import annotations

from collections.abc import Collection

from tailguard.front.queue import Pending
from tailguard.front.slots import BackendPool


def choose(pool: BackendPool, pending: Pending, now: float, exclude: Collection[str] = ()) -> str | None:
    """The backend for `pending`, or None when no healthy backend has room for its class.

    Load is in-flight / (max_concurrency * weight). Ties go to the backend acquired least
    recently, which spreads equal load round-robin while keeping the choice a pure function of
    the pool's state. `exclude` names backends already tried (retry after a failure).
    """
    best: str | None = None
    best_key = (0.0, 0)
    for s in pool:
        if not s.healthy or s.name in exclude or not pool.has_capacity(s.name, pending.cls):
            continue
        key = (s.in_flight / (s.cfg.max_concurrency * s.cfg.weight), s.last_acquired)
        if best is None or key < best_key:
            best, best_key = s.name, key
    return best
