"""The front's binding of queued requests to backends: the pump that takes the queue's order
onto free slots, the routing choice a request may take, the preemption that makes room for the
best waiting request, and the slot given back when an attempt ends. Kept apart from `front.Front`
(the chokepoint, its table and the events) because it is the one path every start goes through,
whichever event led to it; `front.recovery.Recovery` builds on it (a retry is bound the same way)
and `Front` on that, so the state below is `Front`'s own, declared here."""

from __future__ import annotations

from collections.abc import Collection

from tailguard.front.ejection import Ejector
from tailguard.front.events import Decision, Retired, Start, StartMode, Suspend
from tailguard.front.hedging import Hedger
from tailguard.front.latency import Latency
from tailguard.front.pacing import Pacer
from tailguard.front.params import ClassSpec
from tailguard.front.preemption import Candidate, PreemptionPolicy
from tailguard.front.programs import ProgramBook
from tailguard.front.queue import BaseScheduler, Pending
from tailguard.front.router import PREFIX_BLOCK_TOKENS, Router
from tailguard.front.slots import BackendPool, BackendState
from tailguard.front.tracked import State, Tracked


class Binding:
    """Queued requests onto free slots, in the queue's order, making room by preemption."""

    _classes: dict[str, ClassSpec]
    _queue: BaseScheduler
    _slots: BackendPool
    _ejector: Ejector
    _router: Router
    _latency: Latency
    _programs: ProgramBook
    _pacer: Pacer
    _hedger: Hedger
    _policy: PreemptionPolicy | None
    _predicts: bool
    _reqs: dict[str, Tracked]
    _candidates: dict[str, Tracked]
    _out: list[Decision]
    _queued_bytes: int

    def _unqueued(self, r: Tracked) -> None:
        """Its body no longer waits for a first start: it started, or left."""
        self._queued_bytes -= r.body_bytes
        r.body_bytes = 0

    def _release(self, backend: str, p: Pending) -> None:
        """Give back `p`'s slot on `backend` (and forget the prefill it still owed there); the last
        release of a backend a reload removed retires it."""
        self._latency.prefilled(backend, p.id)
        if self._slots.release(backend, p.cls, p.est_tokens):
            self._retired(backend)

    def _retired(self, backend: str) -> None:
        """A removed backend's last request has ended: what the front kept of it goes."""
        self._router.forget(backend)
        self._programs.forget_backend(backend)
        self._latency.forget(backend)
        self._ejector.forget(backend)
        self._out.append(Retired(backend))

    def _choose(self, r: Tracked, now: float, exclude: Collection[str] = ()) -> str | None:
        """Where `r` may go now. A suspended request's continuation needs a backend whose kind
        can continue a generation (in a mixed fleet, not every backend can)."""
        return self._router.choose(self._slots, self._classes[r.pending.cls], r.pending, r.route, now,
                                   [*exclude, *self._barred(r), *self._pacer.held(r.pending.cls, now)])

    def _barred(self, r: Tracked) -> list[str]:
        """Backends a waiting request may not go to: those it failed on, and, to be continued,
        those whose kind cannot continue a generation."""
        if r.state is not State.SUSPENDED:
            return []
        barred = list(r.avoid)
        if r.must_continue:
            barred += self._cannot_continue()
        return barred

    def _reach(self, r: Tracked) -> list[BackendState]:
        """The backends that may take `r` whatever their free slots: its model, its pools,
        healthy, not ejected (or in panic)."""
        serving = self._router.serving(self._slots, self._classes[r.pending.cls], r.route)
        return self._router.usable(self._slots, serving)

    def _cannot_continue(self) -> list[str]:
        """Backends whose kind cannot continue a generation: none may take a continuation."""
        return [s.name for s in self._slots if not s.cfg.continues]

    def _pump(self, now: float, preempt: bool) -> None:
        """Bind queued requests to free slots in the queue's order; then, if the best waiting
        request still fits nowhere, let the preemption policy make room, and go on."""
        queue = self._queue
        if not len(queue):
            return
        reqs = self._reqs
        chosen: dict[str, str] = {}

        def admissible(p: Pending) -> bool:
            b = self._choose(reqs[p.id], now)
            if b is None:
                return False
            chosen[p.id] = b
            return True

        while len(queue):
            p = queue.pop(now, admissible)
            if p is not None:
                self._bind(self._reqs[p.id], chosen.pop(p.id), now)
            elif not preempt or self._policy is None or not self._preempt_for_head(now):
                return

    def _bind(self, r: Tracked, backend: str, now: float) -> None:
        """`r` starts on `backend`: its slot is taken, what routing and programs keep of it is told,
        and a `Start` says how (fresh, or resumed as its earlier run or failure left it)."""
        if self._predicts and not r.first:  # its prefill is owed there until its first content
            hits = self._router.hits(r.route)
            x = self._router.features(self._slots[backend], r.route, hits, now)
            if r.attempts == 0 and r.state is State.QUEUED:  # what its first start looks like to the fit
                r.x = x
            own = max(0, r.route.prompt_tokens - hits.get(backend, 0) * PREFIX_BLOCK_TOKENS)
            self._latency.started(backend, r.pending.id, own)
        self._slots.acquire(backend, r.pending.cls, r.pending.est_tokens)
        self._router.bound(backend, r.route)
        if r.route.program is not None:
            self._programs.bound(r.route.program, backend, now)
        self._pacer.started(backend, r.pending.cls, now)
        resumed = r.state is State.SUSPENDED
        mode, after, failed_on = r.again if resumed else (StartMode.FRESH, None, None)
        r.state, r.backend, r.bound_at = State.RUNNING, backend, now
        if not resumed:
            self._unqueued(r)
            r.attempts += 1
            r.tried.append(backend)
            if not r.preemptible and self._hedger.hedges(r.pending.cls):
                self._hedger.arm(r.pending.id, r.pending.cls, now)
        if r.preemptible:
            self._candidates[r.pending.id] = r
        self._out.append(Start(r.pending.id, backend, mode, after, failed_on))

    def _preempt_for_head(self, now: float) -> bool:
        """Suspend the victim the policy names for the best waiting request, and give it the
        slot. True if it did (the caller pumps again)."""
        policy, queue, slots = self._policy, self._queue, self._slots
        assert policy is not None
        if not self._candidates:
            return False
        head = queue.head(now)
        if head is None:
            return False
        wanted = self._reqs[head.id]
        if self._choose(wanted, now) is not None:
            return False
        # A lower priority can be suspended; so can a request of the head's own rank whose caller
        # is over its fair share (`queue.displaceable`), for a head that has not run yet (so each
        # arrival suspends at most one: it is bound at once). When the head is of the lowest rank
        # running and nobody is over their share (the common case) nothing is built.
        rank = head.rank
        cands = [r for r in self._candidates.values()
                 if r.pending.rank >= rank and r.suspendable and slots[r.backend].cfg.continues]
        peers = [r.pending.id for r in cands if r.pending.rank == rank]
        displaced = queue.displaceable(head, peers) if peers and wanted.attempts == 0 else set()
        cands = [r for r in cands if r.pending.rank > rank or r.pending.id in displaced]
        if not cands:
            return False

        # Only a slot the head may use is worth freeing: its model, its pools, healthy, not ejected.
        allowed = {s.name for s in self._reach(wanted)}
        allowed.difference_update(self._barred(wanted))

        def fits(c: Candidate) -> bool:
            return (c.backend in allowed and slots.fits_after_release(c.backend, head.cls, c.cls)
                    and (c.cls == head.cls or not queue.guaranteed(c.cls)))

        victim = policy.victim(head, (
            Candidate(r.pending.id, r.pending.cls, r.pending.rank, r.backend,
                      (r.max_tokens if r.max_tokens is not None else 1 << 30) - r.generated,
                      r.preemptions, r.bound_at, displaced=r.pending.id in displaced)
            for r in cands
        ), now, fits)
        if victim is None:
            return False
        self._suspend(self._reqs[victim.id], now)
        backend = self._choose(wanted, now)
        assert backend is not None
        queue.take(head.id, now)
        self._bind(wanted, backend, now)
        return True

    def _suspend(self, r: Tracked, now: float) -> None:
        """`r` gives up its slot for a waiting request and is queued again, to be continued."""
        p = r.pending
        self._release(r.backend, p)
        del self._candidates[p.id]
        r.state, r.suspendable, r.must_continue = State.SUSPENDED, False, True
        r.again = (StartMode.CONTINUE, None, None)
        r.preemptions += 1
        # Queued again with its first arrival (aging counts from there) and a fresh wait bound.
        again = Pending(p.id, p.cls, p.rank, p.est_tokens, p.arrived_at, now + self._classes[p.cls].max_queue_wait_s)
        r.pending = again
        self._queue.requeue(again, now)
        self._out.append(Suspend(p.id, r.backend))
