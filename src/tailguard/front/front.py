"""The front: every decision about a request, as one state machine with no I/O; told the time.

Events go in as method calls, each with `now`; each call returns the decisions it led to. The
gateway's asyncio driver (`tailguard.gateway.dispatch`) and the discrete-event simulator
(`tailguard.sim.des`) drive the same object, so whatever the gateway decides can be replayed on
virtual time, and tested without a socket (h11's shape: the protocol is a state machine its
callers drive; see ../shared/style.md 1.6).

    events in                                   decisions out
    arrive(id, cls, size, now, caller=)      -> Start(id, backend) | Reject(id, reason, retry_after_s)
    suspendable(id, now)  (upstream open)    -> Suspend(id, backend) of a victim, Start of the waiter
    failed(id, kind, now) (nothing sent yet) -> Start(id, backend) again (a retry), or nothing
    finish(id, outcome, now, tokens=)  (once) -> Start of whoever gets the slot (tokens: the caller's use)
    probe(backend, ok, now, busy=), set_kind -> HealthChanged, Start
    tick(now)   (at next_wakeup())           -> Reject(id, "queue_timeout"), Start
    close(now)                               -> Reject(id, "shutting_down") for every queued request
    reconfigure(params, now)  (live reload)  -> Start of whoever a raised cap, share or new backend
                                                lets in; Retired of a removed backend with nothing in flight
    (a removed backend's last request ends)  -> Retired(backend): it has left the front

A request is QUEUED, RUNNING on a backend, or SUSPENDED (preempted: queued again, holding no
slot, its client still waiting). It leaves the front exactly once: by `finish`, or by a `Reject`
the front itself decided (refused on arrival, expired in the queue, shut down), after which the
driver must not `finish` it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tailguard.errors import ConfigError
from tailguard.front.limits import CallerLimits
from tailguard.front.params import FrontParams
from tailguard.front.preemption import Candidate, PreemptionPolicy
from tailguard.front.queue import Pending, carry_over, make_scheduler
from tailguard.front.retry import HEALTH_KINDS, OTHER_BACKEND_KINDS, SAME_BACKEND_KINDS, retry_budget
from tailguard.front.router import choose
from tailguard.front.slots import BackendPool
from tailguard.types import Outcome


@dataclass(frozen=True, slots=True)
class Start:
    """Send request `id` to `backend`: its first run, a retry, or (`resumed`) its continuation."""

    id: str
    backend: str
    resumed: bool = False


@dataclass(frozen=True, slots=True)
class Suspend:
    """Stop request `id` on `backend` now (close its upstream so the engine frees its slot and
    KV); it waits in the queue for its continuation, its client connection kept open."""

    id: str
    backend: str


@dataclass(frozen=True, slots=True)
class Reject:
    """Request `id` is refused (on arrival) or dropped (expired, shut down); it has left the
    front. `retry_after_s` is what to tell the client."""

    id: str
    reason: str  # queue_full | wait_bound | queue_timeout | no_healthy_backend | shutting_down
    #              | rate_limit_requests | rate_limit_tokens (its caller's limits)
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class HealthChanged:
    backend: str
    healthy: bool


@dataclass(frozen=True, slots=True)
class Retired:
    """A backend a reload removed has no request left and has left the front: the driver may
    forget it (its probes, metrics, connections)."""

    backend: str


Decision = Start | Suspend | Reject | HealthChanged | Retired
NOTHING: Sequence[Decision] = ()


class State(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUSPENDED = "suspended"


class _Req:
    __slots__ = ("pending", "state", "backend", "bound_at", "preemptible", "max_tokens", "suspendable",
                 "preemptions", "attempts", "tried", "fresh_retried", "caller")

    def __init__(self, pending: Pending, preemptible: bool, max_tokens: int | None, caller: str | None) -> None:
        self.pending = pending
        self.caller = caller
        self.state = State.QUEUED
        self.backend = ""
        self.bound_at = 0.0
        self.preemptible = preemptible
        self.max_tokens = max_tokens
        self.suspendable = False  # its upstream is open: a Suspend can take effect at once
        self.preemptions = 0
        self.attempts = 0
        self.tried: list[str] = []  # backends its attempts went to
        self.fresh_retried = False  # retried once on the same backend already


class Front:
    """Queue, slot ledger, routing, health, preemption, retries, shedding and callers' limits
    in one object.

    `progress(id)` is how the front learns a running preemptible request's generated tokens
    when it weighs a preemption (the driver knows them: the relay counts chunks, the simulated
    engine counts tokens); it is asked only then, never per chunk.
    """

    def __init__(self, params: FrontParams, progress: Callable[[str], int] | None = None) -> None:
        self.params = params
        self._classes = {c.name: c for c in params.classes}
        self.queue = make_scheduler(params.queue, params.classes)
        self.slots = BackendPool(params.backends, params.classes, params.health)
        self._policy = PreemptionPolicy.from_params(params.preemption, params.queue.policy)
        self._budget = retry_budget(params.retry)
        self._max_attempts = params.retry.max_attempts
        self.limits = CallerLimits(params.callers)
        self.progress: Callable[[str], int] = progress or (lambda _id: 0)
        self._reqs: dict[str, _Req] = {}
        self._candidates: dict[str, _Req] = {}  # running preemptible requests
        self._out: list[Decision] = []
        self._closed = False

    # --- views ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Requests waiting for a slot (queued or suspended)."""
        return len(self.queue)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._reqs

    def state(self, req_id: str) -> State:
        return self._reqs[req_id].state

    def may_suspend(self, cls: str) -> bool:
        """Whether a request of `cls` may be preempted at all (its class is preemptible and the
        policy is on); the driver then tracks its text so a continuation can be sent."""
        return self._policy is not None and self._classes[cls].preemptible

    def retry_after_s(self) -> float:
        return self.queue.admission.retry_after_s()

    def next_wakeup(self) -> float | None:
        """When `tick` next has something to do (a queued request's bound), or None."""
        return self.queue.next_wakeup() if len(self.queue) else None

    # --- events -----------------------------------------------------------------------------

    def arrive(
        self, req_id: str, cls: str, est_tokens: int, now: float, *,
        resumable: bool = False, max_tokens: int | None = None, preempt: bool = True, caller: str | None = None,
    ) -> Sequence[Decision]:
        """A request of class `cls` and estimated size `est_tokens` (prompt + output) arrives.
        `resumable`: its output can be continued from its text (see `gateway.resume`);
        `max_tokens`: its output budget. `preempt=False` defers any preemption it would cause
        to the next event (the simulator's engine cannot abort mid-step). `caller`: whose
        request it is (an API key's name), refused while over its limits (`front.limits`)."""
        spec = self._classes.get(cls)
        if spec is None:
            raise ValueError(f"unknown class {cls!r} (known: {', '.join(self._classes)})")
        if req_id in self._reqs:
            raise ValueError(f"request id {req_id!r} is in the front already")
        if self._closed:
            return (Reject(req_id, "shutting_down", 1.0),)
        if not self.slots.any_healthy():
            return (Reject(req_id, "no_healthy_backend", self.retry_after_s()),)
        limited = self.limits.refusal(caller, now) if caller is not None else None
        if limited is not None:
            return (Reject(req_id, limited.reason, limited.retry_after_s),)
        pending = Pending(req_id, cls, spec.rank, est_tokens, now, now + spec.max_queue_wait_s)
        refused = self.queue.push(pending, now)
        if refused is not None:
            return (Reject(req_id, refused.reason, refused.retry_after_s),)
        self._budget.record_call(now)
        if caller is not None:
            self.limits.take_request(caller, now)
        self._reqs[req_id] = _Req(pending, resumable and self.may_suspend(cls), max_tokens, caller)
        self._pump(now, preempt)
        return self._flush()

    def suspendable(self, req_id: str, now: float, *, preempt: bool = True) -> Sequence[Decision]:
        """A running request's upstream is open, so a `Suspend` can stop it now. A request
        waiting for a slot may take this one's at once."""
        r = self._reqs.get(req_id)
        if r is None or r.state is not State.RUNNING or not r.preemptible:
            return NOTHING
        r.suspendable = True
        if len(self.queue):
            self._pump(now, preempt)
        return self._flush()

    def failed(self, req_id: str, kind: str, now: float) -> Sequence[Decision]:
        """An attempt failed before any byte reached the client (`kind` as in `front.retry`).
        Returns a `Start` when it is worth trying again (same backend on a fresh connection,
        or another), within `max_attempts` and the retry budget; else nothing, and the driver
        ends the request with `finish`."""
        r = self._reqs[req_id]
        if r.state is not State.RUNNING:
            raise ValueError(f"request {req_id!r} is {r.state.value}, not running")
        old = r.backend
        r.suspendable = False
        if kind in HEALTH_KINDS and self.slots.mark_failure(old):
            self._out.append(HealthChanged(old, False))
        if r.attempts < self._max_attempts and kind in OTHER_BACKEND_KINDS:
            target = self._retry_target(r, kind, now)
            if target is not None and self._budget.try_withdraw(now):
                if target == old:
                    r.fresh_retried = True
                else:
                    self.slots.acquire(target, r.pending.cls)
                    r.backend = target
                r.attempts += 1
                r.tried.append(target)
                r.bound_at = now
                self._out.append(Start(req_id, target))
                if target != old:  # after the Start: a retiring `old` may leave with this release
                    self._release(old, r.pending.cls)
                self._pump(now, True)
        return self._flush()

    def finish(self, req_id: str, outcome: Outcome, now: float, *, tokens: int = 0) -> Sequence[Decision]:
        """The request ended with `outcome` (success, error, timeout, client gone): the one
        call that ends a request the front has not rejected itself. `tokens`: what it used
        (prompt and generated), charged to its caller."""
        r = self._reqs.pop(req_id, None)
        if r is None:
            raise ValueError(f"request {req_id!r} is not in the front (ended twice, or rejected)")
        if tokens and r.caller is not None:
            self.limits.charge(r.caller, tokens, now)
        p = r.pending
        if r.state is State.RUNNING:
            self._release(r.backend, p.cls)
            self._candidates.pop(req_id, None)
            if outcome is Outcome.SUCCESS and self.slots.mark_success(r.backend):
                self._out.append(HealthChanged(r.backend, True))
        else:
            self.queue.remove(req_id, now)
        if r.state is not State.QUEUED:  # it was dispatched once: a completion for the drain rate
            self.queue.on_finish(req_id, outcome, now)
        self._pump(now, True)
        return self._flush()

    def probe(self, backend: str, ok: bool, now: float, *, busy: bool = False) -> Sequence[Decision]:
        """A health probe of `backend` succeeded or failed. `busy`: it failed by not answering
        in time while the backend was delivering bytes to requests in flight. An engine too
        loaded to answer its health page promptly is not a dead one, and taking the only
        backend out would strand everything queued behind it; so that probe counts neither
        way (a wedged server is still found by its requests' own connect and first-token
        failures)."""
        if ok:
            if self.slots.mark_success(backend):
                self._out.append(HealthChanged(backend, True))
                self._pump(now, True)
        elif not busy and self.slots.mark_failure(backend):
            self._out.append(HealthChanged(backend, False))
        return self._flush()

    def set_kind(self, backend: str, continues: bool, now: float) -> Sequence[Decision]:
        """The backend's kind is known (detected at start or on its return): whether it can
        continue a generation sets its reservation and whether requests on it may be suspended."""
        self.slots.set_continues(backend, continues)
        self._pump(now, True)
        return self._flush()

    def tick(self, now: float, *, preempt: bool = True) -> Sequence[Decision]:
        """Time passed: requests past their queue bound leave with `queue_timeout`; the rest
        are bound to whatever became free."""
        for p in self.queue.expire(now):
            del self._reqs[p.id]
            self._out.append(Reject(p.id, "queue_timeout", self.retry_after_s()))
        self._pump(now, preempt)
        return self._flush()

    def close(self, now: float) -> Sequence[Decision]:
        """Shutting down: refuse new requests, drop every queued or suspended one."""
        self._closed = True
        for req_id, r in list(self._reqs.items()):
            if r.state is not State.RUNNING:
                self.queue.remove(req_id, now)
                del self._reqs[req_id]
                self._out.append(Reject(req_id, "shutting_down", 1.0))
        return self._flush()

    def reconfigure(self, params: FrontParams, now: float) -> Sequence[Decision]:
        """Swap in new parameters for the same classes (a live reload), keeping every queued,
        running and suspended request: queued ones keep their place in arrival order and their
        wait bound (a new policy re-sorts them, with no admission check), running ones keep their
        slot even where a cap fell below what is in flight (new binds wait until it is met), and
        a class that is no longer preemptible has its running requests left alone. A new backend
        takes requests at once; a removed one takes no new request and its running ones end
        where they are (`Retired` when the last has). Adding, removing or renaming a class needs
        a restart: `ConfigError`, and nothing changed. A changed retry budget starts afresh."""
        _same_names("classes", [c.name for c in self.params.classes], [c.name for c in params.classes])
        self.queue = carry_over(self.queue, params.queue, params.classes)  # an unknown policy fails here
        if params.retry != self.params.retry:
            self._budget = retry_budget(params.retry)
        self.limits.reconfigure(params.callers)
        self.params = params
        self._classes = {c.name: c for c in params.classes}
        gone = self.slots.reconfigure(params.backends, params.classes, params.health)
        self._out.extend(Retired(name) for name in gone)
        self._policy = PreemptionPolicy.from_params(params.preemption, params.queue.policy)
        self._max_attempts = params.retry.max_attempts
        for req_id, r in self._reqs.items():
            rank = self._classes[r.pending.cls].rank
            if r.pending.rank != rank:
                r.pending = replace(r.pending, rank=rank)
            if r.preemptible and not self.may_suspend(r.pending.cls):
                r.preemptible = r.suspendable = False
                self._candidates.pop(req_id, None)
        self._pump(now, True)
        return self._flush()

    # --- internals --------------------------------------------------------------------------

    def _flush(self) -> Sequence[Decision]:
        out = self._out
        if not out:
            return NOTHING
        self._out = []
        return out

    def _release(self, backend: str, cls: str) -> None:
        if self.slots.release(backend, cls):
            self._out.append(Retired(backend))

    def _retry_target(self, r: _Req, kind: str, now: float) -> str | None:
        if kind in SAME_BACKEND_KINDS and not r.fresh_retried and self.slots.takes_new(r.backend):
            return r.backend
        return choose(self.slots, r.pending, now, exclude=r.tried)

    def _pump(self, now: float, preempt: bool) -> None:
        """Bind queued requests to free slots in the queue's order; then, if the best waiting
        request still fits nowhere, let the preemption policy make room, and go on."""
        queue = self.queue
        if not len(queue):
            return
        slots = self.slots
        chosen: dict[str, str] = {}

        def admissible(p: Pending) -> bool:
            b = choose(slots, p, now)
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

    def _bind(self, r: _Req, backend: str, now: float) -> None:
        self.slots.acquire(backend, r.pending.cls)
        resumed = r.state is State.SUSPENDED
        r.state, r.backend, r.bound_at = State.RUNNING, backend, now
        if not resumed:
            r.attempts += 1
            r.tried.append(backend)
        if r.preemptible:
            self._candidates[r.pending.id] = r
        self._out.append(Start(r.pending.id, backend, resumed))

    def _preempt_for_head(self, now: float) -> bool:
        """Suspend the victim the policy names for the best waiting request, and give it the
        slot. True if it did (the caller pumps again)."""
        policy, queue, slots = self._policy, self.queue, self.slots
        assert policy is not None
        if not self._candidates:
            return False
        head = queue.head(now)
        if head is None or choose(slots, head, now) is not None:
            return False
        # Only a lower priority can be suspended: when the head is itself of the lowest rank
        # running (a batch job waiting behind batch jobs, the common case) nothing is built.
        rank = head.rank
        cands = [r for r in self._candidates.values()
                 if r.pending.rank > rank and r.suspendable and slots[r.backend].cfg.continues]
        if not cands:
            return False

        def fits(c: Candidate) -> bool:
            return (slots.is_healthy(c.backend) and slots.fits_after_release(c.backend, head.cls, c.cls)
                    and not queue.guaranteed(c.cls))

        progress = self.progress
        victim = policy.victim(head, (
            Candidate(r.pending.id, r.pending.cls, r.pending.rank, r.backend,
                      (r.max_tokens if r.max_tokens is not None else 1 << 30) - progress(r.pending.id),
                      r.preemptions, r.bound_at)
            for r in cands
        ), now, fits)
        if victim is None:
            return False
        self._suspend(self._reqs[victim.id], now)
        backend = choose(slots, head, now)
        assert backend is not None
        queue.take(head.id, now)
        self._bind(self._reqs[head.id], backend, now)
        return True

    def _suspend(self, r: _Req, now: float) -> None:
        p = r.pending
        self._release(r.backend, p.cls)
        del self._candidates[p.id]
        r.state, r.suspendable = State.SUSPENDED, False
        r.preemptions += 1
        # Queued again with its first arrival (aging counts from there) and a fresh wait bound.
        again = Pending(p.id, p.cls, p.rank, p.est_tokens, p.arrived_at, now + self._classes[p.cls].max_queue_wait_s)
        r.pending = again
        self.queue.requeue(again, now)
        self._out.append(Suspend(p.id, r.backend))


def _same_names(what: str, old: list[str], new: list[str]) -> None:
    if sorted(old) != sorted(new):
        added = sorted(set(new) - set(old))
        removed = sorted(set(old) - set(new))
        change = "; ".join(p for p in (f"added {', '.join(added)}" if added else "",
                                        f"removed {', '.join(removed)}" if removed else "") if p)
        raise ConfigError(f"the {what} changed ({change}): that needs a restart of the gateway, "
                          f"a live reload only changes settings of the same {what}")
