"""The asyncio driver of the pure scheduler: request handlers wait here until a backend slot is
theirs; the dispatcher wakes on a freed slot and on the scheduler's next deadline.

There is no dispatcher task: every state change (push, finish, health flip, deadline timer) calls
`_pump()` synchronously, so an idle gateway binds a request in the same loop iteration it arrives.
Policies are told loop time (`loop.time()`), never read a clock themselves.

Preemption: when the scheduler's best queued request fits on no backend, the `PreemptionPolicy`
may name a running preemptible request whose slot it can take. That request is suspended at once
(its slot freed, its upstream closed through the hook its relay registered, so the engine aborts
it and frees its KV) and queued again with its original arrival time; its handler waits in
`resume` while the client's connection stays open, and continues when a slot is its again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from tailguard.errors import Overloaded
from tailguard.gateway.backends import BackendPool
from tailguard.gateway.kinds import get_kind
from tailguard.gateway.metrics import GatewayMetrics
from tailguard.gateway.preemption import Candidate, PreemptionPolicy
from tailguard.gateway.resume import Progress
from tailguard.gateway.router import choose
from tailguard.gateway.scheduler import BaseScheduler, Pending, Scheduler
from tailguard.types import Outcome

# Retry-After when the policy gives no better figure.
_DEFAULT_RETRY_AFTER_S = 1.0


@dataclass(slots=True)
class Ticket:
    """A request bound to a backend slot; `Dispatcher.release` ends it exactly once.

    A preemptible request's ticket lives across suspensions: `suspended` while it waits for a
    slot again (it then holds none), `on_suspend` set by its relay while an upstream is open.
    """

    pending: Pending
    backend: str
    bound_at: float
    released: bool = False
    progress: Progress | None = None  # set for a preemptible request
    max_tokens: int | None = None  # the output budget sent upstream (its first run)
    preemptions: int = 0
    suspended: bool = False
    on_suspend: Callable[[], None] | None = None
    waiter: asyncio.Future[Ticket] | None = None
    wait_s: float = 0.0  # its class's queue bound: a suspended request waits at most this long again


def overloaded(reason: str, retry_after_s: float, message: str | None = None) -> Overloaded:
    return Overloaded(
        message or f"The gateway is overloaded ({reason}); retry later.",
        code=reason, retry_after_s=retry_after_s,
        headers={"X-Tailguard-Reject-Reason": reason},
    )


class Dispatcher:
    """Binds queued requests to backend slots in the scheduler's order.

        ticket = await dispatcher.admit(pending)      # raises Overloaded; cancel = client left
        try:
            ...relay to ticket.backend...
        finally:
            dispatcher.release(ticket, outcome)
    """

    def __init__(
        self, scheduler: Scheduler, pool: BackendPool, metrics: GatewayMetrics,
        loop: asyncio.AbstractEventLoop | None = None,
        retry_after: Callable[[], float] | None = None,
        policy: PreemptionPolicy | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._pool = pool
        self._metrics = metrics
        self._loop = loop or asyncio.get_running_loop()
        self._waiters: dict[str, asyncio.Future[Ticket]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._retry_after = retry_after
        self._closed = False
        self._tickets: dict[str, Ticket] = {}  # queued requests whose ticket exists already
        self._active: dict[str, Ticket] = {}  # preemptible requests holding a slot
        self._policy = policy
        self._continues = {b.name for b in pool if get_kind(b.cfg.kind).continues_generation}

    def __len__(self) -> int:
        return len(self._waiters)

    @property
    def preemption(self) -> bool:
        """True when running requests may be suspended (a policy is set and some backend can
        continue a generation)."""
        return self._policy is not None and bool(self._continues)

    async def admit(
        self, pending: Pending, *, progress: Progress | None = None, max_tokens: int | None = None,
    ) -> Ticket:
        """Queue `pending` and wait for its slot. Raises `Overloaded` when refused or expired.
        With `progress`, the request may be suspended while it runs (`resume` continues it)."""
        now = self._loop.time()
        if self._closed:
            raise overloaded("shutting_down", 1.0, "The gateway is shutting down.")
        reject = self._scheduler.push(pending, now)
        if reject is not None:
            self._metrics.rejected.labels(pending.cls, reject.reason).inc()
            raise overloaded(reject.reason, reject.retry_after_s)
        fut: asyncio.Future[Ticket] = self._loop.create_future()
        self._waiters[pending.id] = fut
        if progress is not None:
            self._tickets[pending.id] = Ticket(pending, "", now, progress=progress, max_tokens=max_tokens,
                                               wait_s=pending.wait_bound_at - pending.arrived_at)
        self._metrics.cls(pending.cls).queue_length.inc()
        self._pump()
        try:
            # A future that is already done (idle gateway) returns here without yielding.
            return await fut
        except asyncio.CancelledError:
            self._client_left(pending, fut)
            raise

    async def resume(self, ticket: Ticket) -> None:
        """Wait until the suspended `ticket` is bound to a slot again (`ticket.backend` and
        `bound_at` are then updated). Raises `Overloaded` if it expired in the queue or the
        gateway shuts down; a cancellation (client gone) leaves the cleanup to `release`."""
        assert ticket.waiter is not None
        await ticket.waiter

    def _client_left(self, pending: Pending, fut: asyncio.Future[Ticket]) -> None:
        self._tickets.pop(pending.id, None)
        if self._waiters.pop(pending.id, None) is not None:
            now = self._loop.time()
            if self._scheduler.remove(pending.id, now):
                self._metrics.cls(pending.cls).queue_length.dec()
            self._arm()
        elif fut.done() and not fut.cancelled() and fut.exception() is None:
            # Bound in the same iteration the client left: hand the slot back.
            self.release(fut.result(), Outcome.CLIENT_GONE)

    def release(self, ticket: Ticket, outcome: Outcome) -> None:
        """The request ended: free its slot and tell the policy, once."""
        if ticket.released:
            return
        ticket.released = True
        ticket.on_suspend = None
        p = ticket.pending
        now = self._loop.time()
        self._active.pop(p.id, None)
        if ticket.suspended:
            # Waiting for a slot again (it holds none): leave the queue if still there.
            self._tickets.pop(p.id, None)
            fut = self._waiters.pop(p.id, None)
            if fut is not None:
                if self._scheduler.remove(p.id, now):
                    self._metrics.cls(p.cls).queue_length.dec()
                if not fut.done():
                    fut.cancel()
        else:
            self._pool.release(ticket.backend, p.cls)
            self._metrics.inflight_of(ticket.backend).dec()
        self._scheduler.on_finish(p.id, outcome, now)
        self._pump()

    def reroute(self, ticket: Ticket) -> str | None:
        """Move a failed request to another backend with a free slot, keeping its turn; None if
        there is none (the caller then ends the request)."""
        now = self._loop.time()
        old = ticket.backend
        new = choose(self._pool, ticket.pending, now, exclude=(old,))
        if new is None:
            return None
        self._pool.acquire(new, ticket.pending.cls)
        self._metrics.inflight_of(new).inc()
        self._pool.release(old, ticket.pending.cls)
        self._metrics.inflight_of(old).dec()
        ticket.backend = new
        self._pump()
        return new

    def retry_after_s(self) -> float:
        """Retry-After for refusals made outside `push` (expiry, no healthy backend)."""
        return self._retry_after() if self._retry_after is not None else _DEFAULT_RETRY_AFTER_S

    def wake(self) -> None:
        """Capacity may have appeared (a backend turned healthy): try to bind queued requests."""
        self._pump()

    def close(self) -> None:
        """Refuse new requests and answer every queued one with 503."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self._loop.time()
        for req_id, fut in list(self._waiters.items()):
            self._scheduler.remove(req_id, now)
            if not fut.done():
                fut.set_exception(overloaded("shutting_down", 1.0, "The gateway is shutting down."))
        self._waiters.clear()
        self._tickets.clear()

    def _pump(self) -> None:
        if self._waiters:
            now = self._loop.time()
            pool, scheduler, waiters = self._pool, self._scheduler, self._waiters
            chosen: dict[str, str] = {}

            def admissible(p: Pending) -> bool:
                b = choose(pool, p, now)
                if b is None:
                    return False
                chosen[p.id] = b
                return True

            while waiters:
                while waiters:
                    p = scheduler.pop(now, admissible)
                    if p is None:
                        break
                    self._bind(p, chosen.get(p.id) or choose(pool, p, now), now)
                if not waiters or self._policy is None or not self._preempt_for_head(now):
                    break
        self._arm()

    def _bind(self, p: Pending, backend: str | None, now: float) -> None:
        fut = self._waiters.pop(p.id, None)
        ticket = self._tickets.pop(p.id, None)
        self._metrics.cls(p.cls).queue_length.dec()
        if fut is None or fut.done() or backend is None:
            # Its client is gone already (or capacity vanished): it never ran.
            self._scheduler.on_finish(p.id, Outcome.CLIENT_GONE, now)
            return
        self._pool.acquire(backend, p.cls)
        self._metrics.inflight_of(backend).inc()
        if ticket is None:
            ticket = Ticket(p, backend, now)
        else:
            ticket.pending, ticket.backend, ticket.bound_at, ticket.suspended = p, backend, now, False
            self._active[p.id] = ticket
        fut.set_result(ticket)

    def _preempt_for_head(self, now: float) -> bool:
        """If the best queued request fits nowhere, suspend the victim the policy names and give
        its slot to that request. True if it did (the caller pumps again)."""
        policy = self._policy
        assert policy is not None
        if not self._active or not isinstance(self._scheduler, BaseScheduler):
            return False
        scheduler = self._scheduler
        head = scheduler.head(now)
        if head is None or choose(self._pool, head, now) is not None:
            return False
        pool = self._pool
        candidates = {
            t.pending.id: t for t in self._active.values()
            if t.on_suspend is not None and t.backend in self._continues and t.progress is not None
        }
        if not candidates:
            return False

        def fits(c: Candidate) -> bool:
            return (pool.is_healthy(c.backend) and pool.fits_after_release(c.backend, head.cls, c.cls)
                    and not scheduler.guaranteed(c.cls))

        victim = policy.victim(head, (
            Candidate(t.pending.id, t.pending.cls, t.pending.rank, t.backend,
                      (t.max_tokens if t.max_tokens is not None else 1 << 30) - t.progress.tokens,  # type: ignore[union-attr]
                      t.preemptions, t.bound_at)
            for t in candidates.values()
        ), now, fits)
        if victim is None:
            return False
        self._suspend(candidates[victim.id], now)
        backend = choose(pool, head, now)
        assert backend is not None
        self._bind(scheduler.take(head.id, now), backend, now)
        return True

    def _suspend(self, ticket: Ticket, now: float) -> None:
        p = ticket.pending
        hook = ticket.on_suspend
        assert hook is not None and ticket.progress is not None
        del self._active[p.id]
        ticket.on_suspend = None
        ticket.suspended = True
        ticket.preemptions += 1
        self._pool.release(ticket.backend, p.cls)
        self._metrics.inflight_of(ticket.backend).dec()
        self._metrics.preemptions.labels(p.cls).inc()
        # Queued again with its first arrival (aging counts from there) and a fresh wait bound.
        again = Pending(p.id, p.cls, p.rank, p.est_tokens, p.arrived_at, now + ticket.wait_s)
        assert isinstance(self._scheduler, BaseScheduler)
        self._scheduler.requeue(again, now)
        fut: asyncio.Future[Ticket] = self._loop.create_future()
        ticket.waiter = fut
        self._waiters[p.id] = fut
        self._tickets[p.id] = ticket
        self._metrics.cls(p.cls).queue_length.inc()
        ticket.progress.suspended = True
        hook()

    def _arm(self) -> None:
        at = self._scheduler.next_wakeup() if self._waiters else None
        if at is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = self._timer_at = None
            return
        if self._timer is not None and self._timer_at is not None and self._timer_at <= at:
            return  # fires no later than needed; it re-arms itself
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        now = self._loop.time()
        for p in self._scheduler.expire(now):
            fut = self._waiters.pop(p.id, None)
            self._metrics.cls(p.cls).queue_length.dec()
            self._metrics.rejected.labels(p.cls, "queue_timeout").inc()
            if fut is not None and not fut.done():
                fut.set_exception(overloaded(
                    "queue_timeout", self.retry_after_s(),
                    f"The request waited {now - p.arrived_at:.3f} s in the queue, past its class bound.",
                ))
        self._pump()
