"""How long a batch line waits before it is sent again after a transient failure; pure, no I/O.
Doubling from `base_s`, capped, no jitter needed: the front, not the clock, spreads lines out."""

from __future__ import annotations

_CAP_S = 60.0


def retry_delay_s(attempts: int, base_s: float) -> float:
    """The wait after the `attempts`-th failed attempt (1: `base_s`, 2: twice that, ...)."""
    return min(_CAP_S, base_s * 2.0 ** max(0, attempts - 1))
