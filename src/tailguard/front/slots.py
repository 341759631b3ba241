"""The slot ledger: in-flight requests per backend and class, slot shares, reservations and
health; pure, no I/O.

The front is its only writer (acquire/release as it binds and ends requests, mark_failure/
mark_success from probes and connection errors); the router and the scheduler's admissibility
check read it. Slot shares are enforced here: a class may hold, together with every class ranked
after it, at most `floor(cap * max_share)` slots of a backend (at least one), so the remainder
stays free for higher-ranked classes. A backend's cap is its `max_concurrency`, or where it is
`adaptive`, the cap its latency has set (`front.adaptive`); shares and reservation follow it. A backend whose kind cannot continue a
generation also keeps `BackendSpec.reserve()` slots for the top rank: nothing can be suspended
there, so without a reservation a burst of long jobs would make a chat wait for one to end.

A live reload may add backends and remove them. A removed backend is retiring: it takes no new
request, and its requests in flight end where they run (Envoy drains a removed host alike); it
leaves the ledger when the last of them releases its slot.
"""

from __future__ import annotations

import math
from dataclasses import replace
from collections.abc import Iterable, Iterator, Sequence

from tailguard.front.adaptive import AdaptiveCap
from tailguard.front.params import BackendSpec, ClassSpec, HealthParams


class BackendState:
    """One backend's live counters. Mutated only through `BackendPool`."""

    __slots__ = ("cfg", "name", "in_flight", "by_class", "healthy", "failures", "successes", "last_acquired",
                 "retiring", "probed", "tokens", "learned_models", "engine_queued", "engine_read_at", "cost",
                 "cost_samples", "cost_at", "adaptive", "cap", "allotted", "probed_at")

    def __init__(self, cfg: BackendSpec, class_names: Iterable[str]) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.in_flight = 0
        self.by_class: dict[str, int] = {c: 0 for c in class_names}
        # Optimistic start: a dead backend is found by its first failures; a live one need not
        # wait a probe interval before serving.
        self.healthy = True
        self.failures = 0
        self.successes = 0
        self.last_acquired = -1  # sequence number of the latest acquire: the router's tie-break
        self.retiring = False  # removed by a reload: no new binds, gone once nothing is in flight
        self.probed = False  # a health probe has answered (or failed outright): its health is known
        self.probed_at: float | None = None  # when a probe last answered (None: never): how fresh its reading is
        self.tokens = 0  # estimated tokens (prompt + output) of its requests in flight: the router's load
        self.learned_models: frozenset[str] | None = None  # as its /v1/models said (None: not known)
        self.engine_queued = 0  # requests the engine itself reports running and waiting, at its last reading
        self.engine_read_at: float | None = None  # when that was read (None: never)
        # Seconds its requests took per estimated token, a running average over those that ended
        # well: how fast it serves, which the router weighs against its peers (None: not known yet).
        self.cost: float | None = None
        self.cost_samples = 0  # requests that running average is made of
        self.cost_at = 0.0  # when it last changed
        self.adaptive = None if cfg.adaptive is None else AdaptiveCap(cfg.adaptive, cfg.max_concurrency)
        self.cap = cfg.max_concurrency  # in force: set with the shares (`BackendPool._set_slots`)
        self.allotted: int | None = None  # this replica's part of the cap, where replicas share it

    def serves(self, model: str | None) -> bool:
        """Whether a request for `model` may go here: the configured models if any, else those
        its /v1/models listed, else (not known yet, or no model named) any."""
        if model is None:
            return True
        named = self.cfg.models
        if named:
            return model in named
        learned = self.learned_models
        return learned is None or model in learned

    def knows_models(self) -> bool:
        return bool(self.cfg.models) or self.learned_models is not None


class BackendPool:
    """In-flight counts, health and slot shares of every backend.

        pool = BackendPool(params.backends, params.classes, params.health)
        if pool.has_capacity("gpu-a", "batch"):
            pool.acquire("gpu-a", "batch")
            ...
            pool.release("gpu-a", "batch")
    """

    def __init__(
        self, backends: Sequence[BackendSpec], classes: Iterable[ClassSpec], health: HealthParams | None = None,
    ) -> None:
        cls_list = list(classes)
        self._set_classes(cls_list)
        self._states: dict[str, BackendState] = {b.name: BackendState(b, self._classes) for b in backends}
        self._slots: dict[tuple[str, str], int] = {}
        for s in self._states.values():
            self._set_slots(s)
        self._health = health or HealthParams()
        self._seq = 0

    def _set_classes(self, cls_list: list[ClassSpec]) -> None:
        self._classes = {c.name: c for c in cls_list}
        # For each class, the classes whose in-flight count its share limits: itself and every
        # class ranked after (or level with) it.
        self._share_group: dict[str, tuple[str, ...]] = {
            c.name: tuple(o.name for o in cls_list if o.rank >= c.rank) for c in cls_list
        }
        self._top_rank = min(c.rank for c in cls_list)

    def _set_slots(self, s: BackendState) -> None:
        """The backend's cap in force and, from it, each class's share and the reservation."""
        b = s.cfg
        cap = b.max_concurrency if s.adaptive is None else s.adaptive.cap
        cap = s.cap = cap if s.allotted is None else min(cap, s.allotted)
        reserve = b.reserve(cap)
        for c in self._classes.values():
            n = max(1, math.floor(cap * c.max_share + 1e-9))
            if c.rank > self._top_rank:
                n = min(n, cap - reserve)
            self._slots[(b.name, c.name)] = n

    def observe(self, backend: str, ttft_s: float | None, itl_s: float | None) -> bool:
        """A latency sample of `backend`: True when it moved the backend's adaptive cap (and
        with it the shares). A backend with a fixed cap, or one that has left, ignores it."""
        s = self._states.get(backend)
        if s is None or s.adaptive is None or s.adaptive.observe(ttft_s, itl_s, s.in_flight) == s.cap:
            return False
        self._set_slots(s)
        return True

    def adapts(self, backend: str) -> bool:
        """Whether `backend`'s cap learns from its requests' latency (`front.adaptive`)."""
        s = self._states.get(backend)
        return s is not None and s.adaptive is not None

    def allot(self, backend: str, slots: int | None) -> bool:
        """This replica's part of `backend`'s slots (None: all of them): True when the cap in
        force grew. A backend that has left ignores it."""
        s = self._states.get(backend)
        if s is None or s.allotted == slots:
            return False
        before = s.cap
        s.allotted = slots
        self._set_slots(s)
        return s.cap > before

    def reconfigure(
        self, backends: Sequence[BackendSpec], classes: Iterable[ClassSpec], health: HealthParams,
    ) -> list[str]:
        """New caps, weights, reservations, shares and health thresholds (for the same classes:
        the caller checked the names), keeping every in-flight count and health state. A cap
        lowered below what is in flight cancels nothing: `has_capacity` refuses new binds until
        enough have ended. Each backend kept keeps the `continues` its detected kind set. A new
        backend starts healthy, as at start; one no longer named retires (see the module
        docstring), and one named again before it left is kept, as configured now. Returns the
        removed backends that left at once, having nothing in flight."""
        self._set_classes(list(classes))
        self._health = health
        for b in backends:
            s = self._states.get(b.name)
            if s is None:
                s = self._states[b.name] = BackendState(b, self._classes)
            elif s.retiring:
                s.cfg, s.retiring = b, False
            else:
                s.cfg = replace(b, continues=s.cfg.continues)
            if s.adaptive is None or s.adaptive.params != b.adaptive:  # new settings: learnt anew
                s.adaptive = None if b.adaptive is None else AdaptiveCap(b.adaptive, b.max_concurrency)
            self._set_slots(s)
        named = {b.name for b in backends}
        for s in self._states.values():
            if s.name not in named:
                s.retiring = True
        gone = [s.name for s in self._states.values() if s.retiring and not s.in_flight]
        for name in gone:
            self._drop(name)
        return gone

    def _drop(self, name: str) -> None:
        del self._states[name]
        for cls in self._classes:
            self._slots.pop((name, cls), None)

    def set_continues(self, backend: str, continues: bool) -> None:
        """The backend's kind became known: whether it can continue a generation decides its
        reservation (and whether the front may suspend requests on it)."""
        s = self._states.get(backend)  # None: removed meanwhile
        if s is not None and s.cfg.continues != continues:
            s.cfg = replace(s.cfg, continues=continues)
            self._set_slots(s)

    def __iter__(self) -> Iterator[BackendState]:
        return iter(self._states.values())

    def __len__(self) -> int:
        return len(self._states)

    def __getitem__(self, name: str) -> BackendState:
        return self._states[name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._states)

    def slots_for(self, backend: str, cls: str) -> int:
        """Slots of `backend` that `cls` and the classes ranked after it may hold together."""
        return self._slots[(backend, cls)]

    def has_capacity(self, backend: str, cls: str) -> bool:
        """A free slot on `backend` that `cls` may take (health is the router's concern)."""
        s = self._states[backend]
        if s.in_flight >= s.cap or s.retiring:
            return False
        held = 0
        for name in self._share_group[cls]:
            held += s.by_class[name]
        return held < self._slots[(backend, cls)]

    def fits_after_release(self, backend: str, cls: str, freed_cls: str) -> bool:
        """Would a request of `cls` have a slot on `backend` once one request of `freed_cls` left
        it? (The check a preemption makes before suspending anything.)"""
        s = self._states[backend]
        if s.by_class[freed_cls] <= 0 or s.in_flight - 1 >= s.cap or s.retiring:
            return False
        group = self._share_group[cls]
        held = sum(s.by_class[name] for name in group) - (1 if freed_cls in group else 0)
        return held < self._slots[(backend, cls)]

    def acquire(self, backend: str, cls: str, tokens: int = 0) -> None:
        """Bind one request of `cls` and job size `tokens` to a slot; the caller checked
        `has_capacity`."""
        s = self._states[backend]
        if not self.has_capacity(backend, cls):
            raise RuntimeError(f"backend {backend!r} has no free slot for class {cls!r}")
        s.in_flight += 1
        s.by_class[cls] += 1
        s.tokens += tokens
        self._seq += 1
        s.last_acquired = self._seq

    def release(self, backend: str, cls: str, tokens: int = 0) -> bool:
        """Free one slot of `cls` (a request of job size `tokens`). True when that was a
        retiring backend's last request, which takes the backend out of the ledger."""
        s = self._states[backend]
        if s.by_class[cls] <= 0:
            raise RuntimeError(f"release without acquire: backend {backend!r}, class {cls!r}")
        s.in_flight -= 1
        s.by_class[cls] -= 1
        s.tokens -= tokens
        if s.retiring and not s.in_flight:
            self._drop(backend)
            return True
        return False

    def in_flight(self, backend: str, cls: str | None = None) -> int:
        s = self._states[backend]
        return s.in_flight if cls is None else s.by_class[cls]

    def is_healthy(self, backend: str) -> bool:
        s = self._states.get(backend)
        return s is not None and s.healthy

    def takes_new(self, backend: str) -> bool:
        """Healthy and not retiring: a backend a request may be sent to anew."""
        s = self._states.get(backend)
        return s is not None and s.healthy and not s.retiring

    def any_healthy(self) -> bool:
        for s in self._states.values():  # asked at every arrival: a loop is cheaper than any(genexpr)
            if s.healthy and not s.retiring:
                return True
        return False

    def learn_models(self, backend: str, models: Sequence[str] | None) -> None:
        """What the backend's /v1/models lists (None: it could not be read)."""
        s = self._states.get(backend)
        if s is not None:
            s.learned_models = frozenset(models) if models is not None else None

    def engine_load(self, backend: str, queued: int, now: float) -> None:
        """The engine's own count of requests running and waiting, read at `now`."""
        s = self._states.get(backend)
        if s is not None:
            s.engine_queued, s.engine_read_at = queued, now

    def served_in(self, backend: str, seconds: float, tokens: int, now: float, weight: float = 0.2) -> None:
        """A request of job size `tokens` ran `seconds` on `backend` and ended well, at `now`."""
        s = self._states.get(backend)
        if s is not None and tokens > 0:
            c = seconds / tokens
            s.cost = c if s.cost is None else s.cost + weight * (c - s.cost)
            s.cost_samples += 1
            s.cost_at = now

    def probed(self, backend: str, now: float | None = None) -> None:
        """A probe answered (or failed outright): the backend's health is known from now on.
        `now`: it answered then (a reading that keeps the backend from going stale)."""
        s = self._states.get(backend)
        if s is not None:
            s.probed = True
            if now is not None:
                s.probed_at = now

    def mark_failure(self, backend: str) -> bool:
        """A probe or connection failed. True when this failure turned the backend unhealthy
        (never for one that has left the ledger: a late probe of a removed backend)."""
        s = self._states.get(backend)
        if s is None:
            return False
        s.successes = 0
        s.failures += 1
        if s.healthy and s.failures >= self._health.unhealthy_after:
            s.healthy = False
            return True
        return False

    def mark_success(self, backend: str) -> bool:
        """A probe succeeded. True when this success turned the backend healthy again."""
        s = self._states.get(backend)
        if s is None:
            return False
        s.failures = 0
        if s.healthy:
            return False
        s.successes += 1
        if s.successes >= self._health.healthy_after:
            s.healthy = True
            s.successes = 0
            return True
        return False
