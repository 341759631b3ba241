"""An adaptive in-flight cap for one backend, gradient-style; pure, no I/O.

A fixed `max_concurrency` is a guess: too low and the engine idles while the gateway queues, too
high and the engine queues requests itself, where the gateway can no longer order them (the
gateway only helps while its own queue is non-empty). `AdaptiveCap` moves the cap between two
bounds from the latency the backend shows, as Netflix concurrency-limits' `Gradient2Limit`
(concurrency-limits-core/src/main/java/com/netflix/concurrency/limits/limit/Gradient2Limit.java)
does for an RPC server:

    gradient = max(0.5, min(1.0, tolerance * long / short))   # long-term vs short-term latency
    target   = cap + headroom(cap) if gradient == 1 else cap * gradient
    cap      = cap * (1 - smoothing) + target * smoothing

Two latencies, each with its own long and short averages, and the smaller gradient wins:

- **TTFT from the request's start upstream** (its `Start`): what the engine adds before the first
  token, its own queue and the prefill. The gateway's queue wait is never in it (that is the
  TTFT of a request that did not wait in the gateway), so a low cap does not read as a slow
  engine. It jumps once the cap passes what the engine runs at once (`max_num_seqs`, KV room):
  past that, more in flight only queues inside the engine.
- **ITL** (a request's mean gap between content chunks): the price every running stream pays
  for one more sequence in the batch. Not E2E, which grows with the answer's length whatever
  the load.

As in Gradient2: the long-term average is an exponential average over `long_window` samples
(their plain mean for the first ten), pulled down by a tenth when it is over twice the short
one (latency back to normal after a long overload); the cap does not grow while fewer than
half of it are in flight (the backend is not what limits); the gradient is floored at 0.5 so one
outlier never halves the cap. Three departures, measured on the DES of tests/unit/sweep/test_adaptive_des.py
(an engine of 64 sequences whose swept knee is 56, and one of 8 whose knee is 8):

- Gradient2's long-term average takes every sample alike, so under a lasting overload it learns
  the congested latency as normal and the cap creeps up: from a start of 32 on the 8-sequence
  engine it settled at 20 (13-31). Here a sample over `tolerance` x the long-term average weighs a
  tenth in it (`CONGESTED_WEIGHT`): 10 (8-14).
- Gradient2 adds its headroom whatever the gradient, so the cap settles where the headroom makes
  up for the cut, never below 8 with its fixed queue size of 4 (4 with a square root), and with a
  long-term average that congestion hardly moves, at twice the 8-sequence engine's knee (15).
  Here the headroom is added only while latency is within tolerance: 7.8-10 there, 57 on the
  64-sequence engine (60-62 with the headroom always added).
- Gradient2's short measurement is the last sample; an LLM request's TTFT swings with its
  prompt's length, so here it is a short exponential average (`short_window`).

Updates count samples, not seconds, as Gradient2's do, so the object is not told the time: a busy
backend adapts faster, an idle one does not drift. Both drivers hand it the same samples at the
same moments: a TTFT as each request's first content comes (the front takes it from its own
`Start` to the driver's `FirstContent`), a mean ITL as it ends (`front.samples`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WARMUP = 10  # Gradient2's ExpAvgMeasurement: the first samples are averaged plainly
# What a sample over `tolerance` x the long-term average weighs in that average, against one within
# it: congestion must last ten times as long to become the new normal.
CONGESTED_WEIGHT = 0.1


@dataclass(frozen=True, slots=True)
class AdaptiveParams:
    """Bounds and gains of one backend's adaptive cap (defaults from the DES sweep in
    tests/unit/sweep/test_adaptive_des.py and benchmarks/adaptive_caps.py). `initial` None starts
    at the backend's `max_concurrency`."""

    min_cap: int = 1
    max_cap: int = 256
    initial: int | None = None
    smoothing: float = 0.1  # the share of each new estimate taken (Gradient2's 0.2 swung 12-94 on the DES)
    tolerance: float = 1.5  # short-term latency may reach this multiple of the long-term one
    long_window: int = 600  # samples in the long-term average (Gradient2's default)
    short_window: int = 10  # samples in the short-term average

    def __post_init__(self) -> None:
        if not 1 <= self.min_cap <= self.max_cap:
            raise ValueError(f"adaptive bounds need 1 <= min ({self.min_cap}) <= max ({self.max_cap})")
        if not 0.0 < self.smoothing <= 1.0 or self.tolerance < 1.0 or self.short_window < 1 or self.long_window < 2:
            raise ValueError("adaptive gains out of range: 0 < smoothing <= 1, tolerance >= 1, windows >= 1")


def headroom(cap: float) -> float:
    """Gradient2's queue size as a function of the cap (its `SquareRootFunction` shape): how far
    the cap may grow past what it carries while latency holds. A square root grows a small cap
    a slot at a time and a large one in bigger steps, so both reach their level in a similar
    number of samples."""
    return max(1.0, math.sqrt(cap))


class _Latency:
    """One latency's long-term and short-term averages."""

    __slots__ = ("long", "short", "count", "_long_w", "_short_w", "_tolerance")

    def __init__(self, long_window: int, short_window: int, tolerance: float) -> None:
        self.long = 0.0
        self.short = 0.0
        self.count = 0
        self._long_w = 2.0 / (long_window + 1)
        self._short_w = 2.0 / (short_window + 1)
        self._tolerance = tolerance

    def add(self, sample: float) -> float:
        """Take one sample; the gradient factor long/short it leaves (before the tolerance)."""
        self.count += 1
        if self.count <= WARMUP:
            self.long += (sample - self.long) / self.count
            self.short = self.long
        else:
            congested = sample > self._tolerance * self.long
            self.long += (sample - self.long) * (self._long_w * CONGESTED_WEIGHT if congested else self._long_w)
            self.short += (sample - self.short) * self._short_w
        if self.short > 0.0 and self.long > 2.0 * self.short:
            self.long *= 0.9
        return self.long / self.short if self.short > 0.0 else 1.0


class AdaptiveCap:
    """One backend's in-flight cap, moved by latency samples.

        cap = AdaptiveCap(AdaptiveParams(min_cap=2, max_cap=64), start=8)
        cap.observe(ttft_s=0.04, itl_s=0.012, in_flight=8)   # -> the new cap (an int)
    """

    __slots__ = ("params", "_estimate", "_ttft", "_itl")

    def __init__(self, params: AdaptiveParams, start: int) -> None:
        self.params = params
        first = params.initial if params.initial is not None else start
        self._estimate = float(min(params.max_cap, max(params.min_cap, first)))
        self._ttft = _Latency(params.long_window, params.short_window, params.tolerance)
        self._itl = _Latency(params.long_window, params.short_window, params.tolerance)

    @property
    def cap(self) -> int:
        return int(self._estimate)

    def observe(self, ttft_s: float | None, itl_s: float | None, in_flight: int) -> int:
        """One request's latency on this backend (either may be missing: no content yet, a
        single chunk) with `in_flight` requests there now; returns the cap after it."""
        ratio = math.inf
        if ttft_s is not None and ttft_s > 0.0:
            ratio = self._ttft.add(ttft_s)
        if itl_s is not None and itl_s > 0.0:
            ratio = min(ratio, self._itl.add(itl_s))
        if ratio == math.inf or in_flight < self._estimate / 2:
            return self.cap
        p, est = self.params, self._estimate
        gradient = max(0.5, min(1.0, p.tolerance * ratio))
        target = est * gradient if gradient < 1.0 else est + headroom(est)
        est = est * (1.0 - p.smoothing) + target * p.smoothing
        self._estimate = min(float(p.max_cap), max(float(p.min_cap), est))
        return self.cap
