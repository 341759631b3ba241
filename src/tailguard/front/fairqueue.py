"""`ranked-sjf` split between callers by token-fair sharing (`scheduler.fair_share`): the
scheduler that applies `front.fairshare`'s virtual token counters (VTC) inside each rank, and
decides when a caller below its share may take a running slot of a caller above it; pure.

    s = FairShareScheduler(QueueParams(fair_share=True), classes, weights={"team-a": 2.0})
    s.displaceable(waiting, running_ids)    # fair-share preemption: whose slots `waiting` may take
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any, Callable

from tailguard.front.fairshare import ANONYMOUS, VirtualCounters
from tailguard.front.params import ClassSpec, QueueParams
from tailguard.front.plas import order_key
from tailguard.front.queue import BaseScheduler, Pending, RankedSjfScheduler, _ClassQueue, _Entry


class FairShareScheduler(RankedSjfScheduler):
    """`ranked-sjf` with token-fair sharing between callers inside each rank (VTC: see
    `front.fairshare`). Every class queue is split by caller; when a slot frees, the ranks and
    `min_share` guarantees decide as in `ranked-sjf`, then, within the chosen rank, the callers
    with requests waiting are tried from the least virtual counter up, and the shortest-job /
    aging rule picks among that caller's own requests. A request is charged its expected cost as
    it is first dispatched and corrected to its real use as it leaves (`settled`): VTC charges
    output as it is generated, which a gateway sees only for streams; charged at the start, a
    flood's running requests count against it at once (on the DES of `benchmarks/fair_share.py`,
    charging the output only at the end instead made no real difference). When no slot is free,
    `displaceable` says whose running requests the front may suspend for a caller below its share.

        s = FairShareScheduler(QueueParams(fair_share=True), classes, weights={"team-a": 2.0})
    """

    def __init__(self, cfg: QueueParams, classes: Iterable[ClassSpec],
                 weights: Mapping[str, float] | None = None) -> None:
        super().__init__(cfg, classes)
        self.vtc = VirtualCounters(weights, cfg.fair_input_price, cfg.fair_output_price, cfg.fair_credit)
        self._subs: dict[str, dict[str, _ClassQueue]] = {name: {} for name in self._queues}
        self._caller_live: dict[str, int] = {}  # queued requests per caller, over every class
        self._owner: dict[str, str] = {}  # request -> caller, from its arrival until it is settled
        self._refs_per_entry = 5

    def _on_add(self, req: Pending) -> None:
        super()._on_add(req)
        # A request queued again (suspended, waiting for a retry) is its first arrival's caller's.
        caller = self._owner.setdefault(req.id, req.caller if req.caller is not None else ANONYMOUS)
        subs = self._subs[req.cls]
        sub = subs.get(caller)
        if sub is None:
            sub = subs[caller] = _ClassQueue(self._queues[req.cls].cfg)
        entry = self._entries[req.id]
        sub.live += 1
        self._push(sub.fifo, (req.arrived_at, entry.seq, entry))
        self._push(sub.sjf, (order_key(req), req.arrived_at, entry.seq, entry))
        live = self._caller_live.get(caller, 0)
        if not live:
            self.vtc.arrived(caller, self._caller_live)
        self._caller_live[caller] = live + 1

    def _on_kill(self, req: Pending) -> None:
        super()._on_kill(req)
        caller = self._owner[req.id]
        self._subs[req.cls][caller].live -= 1
        live = self._caller_live[caller] - 1
        if live:
            self._caller_live[caller] = live
        else:
            del self._caller_live[caller]

    def _dispatched(self, entry: _Entry, now: float) -> Pending:
        req = super()._dispatched(entry, now)
        self.vtc.dispatched(req.id, self._owner[req.id], *_split(req))
        return req

    def settled(self, req_id: str, used_tokens: int) -> None:
        self.vtc.ended(req_id, used_tokens)
        self._owner.pop(req_id, None)

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
        gap, me = self._cfg.fair_preempt_gap, self._owner.get(waiting.id)
        if gap is None or me is None:
            return set()
        by_caller: dict[str, set[str]] = {}
        for req_id in running:
            other = self._owner.get(req_id)
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
            for req_id, caller in old._owner.items():
                self._owner.setdefault(req_id, caller)

    def _pick(
        self, group: list[_ClassQueue], aged_before: float, admissible: Callable[[Pending], bool] | None,
    ) -> _Entry | None:
        """The least-counter caller's pick among `group`'s classes; the next caller if none of
        its requests is admissible."""
        names = [q.cfg.name for q in group if q.live]
        callers = {c for n in names for c, sub in self._subs[n].items() if sub.live}
        for caller in self.vtc.least(callers):
            own = [sub for n in names if (sub := self._subs[n].get(caller)) is not None and sub.live]
            entry = super()._pick(own, aged_before, admissible)
            if entry is not None:
                return entry
        return None

    def _compact(self) -> None:
        super()._compact()
        refs = 0
        for subs in self._subs.values():
            for caller in [c for c, sub in subs.items() if not sub.live]:
                del subs[caller]
            for sub in subs.values():
                heaps: tuple[list[Any], ...] = (sub.fifo, sub.sjf)
                for heap in heaps:
                    heap[:] = [it for it in heap if it[-1].alive]
                    heapq.heapify(heap)
                    refs += len(heap)
        self._heap_refs += refs


def _split(req: Pending) -> tuple[int, int]:
    """A request's expected prompt and output tokens: its job size, of which its output limit is
    the output."""
    output = min(req.max_tokens or 0, req.est_tokens)
    return req.est_tokens - output, output
