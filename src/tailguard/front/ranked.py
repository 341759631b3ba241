"""`ranked-sjf`, the gateway's scheduler: priority between class ranks with guaranteed minimum
shares, and inside a rank the order of `front.order` (grouping stages, program level, earliest
deadline, shortest job, aging), admission and shedding by deadline; pure, no I/O.

`front.queue` holds what every policy shares (`Pending`, `BaseScheduler`'s queues, bounds and
admission) and the FCFS baseline; `front.fairqueue` adds caller fair share on top of this one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from typing import Callable

from tailguard.front.order import Entry, Leaf, Stage, latest_start, pick
from tailguard.front.params import ClassSpec, QueueParams
from tailguard.front.queue import BaseScheduler, Pending

# Job sizes are bucketed by powers of two to estimate "how many of my rank are shorter than me"
# in O(1) without an order-statistics tree; within a factor of two is enough for an admission guess.
_SIZE_BUCKETS = 64
# At most this many queued requests are shed for one that arrives: shedding k that would make their
# targets for one that would not is a loss now, repaid only as the work they leave undone serves others.
_MAX_SHED = 2


class RankedSjfScheduler(BaseScheduler):
    """Priority by rank with guaranteed minimum shares; inside a rank, the order of
    `front.order`: grouping stages (`stages`: caller fair share, and where it is added, program
    attained service), then earliest deadline first among the requests that can still make theirs,
    shortest job first across a real size gap, aging so none starves.

    When a slot frees (`pop`):
    1. Guarantees: a class with requests queued that holds fewer than
       `floor(min_share * (running + 1))` of the dispatched requests goes first (earlier ranks
       first among several). `running + 1` is the slot count whenever the backends are full,
       which is the only time the order decides who waits, so no backend count is needed.
    2. Otherwise the earliest rank with an admissible request, and in it `front.order.pick`.
       Without targets: the oldest request goes, unless it is younger than `aging_s` and another
       is more than `sjf_size_ratio` times smaller: then the smallest goes.

    The aging bound: once request R has waited `aging_s`, no request younger than R of its rank
    is dispatched before R by rule 2 (as long as R's class is admissible at that pop).

        s = RankedSjfScheduler(QueueParams(aging_s=10), classes)
        s.push(Pending("a", "batch", 1, 2080, arrived_at=0.0, wait_bound_at=600.0), now=0.0)
        s.pop(now=0.5, admissible=lambda p: pool_has_room_for(p.cls))
    """

    _uses_sjf = True

    def __init__(self, cfg: QueueParams, classes: Iterable[ClassSpec], stages: Sequence[Stage] = ()) -> None:
        super().__init__(cfg, classes)
        self._stages = tuple(stages)
        # Under grouping stages, each class's requests are split again by their groups' keys.
        self._subs: dict[str, dict[tuple[str, ...], Leaf]] = {name: {} for name in self._queues}
        self._keys: dict[str, tuple[str, ...]] = {}  # a queued request's leaf key
        targets = any(q.cfg.slo is not None and q.cfg.slo.ttft_s is not None for q in self._queues.values())
        # Heaps per request: arrival, size and bound, and with targets deadline and cost; again
        # under grouping stages.
        self._refs_per_entry = (5 if targets else 3) * (2 if self._stages else 1)
        ranks = sorted({q.cfg.rank for q in self._queues.values()})
        self._groups: list[list[Leaf]] = [
            [q for q in self._queues.values() if q.cfg.rank == r] for r in ranks
        ]
        self._rank_index = {r: i for i, r in enumerate(ranks)}
        self._rank_live = [0] * len(ranks)
        self._rank_sizes = [[0] * _SIZE_BUCKETS for _ in ranks]  # requests with no deadline, by size
        self._rank_due: list[list[float]] = [[] for _ in ranks]  # deadlines of those with one, sorted
        self._guaranteed = [q for group in self._groups for q in group if q.cfg.min_share > 0]

    def pop(self, now: float, admissible: Callable[[Pending], bool] | None = None) -> Pending | None:
        if self._guaranteed:
            slots = self._running_total + 1
            for q in self._guaranteed:
                if q.live and self._running_by_class[q.cfg.name] < math.floor(q.cfg.min_share * slots + 1e-9):
                    entry = self._pick([q], now, admissible)
                    if entry is not None:
                        return self._dispatched(entry, now)
        for i, group in enumerate(self._groups):
            if self._rank_live[i]:
                entry = self._pick(group, now, admissible)
                if entry is not None:
                    return self._dispatched(entry, now)
        return None

    def _head(self, now: float) -> Pending | None:
        # The best of the first rank with requests queued; min_share guarantees are left out:
        # they decide between ranks only when a slot is free anyway.
        for i, group in enumerate(self._groups):
            if self._rank_live[i]:
                entry = self._pick(group, now, None)
                return entry.req if entry is not None else None
        return None

    def _pick(self, group: list[Leaf], now: float, admissible: Callable[[Pending], bool] | None) -> Entry | None:
        """The next request of `group` (classes of one rank) that `admissible` accepts, or None:
        through the grouping stages, then `front.order.pick`."""
        if not self._stages:
            return self._pick_in(group, now, admissible)
        leaves = [leaf for q in group if q.live for leaf in self._subs[q.cfg.name].values() if leaf.live]
        return self._pick_stage(leaves, 0, now, admissible)

    def _pick_stage(self, leaves: list[Leaf], level: int, now: float,
                    admissible: Callable[[Pending], bool] | None) -> Entry | None:
        if level == len(self._stages):
            return self._pick_in(leaves, now, admissible)
        by_group: dict[str, list[Leaf]] = {}
        for leaf in leaves:
            by_group.setdefault(leaf.key[level], []).append(leaf)
        for g in self._stages[level].order(by_group):
            entry = self._pick_stage(by_group[g], level + 1, now, admissible)
            if entry is not None:
                return entry
        return None

    def _pick_in(self, leaves: list[Leaf], now: float, admissible: Callable[[Pending], bool] | None) -> Entry | None:
        cfg = self._cfg
        return pick(leaves, now, cfg.aging_s, cfg.sjf_size_ratio, self.admission.slot_s(), admissible)

    def _bucket(self, est_tokens: int) -> int:
        return min(_SIZE_BUCKETS - 1, max(0, est_tokens).bit_length())

    def _on_add(self, req: Pending) -> None:
        i = self._rank_index[req.rank]
        self._rank_live[i] += 1
        if req.deadline_at == math.inf:
            self._rank_sizes[i][self._bucket(req.cost)] += 1
        else:
            bisect.insort(self._rank_due[i], req.deadline_at)
        if self._stages:
            key = self._keys[req.id] = tuple(stage.group(req) for stage in self._stages)
            subs = self._subs[req.cls]
            leaf = subs.get(key)
            if leaf is None:
                leaf = subs[key] = Leaf(self._queues[req.cls].cfg, self._refs, key)
            leaf.add(self._entries[req.id], True)
            for stage in self._stages:
                stage.added(req)

    def _on_kill(self, req: Pending) -> None:
        i = self._rank_index[req.rank]
        self._rank_live[i] -= 1
        if req.deadline_at == math.inf:
            self._rank_sizes[i][self._bucket(req.cost)] -= 1
        else:
            due = self._rank_due[i]
            del due[bisect.bisect_left(due, req.deadline_at)]
        if self._stages:
            self._subs[req.cls][self._keys.pop(req.id)].live -= 1
            for stage in self._stages:
                stage.removed(req)

    def _dispatched(self, entry: Entry, now: float) -> Pending:
        req = super()._dispatched(entry, now)
        for stage in self._stages:
            stage.dispatched(req)
        return req

    def settled(self, req_id: str, used_tokens: int) -> None:
        for stage in self._stages:
            stage.settled(req_id, used_tokens)

    def _ahead(self, req: Pending, q: Leaf) -> int:
        """Queued requests expected to leave before `req`: all of higher ranks; of its own rank,
        with a deadline, those due no later than it (for one with none, all of them), and with no
        deadline, those no more than about its size (same power-of-two bucket or smaller)."""
        i = self._rank_index[req.rank]
        higher = sum(self._rank_live[:i])
        due = self._rank_due[i]
        if req.deadline_at != math.inf:
            return higher + bisect.bisect_right(due, req.deadline_at)
        return higher + len(due) + sum(self._rank_sizes[i][: self._bucket(req.cost) + 1])

    def _ahead_of_class(self, q: Leaf) -> int:
        return sum(self._rank_live[: self._rank_index[q.cfg.rank]])

    def _make_room(self, req: Pending, late_s: float, now: float) -> bool:
        need = self.admission.requests_in(late_s)
        if need is None or need > _MAX_SHED:
            return False
        found: list[Entry] = []
        for q in self._groups[self._rank_index[req.rank]]:
            found += q.costliest(now, need)
        late = [e for e in found if e.late or latest_start(e.req) < now]
        dear = sorted((e for e in found if not e.late and latest_start(e.req) >= now and e.req.cost > req.cost),
                      key=lambda e: (-e.req.cost, e.seq))
        victims = (late + dear)[:need]
        if len(victims) < need:
            return False
        for e in victims:
            self._kill(e)
            self._shed.append(e.req)
        return True

    def _leaves(self) -> Iterable[Leaf]:
        yield from self._queues.values()
        for subs in self._subs.values():
            for key in [k for k, leaf in subs.items() if not leaf.live]:
                del subs[key]
            yield from subs.values()
