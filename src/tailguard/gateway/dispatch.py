"""The asyncio driver of the pure scheduler: request handlers wait here until a backend slot is
theirs; the dispatcher wakes on a freed slot and on the scheduler's next deadline.

There is no dispatcher task: every state change (push, finish, health flip, deadline timer) calls
`_pump()` synchronously, so an idle gateway binds a request in the same loop iteration it arrives.
Policies are told loop time (`loop.time()`), never read a clock themselves.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from tailguard.errors import Overloaded
from tailguard.gateway.backends import BackendPool
from tailguard.gateway.metrics import GatewayMetrics
from tailguard.gateway.router import choose
from tailguard.gateway.scheduler import Pending, Scheduler
from tailguard.types import Outcome

# Retry-After when the policy gives no better figure.
_DEFAULT_RETRY_AFTER_S = 1.0


@dataclass(slots=True)
class Ticket:
    """A request bound to a backend slot; `Dispatcher.release` ends it exactly once."""

    pending: Pending
    backend: str
    bound_at: float
    released: bool = False


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

    def __len__(self) -> int:
        return len(self._waiters)

    async def admit(self, pending: Pending) -> Ticket:
        """Queue `pending` and wait for its slot. Raises `Overloaded` when refused or expired."""
        now = self._loop.time()
        if self._closed:
            raise overloaded("shutting_down", 1.0, "The gateway is shutting down.")
        reject = self._scheduler.push(pending, now)
        if reject is not None:
            self._metrics.rejected.labels(pending.cls, reject.reason).inc()
            raise overloaded(reject.reason, reject.retry_after_s)
        fut: asyncio.Future[Ticket] = self._loop.create_future()
        self._waiters[pending.id] = fut
        self._metrics.cls(pending.cls).queue_length.inc()
        self._pump()
        try:
            # A future that is already done (idle gateway) returns here without yielding.
            return await fut
        except asyncio.CancelledError:
            self._client_left(pending, fut)
            raise

    def _client_left(self, pending: Pending, fut: asyncio.Future[Ticket]) -> None:
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
        p = ticket.pending
        self._pool.release(ticket.backend, p.cls)
        self._metrics.inflight_of(ticket.backend).dec()
        self._scheduler.on_finish(p.id, outcome, self._loop.time())
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
                p = scheduler.pop(now, admissible)
                if p is None:
                    break
                backend = chosen.get(p.id) or choose(pool, p, now)
                fut = waiters.pop(p.id, None)
                self._metrics.cls(p.cls).queue_length.dec()
                if fut is None or fut.done() or backend is None:
                    # Its client is gone already (or capacity vanished): it never ran.
                    scheduler.on_finish(p.id, Outcome.CLIENT_GONE, now)
                    continue
                pool.acquire(backend, p.cls)
                self._metrics.inflight_of(backend).inc()
                self._metrics.cls(p.cls).queue_wait.observe(now - p.arrived_at)
                fut.set_result(Ticket(p, backend, now))
        self._arm()

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
