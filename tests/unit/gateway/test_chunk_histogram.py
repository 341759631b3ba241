"""The per-chunk histogram counts as a bisect would, whatever order its values come in: its
last-bucket shortcut (a stream's gaps mostly fall in one bucket) never misplaces one."""

from __future__ import annotations

import math
import random
from bisect import bisect_left

import pytest

from tailguard.gateway.ops.catalog import ITL_BUCKETS
from tailguard.gateway.ops.histograms import ChunkHistogram


def _reference(values: list[float]) -> list[int]:
    counts = [0] * (len(ITL_BUCKETS) + 1)
    for v in values:
        counts[bisect_left(ITL_BUCKETS, v)] += 1
    return counts


@pytest.mark.parametrize("values", [
    [0.0061] * 5,  # one bucket throughout
    [0.005, 0.005, 0.0050001, 0.005],  # on a bound (it belongs below) and just past it
    [0.0, -1.0, 0.001, 0.00099, 5.0, 5.1, 1e9, math.inf, 0.001],  # the first and the +Inf buckets
    [random.Random(seed).choice([0.0005, 0.003, 0.006, 0.03, 2.0, 7.0]) for seed in range(200)],
])
def test_counts_and_sum_are_those_of_a_bisect(values: list[float]) -> None:
    h = ChunkHistogram(ITL_BUCKETS)
    for v in values:
        h.observe(v)
    assert h.counts == _reference(values)
    assert h.sum == sum(values)
