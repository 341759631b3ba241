"""Hedged requests: when a request of a hedged class has no first token after a delay tied to
its class's recent TTFT, the same request goes to a second backend too, and the first to stream
content wins; pure, no I/O, told the time.

"The Tail at Scale" (Dean and Barroso, 2013) hedges after the 95th-percentile latency, so about
one request in twenty is sent twice, and bounds the extra load. Here the delay is `factor` x the
`quantile` of the class's engine-side TTFTs (from the request's start on its backend to its first
content: a queue in the gateway is not the backend's slowness), over the last `samples` requests,
never less than `min_delay_s`, and only once `min_samples` are known. Hedges are at most
`max_share` of the class's requests of the last `window_s` (a budget like the retry budget's,
`tailguard.retry_budget`), so a fleet that is slow everywhere is not sent twice its load.

    hedger = Hedger(params)
    hedger.arrived(cls, now)                 # each request of the class
    at = hedger.due_at(cls, started_at)      # when it is hedged if no content came (None: never)
    hedger.observe(cls, ttft_s)              # each first content of an unhedged request
"""

from __future__ import annotations

import heapq

from tailguard.front.params import HedgeParams
from tailguard.retry_budget import RetryBudget

# The quantile is recomputed every this many samples, not on every request: a sort of a few
# hundred floats per start would be admission's largest cost.
_RECOMPUTE_EVERY = 16


class _ClassTtft:
    """The latest TTFT samples of one class and their quantile."""

    __slots__ = ("samples", "next", "count", "value", "since")

    def __init__(self, size: int) -> None:
        self.samples = [0.0] * size
        self.next = 0
        self.count = 0
        self.value: float | None = None
        self.since = 0  # samples since `value` was computed


class Hedger:
    """TTFT quantiles per hedged class, the hedges due, and the budget that bounds them."""

    def __init__(self, params: HedgeParams) -> None:
        self.params = params
        self._ttft: dict[str, _ClassTtft] = {c: _ClassTtft(params.samples) for c in params.classes}
        self._budget = RetryBudget(params.max_share, 0.0, params.window_s)
        self._due: list[tuple[float, str]] = []  # (when, request id), earliest first
        self._armed: set[str] = set()  # the requests of `_due` still waiting for their hedge

    def hedges(self, cls: str) -> bool:
        return self.params.enabled and cls in self._ttft

    def arrived(self, cls: str, now: float) -> None:
        """A request of `cls` arrived: what the budget is a share of."""
        if self.hedges(cls):
            self._budget.record_call(now)

    def observe(self, cls: str, ttft_s: float) -> None:
        """A request of `cls` had its first content `ttft_s` after it started on its backend."""
        t = self._ttft.get(cls)
        if t is None:
            return
        t.samples[t.next] = ttft_s
        t.next = (t.next + 1) % len(t.samples)
        t.count = min(t.count + 1, len(t.samples))
        t.since += 1
        if t.count <= 2 * _RECOMPUTE_EVERY or t.since >= _RECOMPUTE_EVERY:  # each sample while they are few
            ordered = sorted(t.samples[:t.count])
            t.value = ordered[min(t.count - 1, int(self.params.quantile * t.count))]
            t.since = 0

    def delay(self, cls: str) -> float | None:
        """How long a request of `cls` may go without content before it is hedged (None: it is
        not, off for the class or too few samples yet)."""
        t = self._ttft.get(cls)
        if not self.params.enabled or t is None or t.value is None or t.count < self.params.min_samples:
            return None
        return max(self.params.min_delay_s, self.params.factor * t.value)

    def arm(self, req_id: str, cls: str, started_at: float) -> None:
        """The request started on its backend at `started_at`: its hedge is due after the delay."""
        d = self.delay(cls)
        if d is not None:
            heapq.heappush(self._due, (started_at + d, req_id))
            self._armed.add(req_id)

    def disarm(self, req_id: str) -> None:
        """Its content came, or it ended: no hedge for it."""
        self._armed.discard(req_id)

    def next_due(self) -> float | None:
        due = self._due
        while due and due[0][1] not in self._armed:  # disarmed ones leave lazily
            heapq.heappop(due)
        return due[0][0] if due else None

    def due(self, now: float) -> list[str]:
        """The armed requests whose hedge is due by `now`, each once."""
        out = []
        while self._due and self._due[0][0] <= now:
            req_id = heapq.heappop(self._due)[1]
            if req_id in self._armed:
                self._armed.discard(req_id)
                out.append(req_id)
        return out

    def allowed(self, now: float) -> bool:
        """Take one hedge from the budget; False when it is spent."""
        return self._budget.try_withdraw(now)

    def reconfigure(self, params: HedgeParams) -> None:
        """New settings; the samples of classes still hedged are kept, the budget starts afresh."""
        old = self._ttft
        self.params = params
        self._ttft = {c: old.get(c) or _ClassTtft(params.samples) for c in params.classes}
        self._budget = RetryBudget(params.max_share, 0.0, params.window_s)
