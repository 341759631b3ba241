"""The front's half that handles an attempt that failed: a retry on the same backend or another, a
stream continued elsewhere when its backend died mid-answer (migration), a wait for a backend that
may take it, a `GiveUp` that says why it goes no further, the surviving half of a hedged pair, and
the passive ejection a failure may lead to. Kept apart from `front.Front`, which holds the
chokepoint and the other events, because it is one decision with its own rules (`front.retry` says
what each failure allows); it builds on `front.binding` (a retry is bound as any start is), `Front`
inherits it and gives it the state below, so every event still goes through the one `Front.handle`."""

from __future__ import annotations

from tailguard.front.binding import Binding
from tailguard.front.events import Drop, Ejected, Failed, GiveUp, GiveUpReason, Start, StartMode, Wait
from tailguard.front.params import FrontParams
from tailguard.front.queue import Pending
from tailguard.front.retry import Again, continues_after, hurts_health, retry_of, stale_connection
from tailguard.retry_budget import RetryBudget
from tailguard.front.tracked import State, Tracked
from tailguard.types import FailureKind


class Recovery(Binding):
    """What the front does when an attempt fails. The state it reads beyond `Binding`'s is
    `Front`'s own, declared here."""

    _params: FrontParams
    _budget: RetryBudget
    _max_attempts: int
    _may_preempt: bool

    def _failed(self, ev: Failed, now: float) -> None:
        """An attempt failed. A `Start` (`retry`) when it is worth trying again (same backend on
        a fresh connection, or another), within `max_attempts` and the retry budget; a
        `Start` (`migrate`) on another backend when its backend died mid-answer (`_migrate`); a
        `Wait` when one could take it once a slot frees; else a `GiveUp` that says why, and the
        driver ends the request with `Finished`."""
        r = self._reqs[ev.id]
        if r.hedge is not None:
            self._hedge_failed(r, ev, now)
            return
        old = r.backend
        r.suspendable = False
        if hurts_health(ev.kind, ev.answered):
            self._eject_maybe(old, ev.kind, now)
        where = retry_of(ev.kind, ev.delivered, ev.answered, r.continuable)
        if where is Again.CONTINUE:
            self._migrate(r, ev, stale_connection(ev.kind, ev.answered), now)
            return
        if where is Again.NO:
            self._give_up(r, ev, self._why_not(r, ev))
            return
        if r.attempts >= self._max_attempts:
            self._give_up(r, ev, GiveUpReason.ATTEMPTS)
            return
        if not self._budget.try_withdraw(now):
            self._give_up(r, ev, GiveUpReason.BUDGET)
            return
        r.attempts += 1
        target = self._retry_target(r, where, now)
        if target is None:
            if self._could_take(r, must_continue=False):
                self._wait(r, ev, now, StartMode.RETRY)
            else:
                self._give_up(r, ev, GiveUpReason.NO_BACKEND)
            return
        if target == old:
            r.fresh_retried = True
        self._restart(r, ev, target, now, StartMode.RETRY)

    def _why_not(self, r: Tracked, ev: Failed) -> GiveUpReason:
        """Why a failure the retry rules allow nothing for ends the request: an answer under way
        that is not continued (its request asks for what text cannot carry; migrations are off;
        no second backend could take it), or a failure that allows no retry at all."""
        if not (ev.delivered and continues_after(ev.kind, ev.answered)):
            return GiveUpReason.NOT_RETRYABLE
        if not r.resumable:
            return GiveUpReason.NOT_CONTINUABLE
        return GiveUpReason.MIGRATIONS if self._params.retry.max_migrations == 0 else GiveUpReason.NO_BACKEND

    def _give_up(self, r: Tracked, ev: Failed, reason: GiveUpReason) -> None:
        """The front tries it no more: it keeps its slot until the driver ends it (`Finished`)."""
        r.state = State.FAILED
        self._candidates.pop(ev.id, None)
        self._out.append(GiveUp(ev.id, reason, ev.kind, r.backend))

    def _migrate(self, r: Tracked, ev: Failed, stale: bool, now: float) -> None:
        """Its backend died or stalled after part of the answer reached the client: the rest is
        generated on another backend that can continue a generation, from the text so far (the
        driver's continuation, as after a suspension). At most `max_migrations` times and
        within the retry budget; with no such backend free now it waits for one, or gives up. A
        continuation whose connection was `stale` goes to the same backend once more, the same
        body on a fresh connection (a `retry`, not a move)."""
        most = self._params.retry.max_migrations
        if not stale and r.migrations >= most:
            self._give_up(r, ev, GiveUpReason.MIGRATIONS)
            return
        if not self._budget.try_withdraw(now):
            self._give_up(r, ev, GiveUpReason.BUDGET)
            return
        target = self._migration_target(r, stale, now)
        if target is None:
            if r.migrations < most and self._could_take(r, must_continue=True):
                r.migrations += 1
                self._wait(r, ev, now, StartMode.MIGRATE)
            else:
                self._give_up(r, ev, GiveUpReason.MIGRATIONS if r.migrations >= most else GiveUpReason.NO_BACKEND)
            return
        if target != r.backend:
            r.migrations += 1
            self._restart(r, ev, target, now, StartMode.MIGRATE)
        else:
            self._restart(r, ev, target, now, StartMode.RETRY)

    def _could_take(self, r: Tracked, must_continue: bool) -> bool:
        """Whether some backend other than those it failed on (and able to continue, if it must)
        could take it once a slot frees: else waiting would only delay its error."""
        avoid = {*r.avoid, r.backend}
        return any(s.name not in avoid and (s.cfg.continues or not must_continue) for s in self._reach(r))

    def _wait(self, r: Tracked, ev: Failed, now: float, mode: StartMode) -> None:
        """Its retry or continuation (`mode`) finds no backend free now: it waits in the queue,
        holding no slot, its client kept, for one that may take it (not one it failed on; one
        that can continue a generation when some of the answer went out already), within its
        class's wait bound, as a suspended request does. A backend that fails costs no request
        another could serve a moment later."""
        p = r.pending
        self._candidates.pop(p.id, None)
        r.avoid.add(r.backend)
        r.state, r.suspendable, r.must_continue = State.SUSPENDED, False, mode is StartMode.MIGRATE
        r.again = (mode, ev.kind, r.backend)
        again = Pending(p.id, p.cls, p.rank, p.est_tokens, p.arrived_at, now + self._classes[p.cls].max_queue_wait_s)
        r.pending = again
        self._queue.requeue(again, now)
        self._out.append(Wait(p.id))
        self._release(r.backend, p)  # after the Wait: a retiring backend may leave with this release
        self._pump(now, self._may_preempt)  # its slot, freed, may go to someone else

    def _migration_target(self, r: Tracked, stale: bool, now: float) -> str | None:
        """The least loaded backend it has not failed on whose kind can continue a generation
        (its own backend again on a fresh connection, once, after a stale one)."""
        slots = self._slots
        if stale and not r.fresh_retried and slots.takes_new(r.backend) and not self._ejector.ejected(r.backend):
            r.fresh_retried = True
            return r.backend
        if r.migrations >= self._params.retry.max_migrations:
            return None
        return self._choose(r, now, exclude=[*r.tried, r.backend, *self._cannot_continue()])

    def _restart(self, r: Tracked, ev: Failed, target: str, now: float, mode: StartMode) -> None:
        """Send a running request's next attempt (`mode`: a retry, or a migration's continuation)
        to `target`, moving its slot there from the backend it failed on."""
        old = r.backend
        if target != old:
            self._slots.acquire(target, r.pending.cls, r.pending.est_tokens)
            self._router.bound(target, r.route)
            r.backend = target
        r.tried.append(target)
        r.bound_at = now
        self._out.append(Start(r.pending.id, target, mode, ev.kind, old))
        if target != old:  # after the Start: a retiring `old` may leave with this release
            self._release(old, r.pending)
        self._pump(now, self._may_preempt)

    def _hedge_failed(self, r: Tracked, ev: Failed, now: float) -> None:
        """One attempt of a hedged request failed while the other runs: that one goes on alone
        (it is the request's attempt from now on: a `Drop` of the failed one); nothing is
        retried."""
        assert r.hedge is not None
        failed = ev.backend if ev.backend is not None else r.backend
        if hurts_health(ev.kind, ev.answered):
            self._eject_maybe(failed, ev.kind, now)
        other = r.hedge if failed == r.backend else r.backend
        r.backend, r.hedge = other, None
        self._out.append(Drop(ev.id, failed, other, failed=True))
        self._release(failed, r.pending)
        self._pump(now, self._may_preempt)

    def _eject_maybe(self, backend: str, kind: FailureKind, now: float) -> None:
        """A failure of the kind a dead or hung host causes: counted, and perhaps the last of
        enough in a row to take it out for a while."""
        if backend not in self._slots.names:
            return
        pool = self._slots[backend].cfg.pool
        members = [s.name for s in self._slots if s.cfg.pool == pool and not s.retiring]
        ej = self._ejector.failed(backend, now, members)
        if ej is not None:
            self._out.append(Ejected(backend, ej.for_s, ej.failures, kind, ej.times))

    def _retry_target(self, r: Tracked, where: Again, now: float) -> str | None:
        if (where is Again.SAME_OR_OTHER and not r.fresh_retried and self._slots.takes_new(r.backend)
                and not self._ejector.ejected(r.backend)):
            return r.backend
        return self._choose(r, now, exclude=r.tried)
