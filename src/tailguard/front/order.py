"""The order inside a rank, as stages; pure, no I/O.

Between ranks, the scheduler goes by rank (with `min_share` guarantees: `front.queue`). Inside a
rank the order is composed of stages, tried in this order:

    rank -> caller fair share -> program attained service -> deadline (EDF) -> size (SJF), with aging

- **Grouping stages** (`Stage`) split the rank's queued requests into groups and say in which order
  the groups are tried: `front.fairqueue.CallerShare` (VTC's least virtual counter first, with
  `scheduler.fair_share`). Each stage's groups are split again by the next stage; the last stage's
  groups are the leaves (`Leaf`: one per class and group key), and the pick below chooses inside
  the first group (in the stages' order) that has an admissible request.
- **Program attained service (PLAS, `front.plas`)** is not a grouping stage but the first part of
  the pick's keys: a call's program level (and above level 0 its program's start) comes before its
  deadline and before its size (`plas.program_rank`, `plas.order_key`). So it orders each caller's
  own calls (inside `CallerShare`'s groups), and the pick's aging still bounds it, as issue 31
  built it (a grouping stage would hide an aged call behind a whole group). A call that names no
  program is at level 0, where the order is exactly the one below.
- **The pick** (`pick`) chooses one request among a set of leaves:
  1. aging: the oldest request, once it has waited `aging_s`, goes before any younger one;
  2. deadline: among the requests that can still make their deadline (`Pending.deadline_at`: its
     arrival plus its TTFT target; it can start by `deadline_at - service_s`, its predicted TTFT
     once started: `front.latency`), those of the lowest program rank, and of them the earliest
     deadline. A smaller job goes first instead when it can make its own deadline, overtakes the
     deadline request by `plas.overtakes` (same program rank, more than `sjf_size_ratio` times
     smaller), and the deadline request has `slack_s` to spare (about the time until another slot
     frees);
  3. the rest (no target, or a target it can no longer make: served late, after every request
     that can still make its own): the oldest, unless it is younger than `aging_s` and the first by
     `plas.order_key` overtakes it (a lower program level; at one level above 0 an older program;
     else more than `sjf_size_ratio` times smaller): then that one. With no targets anywhere this
     is issue 31's PLAS rule; with no programs either, `ranked-sjf`'s rule as it always was.

Size is a request's cost: its estimated tokens less those its backend's prefix cache is expected
to hold (`Pending.cost`), the uncached work Dynamo prices by.

Each leaf keeps its requests in heaps with lazy deletion (`Entry.alive`): by arrival, by size, by
deadline, and by cost descending (whom to shed first: `front.ranked`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, Callable, Protocol

from tailguard.front.params import ClassSpec
from tailguard.front.plas import OrderKey, order_key, overtakes, program_rank

if TYPE_CHECKING:
    from tailguard.front.queue import Pending


class Entry:
    """A queued request in the heaps: `alive` until it leaves; `late` once it can no longer make
    its deadline; `predicted` the raw wait expected as it was admitted (None: not predicted);
    `resumed` when it waits again after it started (suspended, or its retry waiting for a backend):
    admitted once, it is never refused for its target."""

    __slots__ = ("req", "seq", "alive", "late", "predicted", "resumed")

    def __init__(self, req: Pending, seq: int, predicted: float | None, resumed: bool = False) -> None:
        self.req = req
        self.seq = seq
        self.alive = True
        self.late = False
        self.predicted = predicted
        self.resumed = resumed


# Heap items: sort keys, then the sequence number (unique: ties never compare entries), then the entry.
_FifoItem = tuple[float, int, Entry]  # (arrived_at, seq, entry)
_SizeItem = tuple[OrderKey, float, int, Entry]  # ((level, program start, cost), arrived_at, seq, entry)
_DueItem = tuple[tuple[int, float], float, float, int, Entry]  # ((level, program start), deadline_at, cost, seq, entry)
_DearItem = tuple[float, int, Entry]  # (-cost, seq, entry)


class Refs:
    """Items in every heap of a scheduler, live or dead: when dead ones outnumber live ones, the
    heaps are compacted (bounded memory)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class Leaf:
    """The requests of one class (and, under grouping stages, of one group: `key`) in heaps."""

    __slots__ = ("cfg", "key", "fifo", "sjf", "due", "dear", "live", "refs")

    def __init__(self, cfg: ClassSpec, refs: Refs, key: tuple[str, ...] = ()) -> None:
        self.cfg = cfg
        self.key = key
        self.fifo: list[_FifoItem] = []
        self.sjf: list[_SizeItem] = []  # unused by FCFS
        self.due: list[_DueItem] = []  # requests with a deadline that can still make it
        self.dear: list[_DearItem] = []  # requests with a deadline in a class that sheds
        self.live = 0
        self.refs = refs

    def add(self, entry: Entry, ordered: bool) -> None:
        """Queue `entry`: by arrival, and when `ordered` (not FCFS) by size and deadline too."""
        req = entry.req
        self._push(self.fifo, (req.arrived_at, entry.seq, entry))
        if not ordered:
            self.live += 1
            return
        self._push(self.sjf, (order_key(req), req.arrived_at, entry.seq, entry))
        if req.deadline_at != math.inf:
            self._push(self.due, (program_rank(req), req.deadline_at, float(req.cost), entry.seq, entry))
            slo = self.cfg.slo
            if slo is not None and slo.shed:
                self._push(self.dear, (-float(req.cost), entry.seq, entry))
        self.live += 1

    def heaps(self) -> tuple[list[Any], ...]:
        return self.fifo, self.sjf, self.due, self.dear

    def compact(self) -> int:
        """Drop dead entries from every heap (in place: a caller may be walking one); the items left."""
        n = 0
        for heap in self.heaps():
            heap[:] = [it for it in heap if it[-1].alive]
            heapq.heapify(heap)
            n += len(heap)
        return n

    def oldest(self) -> _FifoItem | None:
        heap = self.fifo
        while heap and not heap[0][2].alive:
            self._pop(heap)
        return heap[0] if heap else None

    def smallest(self) -> _SizeItem | None:
        heap = self.sjf
        while heap and not heap[0][3].alive:
            self._pop(heap)
        return heap[0] if heap else None

    def earliest_due(self, now: float) -> _DueItem | None:
        """The earliest deadline among the requests that can still make theirs (of the programs
        that received least: `front.plas.program_rank`); those found unable to (their latest start
        passed) are marked late and leave this heap."""
        heap = self.due
        while heap:
            entry = heap[0][4]
            if entry.alive and latest_start(entry.req) >= now:
                return heap[0]
            if entry.alive:
                entry.late = True
            self._pop(heap)
        return None

    def costliest(self, now: float, n: int) -> list[Entry]:
        """Up to `n` of its requests with a deadline (in a class that sheds) that cost the most,
        costliest first: those already late first of all (their target is missed whatever
        happens). Reads the heap, changes nothing."""
        found = [it[2] for it in self.dear if it[2].alive and (it[2].late or latest_start(it[2].req) < now)]
        found.sort(key=lambda e: e.seq)
        if len(found) < n:
            found += [it[2] for it in heapq.nsmallest(n + 8, self.dear)
                      if it[2].alive and not it[2].late and latest_start(it[2].req) >= now]
        return found[:n]

    def _push(self, heap: list[Any], item: tuple[Any, ...]) -> None:
        heapq.heappush(heap, item)
        self.refs.n += 1

    def _pop(self, heap: list[Any]) -> None:
        heapq.heappop(heap)
        self.refs.n -= 1


def latest_start(req: Pending) -> float:
    """The last instant `req` can start and still get its first token by its deadline."""
    return req.deadline_at - (req.service_s or 0.0)


class Stage(Protocol):
    """A grouping stage of the order inside a rank (see the module docstring): which group a
    queued request is in, and in which order groups are tried. Told each request as it joins and
    leaves the queue, as it is dispatched and as it ends, to keep what it orders by."""

    def group(self, req: Pending) -> str:
        """The request's group; the same from its arrival to its end (a requeued request's too)."""
        ...

    def order(self, groups: Collection[str]) -> Iterable[str]:
        """`groups` (those with requests queued in the rank) in the order they are tried."""
        ...

    def added(self, req: Pending) -> None: ...

    def removed(self, req: Pending) -> None: ...

    def dispatched(self, req: Pending) -> None: ...

    def settled(self, req_id: str, used_tokens: int) -> None: ...


def pick(leaves: list[Leaf], now: float, aging_s: float, ratio: float, slack_s: float,
         admissible: Callable[[Pending], bool] | None) -> Entry | None:
    """The next request of `leaves` (one rank's, one group's) that `admissible` accepts, or None.

    A class whose candidate is refused is dropped from the choice and the rest tried again
    (admissibility is a per-class slot check, so its other requests would be refused too).
    """
    left = [q for q in leaves if q.live]
    while left:
        entry = choose(left, now, aging_s, ratio, slack_s)
        if admissible is None or admissible(entry.req):
            return entry
        left = [q for q in left if q.cfg.name != entry.req.cls]
    return None


def choose(left: list[Leaf], now: float, aging_s: float, ratio: float, slack_s: float) -> Entry:
    """`pick`'s rule (see the module docstring) among leaves that each hold a request."""
    oldest: _FifoItem | None = None
    smallest: _SizeItem | None = None
    due: _DueItem | None = None
    for q in left:
        f = q.oldest()
        j = q.smallest()
        assert f is not None and j is not None  # q.live > 0
        if oldest is None or f[:2] < oldest[:2]:
            oldest = f
        if smallest is None or j[:3] < smallest[:3]:
            smallest = j
        if q.due:
            d = q.earliest_due(now)
            if d is not None and (due is None or d[:4] < due[:4]):
                due = d
    assert oldest is not None and smallest is not None
    old = oldest[2]
    if oldest[0] <= now - aging_s:
        return old
    if due is not None:
        first, small = due[4], smallest[3]
        if (small is not first and small.req.deadline_at != math.inf and latest_start(small.req) >= now
                and overtakes(smallest[0], order_key(first.req), ratio) and latest_start(first.req) - now >= slack_s):
            return small
        return first
    return smallest[3] if overtakes(smallest[0], order_key(old.req), ratio) else old
