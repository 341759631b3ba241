"""`ranked-sjf` split between callers by token-fair sharing (`scheduler.fair_share`): the
grouping stage (`front.order.Stage`) that applies `front.fairshare`'s virtual token counters (VTC)
inside each rank, the scheduler built with it, and when a caller below its share may take a
running slot of a caller above it; pure.

    s = FairShareScheduler(QueueParams(fair_share=True), classes, weights={"team-a": 2.0})
    s.displaceable(waiting, running_ids)    # fair-share preemption: whose slots `waiting` may take
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from tailguard.front.fairshare import ANONYMOUS, VirtualCounters
from tailguard.front.params import ClassSpec, QueueParams
from tailguard.front.queue import BaseScheduler, Pending
from tailguard.front.ranked import RankedSjfScheduler


class CallerShare:
    """The caller fair-share stage: a request's group is its caller (its first arrival's, kept
    while it is suspended or waits for a retry), and callers go from the least virtual counter
    up. A request is charged its expected cost as it is first dispatched and corrected to its real
    use as it leaves (`settled`): VTC charges output as it is generated, which a gateway sees only
    for streams; charged at the start, a flood's running requests count against it at once (on the
    DES of `benchmarks/fair_share.py`, charging the output only at the end instead made no real
    difference)."""

    def __init__(self, cfg: QueueParams, weights: Mapping[str, float] | None = None) -> None:
        self.vtc = VirtualCounters(weights, cfg.fair_input_price, cfg.fair_output_price, cfg.fair_credit)
        self.live: dict[str, int] = {}  # queued requests per caller, over every class
        self.owner: dict[str, str] = {}  # request -> caller, from its arrival until it is settled

    def group(self, req: Pending) -> str:
        # A request queued again (suspended, waiting for a retry) is its first arrival's caller's.
        return self.owner.setdefault(req.id, req.caller if req.caller is not None else ANONYMOUS)

    def order(self, groups: Collection[str]) -> Iterable[str]:
        return self.vtc.least(groups)

    def added(self, req: Pending) -> None:
        caller = self.owner[req.id]
        live = self.live.get(caller, 0)
        if not live:
            self.vtc.arrived(caller, self.live)
        self.live[caller] = live + 1

    def removed(self, req: Pending) -> None:
        caller = self.owner[req.id]
        live = self.live[caller] - 1
        if live:
            self.live[caller] = live
        else:
            del self.live[caller]

    def dispatched(self, req: Pending) -> None:
        self.vtc.dispatched(req.id, self.owner[req.id], *_split(req))

    def settled(self, req_id: str, used_tokens: int) -> None:
        self.vtc.ended(req_id, used_tokens)
        self.owner.pop(req_id, None)


class FairShareScheduler(RankedSjfScheduler):
    """`ranked-sjf` with token-fair sharing between callers inside each rank (VTC: see
    `front.fairshare`): its order's first grouping stage is `CallerShare`. When a slot frees, the
    ranks and `min_share` guarantees decide as in `ranked-sjf`, then, within the chosen rank, the
    callers with requests waiting are tried from the least virtual counter up, and the rest of the
    order (`front.order`) picks among that caller's own requests. When no slot is free,
    `displaceable` says whose running requests the front may suspend for a caller below its share.

        s = FairShareScheduler(QueueParams(fair_share=True), classes, weights={"team-a": 2.0})
    """

    def __init__(self, cfg: QueueParams, classes: Iterable[ClassSpec],
                 weights: Mapping[str, float] | None = None) -> None:
        self.share = CallerShare(cfg, weights)
        super().__init__(cfg, classes, (self.share,))

    @property
    def vtc(self) -> VirtualCounters:
        return self.share.vtc

    @vtc.setter
    def vtc(self, vtc: VirtualCounters) -> None:
        self.share.vtc = vtc

    def take_served(self) -> dict[str, float]:
        return self.vtc.take_served()

    def served_elsewhere(self, service: Mapping[str, float]) -> None:
        self.vtc.absorb(service)

    def displaceable(self, waiting: Pending, running: Iterable[str]) -> set[str]:
        """Fair-share preemption: of the `running` requests, those `waiting` may take the slot of:
        the requests of the caller furthest above `waiting`'s, when even once charged for its own
        request `waiting`'s caller stays more than `fair_preempt_gap` below it. So that caller can
        never take the slot back in turn (it stays above), and two callers cannot suspend each
        other's requests in a loop."""
        owner = self.share.owner
        gap, me = self._cfg.fair_preempt_gap, owner.get(waiting.id)
        if gap is None or me is None:
            return set()
        by_caller: dict[str, set[str]] = {}
        for req_id in running:
            other = owner.get(req_id)
            if other is not None and other != me:
                by_caller.setdefault(other, set()).add(req_id)
        if not by_caller:
            return set()
        top = max(by_caller, key=lambda c: (self.vtc.counter(c), c))
        mine = self.vtc.counter(me) + self.vtc.cost(me, *_split(waiting))
        return by_caller[top] if self.vtc.counter(top) - mine > gap else set()

    def inherit(self, old: BaseScheduler) -> None:
        if isinstance(old, FairShareScheduler):
            self.vtc.keep(old.vtc)
            for req_id, caller in old.share.owner.items():
                self.share.owner.setdefault(req_id, caller)


def _split(req: Pending) -> tuple[int, int]:
    """A request's expected prompt and output tokens: its job size, of which its output limit is
    the output."""
    output = min(req.max_tokens or 0, req.est_tokens)
    return req.est_tokens - output, output
