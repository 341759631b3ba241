"""Who goes next: the scheduler protocol and its policies; pure, no I/O.

`tailguard.front.front.Front` owns one and drives it; the gateway and the discrete-event run
drive the front, passing `now` in, so a policy is evaluated on a million requests without a socket.

Policies, by name in `front.schedulers.SCHEDULERS`:
- `fcfs`: arrival order across all classes (the baseline the benefit is measured against); here.
- `ranked-sjf` (`front.ranked`; the order inside a rank in `front.order`): priority between class
  ranks; within a rank, shortest estimated job first (across a real size gap, `sjf_size_ratio`), except that a request which has waited `aging_s` is overtaken
  by no younger request of its rank. A class below its `min_share` of the slots in use goes before
  higher ranks, so a stream of interactive work cannot starve batch work for ever.
  A call of an agent program goes by its program's attained service before its deadline and
  its size (`front.plas`, PLAS, in `front.order`'s keys): calls of programs that have received
  less go first; aging bounds it too.
  With `fair_share`, `front.fairqueue.FairShareScheduler` splits each rank between callers
  (VTC) and keeps this rule among each caller's own requests.

Both keep per-class queues bounded (`max_queue_len`), refuse a request whose expected wait exceeds
its bound, and drop requests that waited past it. How many requests are ahead is the policy's
to say; what that means in seconds, and the Retry-After, is `tailguard.front.admission`'s: each
scheduler owns one, asks it at every arrival and tells it of every departure and completion.
Push, pop, remove and expire are O(log n) (heaps with lazy deletion, compacted when dead entries
outnumber live ones, so memory stays bounded).
"""

from __future__ import annotations

import abc
import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Callable

from tailguard.front.admission import Admission, misses_alone
from tailguard.front.order import Entry, Leaf, Refs, latest_start
from tailguard.front.params import ClassSpec, QueueParams
from tailguard.front.refusal import Refusal
from tailguard.types import Outcome, RejectReason


@dataclass(slots=True, frozen=True)
class Pending:
    """A request waiting in front of the backends."""

    id: str
    cls: str
    rank: int  # lower goes first
    est_tokens: int  # estimated prompt tokens + capped max_tokens: the job size for SJF
    arrived_at: float
    wait_bound_at: float  # past this instant it leaves the queue with a 503
    caller: str | None = None  # whose request (fair sharing between callers)
    max_tokens: int | None = None  # its output limit: what of `est_tokens` is output (fair sharing)
    level: int = 0  # its program's attained-service level as it arrived (`front.plas`; 0: none)
    program_at: float = 0.0  # when its program started (`front.plas`: above level 0, older programs first)
    deadline_at: float = math.inf  # its first token is due (arrival + its TTFT target; inf: no target)
    service_s: float | None = None  # its predicted TTFT once started (`front.latency`; None: not known)
    cached_tokens: int = 0  # of its prompt, expected in its backend's prefix cache (`front.prefix`)

    @property
    def cost(self) -> int:
        """Its size for the order and for shedding: the work it brings that no cache holds."""
        return self.est_tokens - self.cached_tokens

    def waited_out(self, now: float) -> bool:
        """Whether it has waited its class's whole bound by `now` (a queued request that leaves
        earlier leaves because it can no longer make its TTFT target)."""
        return self.wait_bound_at <= now


class BaseScheduler(abc.ABC):
    """Bookkeeping shared by the policies: per-class queues, deadlines, the running set, and
    the `admission` estimate they feed. FCFS semantics for what is ahead of a request;
    subclasses define `pop` and may refine `_ahead`.
    """

    _uses_sjf = False

    def __init__(self, cfg: QueueParams, classes: Iterable[ClassSpec]) -> None:
        self._cfg = cfg
        self._refs = Refs()  # items in all heaps, live or dead: the compaction trigger
        self._queues: dict[str, Leaf] = {c.name: Leaf(c, self._refs) for c in classes}
        if not self._queues:
            raise ValueError("a scheduler needs at least one class")
        self._entries: dict[str, Entry] = {}
        self._bounds: list[tuple[float, int, Entry]] = []  # (wait_bound_at, seq, entry)
        self._seq = 0
        self._refs_per_entry = 3 if self._uses_sjf else 2
        self.admission = Admission(cfg)  # expected waits, drain rate, Retry-After
        # How many are dispatched and not yet finished, per class (pop adds, on_finish and requeue
        # take away): what min_share guarantees are measured against. Counts only: which requests
        # run is the front's request table's to know.
        self._running_by_class: dict[str, int] = {name: 0 for name in self._queues}
        self._running_total = 0
        self._shed: list[Pending] = []  # queued requests shed for cheaper ones, for the front to refuse

    # --- the policy's interface -----------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, req: Pending, now: float) -> Refusal | None:
        """Queue `req`, or say why not: its class's queue is full, it is expected to wait past its
        bound, or (with a TTFT target, in a class that sheds) it is predicted to miss its target
        and no costlier queued request can make room for it (`_make_room`)."""
        q = self._queue_of(req)
        if req.id in self._entries:
            raise ValueError(f"request id {req.id!r} is already queued")
        if q.live >= q.cfg.max_queue_len:
            return Refusal(RejectReason.QUEUE_FULL, self.admission.queue_full_s(self._ahead_of_class(q)))
        ahead = self._ahead(req, q)
        predicted_s = self.admission.predict_s(ahead)
        retry_s = self.admission.refusal_s(predicted_s, req.wait_bound_at - now)
        if retry_s is not None:
            return Refusal(RejectReason.WAIT_BOUND, retry_s)
        if req.deadline_at != math.inf:
            wait_s = predicted_s if predicted_s is not None else self.admission.recent_predict_s(ahead)
            late = self.admission.late_s(wait_s, req.service_s, req.deadline_at - now, self._cfg.slo_margin)
            slo = q.cfg.slo
            if late is not None and slo is not None and slo.shed and not self._make_room(req, late, now):
                return Refusal(RejectReason.DEADLINE, self.admission.clamp(late))
        self._add(req, q, predicted_s, False)
        return None

    def predicted(self, req_id: str, service_s: float) -> Pending | None:
        """A queued request admitted before its TTFT could be predicted (no backend's fit was
        ready) has its prediction now: from here it leaves at its latest start, as one admitted
        with it does (`_leave_at`). Its size for the order is kept (the heaps are keyed by it).
        The request as now queued, or None when `req_id` is not queued."""
        entry = self._entries.get(req_id)
        if entry is None:
            return None
        entry.req = replace(entry.req, service_s=service_s)
        leave_at = self._leave_at(entry, self._queue_of(entry.req))
        if leave_at < entry.req.wait_bound_at:
            self._push(self._bounds, (leave_at, entry.seq, entry))
        return entry.req

    def take_shed(self) -> list[Pending]:
        """The queued requests the last `push` shed to make room (they have left the queue): the
        front refuses each (`RejectReason.SHED`)."""
        out, self._shed = self._shed, []
        return out

    def remove(self, req_id: str, now: float) -> bool:
        entry = self._entries.get(req_id)
        if entry is None:
            return False
        self._kill(entry)
        return True

    def expire(self, now: float) -> list[Pending]:
        """The queued requests that leave unserved now: those that waited their class's bound
        (`wait_bound_at` passed) and, in a class that sheds, those that can no longer make their
        TTFT target (`_leave_at`). Both leave the queue; the front refuses each."""
        out: list[Pending] = []
        heap = self._bounds
        while heap:
            bound_at, _, entry = heap[0]
            if entry.alive and bound_at > now:
                break
            self._pop(heap)
            if entry.alive:
                if entry.req.waited_out(now):  # a wait the bound cut short: a (low) sample of it
                    self.admission.learn(entry.predicted, now - entry.req.arrived_at)
                self._kill(entry)
                out.append(entry.req)
        return out

    def next_wakeup(self) -> float | None:
        heap = self._bounds
        while heap and not heap[0][2].alive:
            self._pop(heap)
        # An infinite bound never expires: no wakeup, rather than a timer at infinity.
        return heap[0][0] if heap and heap[0][0] != math.inf else None

    def settled(self, req_id: str, used_tokens: int) -> None:
        """Request `req_id` left the front having used `used_tokens` (0: none was generated):
        what fair sharing charges (`front.fairqueue`); the other policies ignore it."""

    def displaceable(self, waiting: Pending, running: Iterable[str]) -> set[str]:
        """Of the `running` requests (of `waiting`'s own rank), those whose slot `waiting` may take
        (fair-share preemption, `front.fairqueue`); none, for the other policies."""
        return set()

    def take_served(self) -> dict[str, float]:
        """The fair-share service given to each caller since the last call, for the other
        replicas (`front.fairqueue`); nothing, for the other policies."""
        return {}

    def served_elsewhere(self, service: Mapping[str, float]) -> None:
        """Other replicas gave each caller this much fair-share service (`front.fairqueue`);
        the other policies ignore it."""

    def inherit(self, old: BaseScheduler) -> None:
        """A live reconfiguration: take over what `old` knew beyond its queue (fair-share
        counters); nothing for the policies without such state."""

    def take_over(self, old: BaseScheduler) -> None:
        """A live reconfiguration (`front.schedulers.carry_over`): this new, empty scheduler takes
        `old`'s admission measurements, running counts, queued requests (in arrival order, each
        with its class's new rank, no admission check) and whatever `inherit` adds."""
        self.admission = old.admission.carry_over(self._cfg)
        self.inherit(old)
        for cls in self._running_by_class:
            self._running_by_class[cls] = old._running_by_class.get(cls, 0)
        self._running_total = old._running_total
        for entry in sorted(old._entries.values(), key=lambda e: (e.req.arrived_at, e.seq)):
            req = replace(entry.req, rank=self._queues[entry.req.cls].cfg.rank)
            self._add(req, self._queue_of(req), entry.predicted, entry.resumed)

    def on_finish(self, running_cls: str | None, outcome: Outcome, now: float) -> None:
        """A dispatched request ended: a completion for the drain rate. `running_cls`: its class
        if it held a slot (None: it ended while suspended, already out of the running counts)."""
        if running_cls is not None:
            self._not_running(running_cls)
        self.admission.completed(now, len(self._entries))

    # --- public extras for drivers and metrics ----------------------------------------------

    def running(self, cls: str | None = None) -> int:
        """Requests popped and not yet finished (of class `cls`, or all)."""
        if cls is None:
            return self._running_total
        return self._running_by_class.get(cls, 0)

    def queue_len(self, cls: str) -> int:
        """Requests of class `cls` waiting now (the `tailguard_queue_length` gauge)."""
        q = self._queues.get(cls)
        return q.live if q is not None else 0

    def head(self, now: float) -> Pending | None:
        """The request `pop` would choose if every backend had room: the one a preemption would
        make room for. None when nothing is queued."""
        return self._head(now)

    def take(self, req_id: str, now: float) -> Pending:
        """Dispatch the queued request `req_id` now (the slot a preemption freed is its)."""
        return self._dispatched(self._entries[req_id], now)

    def requeue(self, req: Pending, now: float) -> None:
        """A running request was suspended: it leaves the running set and waits again, with no
        admission check (it was admitted once; refusing it now would cut a response in half).
        Its `arrived_at` is kept, so aging and arrival order count from its first arrival."""
        self._not_running(req.cls)
        if req.id in self._entries:
            raise ValueError(f"request id {req.id!r} is already queued")
        self._add(req, self._queue_of(req), None, True)

    def guaranteed(self, cls: str) -> bool:
        """True when suspending one running request of `cls` would put the class below its
        `min_share` of the running requests (a preemption must not undo a guarantee)."""
        share = self._queues[cls].cfg.min_share
        if share <= 0:
            return False
        return self._running_by_class[cls] - 1 < math.floor(share * self._running_total + 1e-9)

    # --- internals -------------------------------------------------------------------------

    def _queue_of(self, req: Pending) -> Leaf:
        q = self._queues.get(req.cls)
        if q is None:
            raise ValueError(f"unknown class {req.cls!r} (known: {', '.join(self._queues)})")
        if q.cfg.rank != req.rank:
            raise ValueError(f"request {req.id!r} has rank {req.rank}, but class {req.cls!r} has rank {q.cfg.rank}")
        return q

    @abc.abstractmethod
    def pop(self, now: float, admissible: Callable[[Pending], bool] | None = None) -> Pending | None:
        """The policy itself: which admissible queued request goes next."""

    @abc.abstractmethod
    def _head(self, now: float) -> Pending | None:
        """`pop`'s choice without the admissibility check, left queued."""

    def _ahead(self, req: Pending, q: Leaf) -> int:
        """Queued requests expected to leave before `req` (FCFS: all of them)."""
        return len(self._entries)

    def _ahead_of_class(self, q: Leaf) -> int:
        """Requests that must leave before the head of `q` does (for queue_full's Retry-After)."""
        return 0

    def _make_room(self, req: Pending, late_s: float, now: float) -> bool:
        """Shed what costs most per target met: `req` is predicted to miss its deadline by
        `late_s`; if enough queued requests of its rank (with a target, in classes that shed) cost
        more than it does, or can no longer make their own target at all, to bring it inside its
        own once they are gone, they leave the queue (`take_shed`) and True; else nothing changes.
        None for the policies that do not order by deadline."""
        return False

    def _add(self, req: Pending, q: Leaf, predicted: float | None, resumed: bool) -> None:
        self._seq += 1
        entry = Entry(req, self._seq, predicted, resumed)
        self._entries[req.id] = entry
        q.add(entry, self._uses_sjf)
        self._push(self._bounds, (self._leave_at(entry, q), entry.seq, entry))
        self._on_add(req)

    def _leave_at(self, entry: Entry, q: Leaf) -> float:
        """When a queued request leaves unserved: at its class's wait bound, and in a class that
        sheds, once it can no longer start in time to make its TTFT target (its latest start, by
        its predicted TTFT once started): served then, it would be late anyway, and the slot it
        takes would make a request that can still make its own target late too. As at admission,
        only a request whose TTFT is predicted, and that could make its target if it started at
        once, is refused for it (`admission.misses_alone`); one queued again after it started
        (suspended, or its retry waiting for a backend) waits for its bound only: it was admitted."""
        req = entry.req
        slo = q.cfg.slo
        if (entry.resumed or req.service_s is None or slo is None or not slo.shed
                or misses_alone(req.service_s, req.deadline_at - req.arrived_at, self._cfg.slo_margin)):
            return req.wait_bound_at
        return min(req.wait_bound_at, latest_start(req))

    def _dispatched(self, entry: Entry, now: float) -> Pending:
        """`entry` leaves the queue for a backend slot."""
        self.admission.learn(entry.predicted, now - entry.req.arrived_at)
        self._kill(entry)
        req = entry.req
        self._running_by_class[req.cls] += 1
        self._running_total += 1
        return req

    def _not_running(self, cls: str) -> None:
        self._running_by_class[cls] -= 1
        self._running_total -= 1

    def _on_add(self, req: Pending) -> None:
        pass

    def _on_kill(self, req: Pending) -> None:
        pass

    def _kill(self, entry: Entry) -> None:
        entry.alive = False
        req = entry.req
        del self._entries[req.id]
        self._queues[req.cls].live -= 1
        self._on_kill(req)
        if not self._entries:
            self.admission.emptied()
        if self._refs.n > self._refs_per_entry * len(self._entries) * 2 + 256:
            self._compact()

    def _push(self, heap: list[tuple[float, int, Entry]], item: tuple[float, int, Entry]) -> None:
        heapq.heappush(heap, item)
        self._refs.n += 1

    def _pop(self, heap: list[tuple[float, int, Entry]]) -> None:
        heapq.heappop(heap)
        self._refs.n -= 1

    def _compact(self) -> None:
        """Drop dead entries from every heap: amortised O(1) per removal, bounded memory.

        In place, because a caller may be walking one of these lists when a removal triggers it.
        """
        heap = self._bounds
        heap[:] = [it for it in heap if it[-1].alive]
        heapq.heapify(heap)
        self._refs.n = len(heap) + sum(q.compact() for q in self._leaves())

    def _leaves(self) -> Iterable[Leaf]:
        """Every leaf holding heaps (the class queues, and those of any grouping stage)."""
        return self._queues.values()


class FcfsScheduler(BaseScheduler):
    """Arrival order across every class: what an engine's own queue does, as a baseline.

    `pop` takes the oldest admissible request, so a class held back by its slot share does not
    block the others.
    """

    def pop(self, now: float, admissible: Callable[[Pending], bool] | None = None) -> Pending | None:
        best: tuple[float, int, Entry] | None = None
        for q in self._queues.values():
            head = q.oldest()
            if head is None or (best is not None and head[:2] >= best[:2]):
                continue
            if admissible is not None and not admissible(head[2].req):
                continue
            best = head
        if best is None:
            return None
        return self._dispatched(best[2], now)

    def _head(self, now: float) -> Pending | None:
        heads = [h for h in (q.oldest() for q in self._queues.values()) if h is not None]
        return min(heads, key=lambda h: h[:2])[2].req if heads else None
