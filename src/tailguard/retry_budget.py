"""The retry budget the gateway's front and the client share: retries may be at most a share of
recent calls plus a small floor per second. Pure, standard library only (the light client imports
it): no I/O, told the time.

From Finagle's `RetryBudget` and Envoy's `retry_budget` (gRPC's retry throttling is the same
idea): while a backend fails every call, a caller sends it at most (1 + ratio) times the offered
load instead of `max_attempts` times, and a transient error costs little.
"""

from __future__ import annotations

import math

# The window is counted in this many equal slices (Finagle's `WindowedAdder` does the same): the
# memory and the work per call stay fixed whatever the rate, and a count leaves with its slice, so
# it counts for between nine tenths of the window and all of it.
SLICES = 10


class RetryBudget:
    """Retries at most `ratio` of the calls started in the last `ttl_s` seconds, plus `min_per_s`
    per second (Finagle's defaults are 20% and 10/s over 10 s; an LLM client sends far fewer
    requests, so the floor here is 1/s; the gateway passes its own).

        budget = RetryBudget(ratio=0.2, min_per_s=1.0, ttl_s=10.0)
        budget.record_call(now)          # each call's (request's) first try deposits
        if budget.try_withdraw(now): ... # each retry withdraws, or is refused
    """

    __slots__ = ("ratio", "min_per_s", "ttl_s", "_slice_s", "_calls", "_retries", "_calls_sum", "_retries_sum",
                 "_tick")

    def __init__(self, ratio: float = 0.2, min_per_s: float = 1.0, ttl_s: float = 10.0) -> None:
        if ratio < 0 or min_per_s < 0 or ttl_s <= 0:
            raise ValueError("ratio and min_per_s must not be negative, ttl_s must be positive")
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.ttl_s = ttl_s
        self._slice_s = ttl_s / SLICES
        self._calls = [0] * SLICES
        self._retries = [0] * SLICES
        self._calls_sum = 0  # the slices' sums, kept as they change, so no call adds them up
        self._retries_sum = 0
        self._tick = 0  # the slice number (time // slice) the newest slice stands for

    def record_call(self, now: float) -> None:
        i = self._roll(now)
        self._calls[i] += 1
        self._calls_sum += 1

    def try_withdraw(self, now: float) -> bool:
        """Take one retry from the budget; False (and nothing taken) when it is spent."""
        i = self._roll(now)
        if self._retries_sum + 1 > self.ratio * self._calls_sum + self.min_per_s * self.ttl_s:
            return False
        self._retries[i] += 1
        self._retries_sum += 1
        return True

    def _roll(self, now: float) -> int:
        """The slice `now` counts in, after emptying the slices that left the window. A `now`
        before the newest slice (a clock that stepped back) counts in the newest."""
        tick = math.floor(now / self._slice_s)
        for t in range(self._tick + 1, min(tick, self._tick + SLICES) + 1):
            i = t % SLICES
            self._calls_sum -= self._calls[i]
            self._retries_sum -= self._retries[i]
            self._calls[i] = self._retries[i] = 0
        self._tick = max(tick, self._tick)
        return self._tick % SLICES
