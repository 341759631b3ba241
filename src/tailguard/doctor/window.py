"""A sliding window of /metrics snapshots and what `tailguard top` reads from it: rates of
counters and histogram quantiles over the window, as PromQL's `rate` and `histogram_quantile`
would give them; pure, no I/O, told the time.
"""

from __future__ import annotations

import math
from collections import deque

from tailguard.doctor.evidence import Samples


def _labels(key: tuple[tuple[str, str], ...]) -> dict[str, str]:
    return dict(key)


class Window:
    """Snapshots of the last `span_s` seconds (at least two kept, so a rate always has a base).

        w = Window(span_s=60.0)
        w.add(now, parse(page))
        w.rate("tailguard_rejected_total", by="class")          # {"interactive": 0.5, ...}
        w.quantile("tailguard_ttft_seconds", 0.99, by="class")   # {"interactive": 0.31, ...}
    """

    def __init__(self, span_s: float = 60.0) -> None:
        self.span_s = span_s
        self._snaps: deque[tuple[float, Samples]] = deque()

    def add(self, now: float, samples: Samples) -> None:
        self._snaps.append((now, samples))
        while len(self._snaps) > 2 and self._snaps[1][0] <= now - self.span_s:
            self._snaps.popleft()

    @property
    def latest(self) -> Samples:
        return self._snaps[-1][1] if self._snaps else {}

    def gauge(self, name: str, by: str) -> dict[str, float]:
        """The latest value of each series of `name`, summed by label `by`."""
        return _sum_by(self.latest, name, by)

    def rate(self, name: str, by: str, where: dict[str, str] | None = None,
             exclude: dict[str, str] | None = None) -> dict[str, float]:
        """Per second over the window, summed by label `by`; a counter that went down (a
        restart) counts from zero, as Prometheus does."""
        if len(self._snaps) < 2:
            return {}
        (t0, first), (t1, last) = self._snaps[0], self._snaps[-1]
        if t1 <= t0:
            return {}
        old = _sum_by(first, name, by, where, exclude)
        out: dict[str, float] = {}
        for group, value in _sum_by(last, name, by, where, exclude).items():
            base = old.get(group, 0.0)
            out[group] = (value - base if value >= base else value) / (t1 - t0)
        return out

    def quantile(self, histogram: str, q: float, by: str) -> dict[str, float | None]:
        """The `q` quantile of the observations made during the window, per label `by` (None
        while a group has none), interpolated inside its bucket like `histogram_quantile`."""
        if len(self._snaps) < 2:
            return {}
        first, last = self._snaps[0][1], self._snaps[-1][1]
        old, new = _buckets(first, histogram, by), _buckets(last, histogram, by)
        out: dict[str, float | None] = {}
        for group, counts in new.items():
            base = old.get(group, {})
            out[group] = _quantile(q, {le: c - base.get(le, 0.0) for le, c in counts.items()})
        return out


def _matches(labels: dict[str, str], where: dict[str, str] | None, exclude: dict[str, str] | None) -> bool:
    if where and any(labels.get(k) != v for k, v in where.items()):
        return False
    return not (exclude and any(labels.get(k) == v for k, v in exclude.items()))


def _sum_by(samples: Samples, name: str, by: str, where: dict[str, str] | None = None,
            exclude: dict[str, str] | None = None) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, key), value in samples.items():
        if n != name:
            continue
        labels = _labels(key)
        if by in labels and _matches(labels, where, exclude):
            out[labels[by]] = out.get(labels[by], 0.0) + value
    return out


def _buckets(samples: Samples, histogram: str, by: str) -> dict[str, dict[float, float]]:
    out: dict[str, dict[float, float]] = {}
    for (n, key), value in samples.items():
        if n != histogram + "_bucket":
            continue
        labels = _labels(key)
        if by in labels:
            group = out.setdefault(labels[by], {})
            le = float(labels["le"])
            group[le] = group.get(le, 0.0) + value
    return out


def _quantile(q: float, cumulative: dict[float, float]) -> float | None:
    bounds = sorted(cumulative)
    total = cumulative.get(math.inf, 0.0)
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for le in bounds:
        count = cumulative[le]
        if count >= rank:
            if math.isinf(le):
                return prev_bound  # past the last finite bucket: its bound, as Prometheus says
            in_bucket = count - prev_count
            return prev_bound + (le - prev_bound) * ((rank - prev_count) / in_bucket if in_bucket else 1.0)
        prev_bound, prev_count = le, count
    return prev_bound


def top(values: dict[str, float], n: int) -> list[tuple[str, float]]:
    """The `n` largest, largest first (ties by name, so a refresh does not reorder them)."""
    return sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
