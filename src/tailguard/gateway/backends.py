"""The backend pool's state, and how each kind of server wants its request body; pure, no I/O.

The I/O side feeds it (acquire/release around each upstream request, mark_failure/mark_success
from health probes and connection errors); the router and the scheduler's admissibility check
read it. Slot shares are enforced here: a class may hold, together with every class ranked after
it, at most `floor(max_concurrency * max_share)` slots of a backend (at least one), so the
remainder stays free for higher-ranked classes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from tailguard.gateway.config import BackendConfig, ClassConfig, HealthConfig
from tailguard.gateway.kinds import get_kind


class BackendState:
    """One backend's live counters. Mutated only through `BackendPool`."""

    __slots__ = ("cfg", "name", "in_flight", "by_class", "healthy", "failures", "successes", "last_acquired")

    def __init__(self, cfg: BackendConfig, class_names: Iterable[str]) -> None:
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


class BackendPool:
    """In-flight counts, health and slot shares of every backend.

        pool = BackendPool(cfg.backends, cfg.classes, cfg.health)
        if pool.has_capacity("gpu-a", "batch"):
            pool.acquire("gpu-a", "batch")
            ...
            pool.release("gpu-a", "batch")
    """

    def __init__(
        self, backends: Sequence[BackendConfig], classes: Iterable[ClassConfig], health: HealthConfig | None = None,
    ) -> None:
        cls_list = list(classes)
        self._classes = {c.name: c for c in cls_list}
        # For each class, the classes whose in-flight count its share limits: itself and every
        # class ranked after (or level with) it.
        self._share_group: dict[str, tuple[str, ...]] = {
            c.name: tuple(o.name for o in cls_list if o.rank >= c.rank) for c in cls_list
        }
        self._states: dict[str, BackendState] = {b.name: BackendState(b, self._classes) for b in backends}
        self._slots: dict[tuple[str, str], int] = {
            (b.name, c.name): max(1, math.floor(b.max_concurrency * c.max_share + 1e-9))
            for b in backends for c in cls_list
        }
        self._health = health or HealthConfig()
        self._seq = 0

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
        if s.in_flight >= s.cfg.max_concurrency:
            return False
        held = 0
        for name in self._share_group[cls]:
            held += s.by_class[name]
        return held < self._slots[(backend, cls)]

    def fits_after_release(self, backend: str, cls: str, freed_cls: str) -> bool:
        """Would a request of `cls` have a slot on `backend` once one request of `freed_cls` left
        it? (The check a preemption makes before suspending anything.)"""
        s = self._states[backend]
        if s.by_class[freed_cls] <= 0 or s.in_flight - 1 >= s.cfg.max_concurrency:
            return False
        group = self._share_group[cls]
        held = sum(s.by_class[name] for name in group) - (1 if freed_cls in group else 0)
        return held < self._slots[(backend, cls)]

    def acquire(self, backend: str, cls: str) -> None:
        """Bind one request of `cls` to a slot; the caller checked `has_capacity`."""
        s = self._states[backend]
        if not self.has_capacity(backend, cls):
            raise RuntimeError(f"backend {backend!r} has no free slot for class {cls!r}")
        s.in_flight += 1
        s.by_class[cls] += 1
        self._seq += 1
        s.last_acquired = self._seq

    def release(self, backend: str, cls: str) -> None:
        s = self._states[backend]
        if s.by_class[cls] <= 0:
            raise RuntimeError(f"release without acquire: backend {backend!r}, class {cls!r}")
        s.in_flight -= 1
        s.by_class[cls] -= 1

    def in_flight(self, backend: str, cls: str | None = None) -> int:
        s = self._states[backend]
        return s.in_flight if cls is None else s.by_class[cls]

    def is_healthy(self, backend: str) -> bool:
        return self._states[backend].healthy

    def any_healthy(self) -> bool:
        return any(s.healthy for s in self._states.values())

    def mark_failure(self, backend: str) -> bool:
        """A probe or connection failed. True when this failure turned the backend unhealthy."""
        s = self._states[backend]
        s.successes = 0
        s.failures += 1
        if s.healthy and s.failures >= self._health.unhealthy_after:
            s.healthy = False
            return True
        return False

    def mark_success(self, backend: str) -> bool:
        """A probe succeeded. True when this success turned the backend healthy again."""
        s = self._states[backend]
        s.failures = 0
        if s.healthy:
            return False
        s.successes += 1
        if s.successes >= self._health.healthy_after:
            s.healthy = True
            s.successes = 0
            return True
        return False


# --- per-kind request translation ---------------------------------------------------------

Body = dict[str, Any]


def translate_body(kind: str, body: Body, rank: int) -> Body | None:
    """The body a backend of `kind` should get for a request of class rank `rank`, or None when
    the body goes unchanged (so the caller forwards the bytes it has).

    Engines with a priority queue of their own (vLLM under `--scheduling-policy priority`,
    SGLang with priority scheduling) get the class as their `priority` field, in their own
    direction (`Kind.priority_for`). A client's own value is replaced: the class is the gateway's
    to set, or a batch client could jump the engine's queue with `priority: -100`. A body that
    already says what the class says (absent = the engine's default 0) is not rewritten."""
    placed = get_kind(kind).priority_for(rank)
    if placed is None:
        return None
    field, value = placed
    if body.get(field, 0) == value:
        return None
    new = dict(body)
    new[field] = value
    return new


def prepare_body(backend: BackendConfig, body: Body, rank: int) -> Body | None:
    """`translate_body` plus the backend's `model` rewrite; None when nothing changes."""
    out = translate_body(backend.kind, body, rank)
    if backend.model is not None and body.get("model") != backend.model:
        out = dict(out if out is not None else body)
        out["model"] = backend.model
    return out
