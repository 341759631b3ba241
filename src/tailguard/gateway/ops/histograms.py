"""Lock-free histograms for the relay's per-chunk (and per-request) observations, exported as
Prometheus histograms at scrape time (`ChunkHistograms`); the C step (`_speedups.c`) updates a
`ChunkHistogram`'s slots in place.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from tailguard.gateway.ops.catalog import MetricSpec


class ChunkHistogram:
    """A lock-free histogram for per-chunk (and per-request) observations: one bisect and two adds.

    prometheus_client's Histogram takes a lock per bucket increment; at tens of thousands of
    chunks a second that is most of the relay's own CPU. The event loop is single-threaded, so
    plain integers are safe; `ChunkHistograms` exports them at scrape time.
    """

    __slots__ = ("bounds", "counts", "sum", "_i", "_lo", "_hi")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        # The bucket the last value fell in, (_lo, _hi]: a stream's gaps mostly fall in one
        # bucket, and two comparisons cost a third of a `bisect` call.
        self._i = 0
        self._lo = self._hi = -math.inf

    def observe(self, value: float) -> None:
        if self._lo < value <= self._hi:
            self.counts[self._i] += 1
        else:
            b = self.bounds
            self._i = i = bisect_left(b, value)
            self._lo = b[i - 1] if i else -math.inf
            self._hi = b[i] if i < len(b) else math.inf
            self.counts[i] += 1
        self.sum += value

    def observe_zeros(self, n: int) -> None:
        """`n` chunks that arrived in the same read as the previous one: no gap."""
        self.counts[0] += n


class ChunkHistograms:
    """A labelled family of `ChunkHistogram`s, collected as a Prometheus histogram."""

    def __init__(self, spec: MetricSpec, registry: CollectorRegistry) -> None:
        self.spec = spec
        self._children: dict[tuple[str, ...], ChunkHistogram] = {}
        registry.register(self)

    def labels(self, *values: str) -> ChunkHistogram:
        h = self._children.get(values)
        if h is None:
            h = self._children[values] = ChunkHistogram(self.spec.buckets)
        return h

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.spec.name, self.spec.help, labels=list(self.spec.labels))]

    def collect(self) -> Iterator[Metric]:
        spec = self.spec
        fam = HistogramMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        for values, h in self._children.items():
            buckets: list[tuple[str, float]] = []
            acc = 0
            for bound, c in zip(spec.buckets, h.counts):
                acc += c
                buckets.append((repr(float(bound)), acc))
            buckets.append(("+Inf", acc + h.counts[-1]))
            fam.add_metric(list(values), buckets, h.sum)
        yield fam
