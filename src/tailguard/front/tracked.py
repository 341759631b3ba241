"""What the front keeps of each request (`Tracked`, in a `State`) and what it shows of each
backend (`BackendView`): plain records, apart from the logic in `front.front` and
`front.recovery` that both read and change them."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tailguard.front.events import StartMode
from tailguard.front.latency import Features
from tailguard.front.queue import Pending
from tailguard.front.router import Route
from tailguard.types import FailureKind


class State(enum.Enum):
    """Where a request stands in the front. Which events each state takes is the front's
    transition table (`front.front.TRANSITIONS`)."""

    QUEUED = "queued"  # waiting for its first start
    RUNNING = "running"  # on a backend, holding a slot (and, while hedged, a second one)
    SUSPENDED = "suspended"  # waiting again, holding no slot: suspended, or its retry or continuation waits
    FAILED = "failed"  # the front gave it up after a failure (`GiveUp`): it keeps its slot until `Finished`


class Tracked:
    """One request as the front keeps it, from its arrival to its end."""

    __slots__ = ("pending", "state", "backend", "bound_at", "preemptible", "max_tokens", "suspendable",
                 "preemptions", "attempts", "tried", "fresh_retried", "caller", "generated", "route", "hedge",
                 "first", "continuable", "migrations", "avoid", "must_continue", "held", "again", "resumable",
                 "body_bytes", "x")

    def __init__(self, pending: Pending, preemptible: bool, max_tokens: int | None, caller: str | None,
                 route: Route, continuable: bool = False, resumable: bool = False) -> None:
        self.pending = pending
        self.resumable = resumable  # its output could be continued from its text (the intake's rule)
        # Its driver keeps its text (`Front.tracks` at its arrival), so it can be continued.
        self.continuable = continuable
        self.caller = caller
        self.route = route
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
        self.generated = 0  # tokens generated over all runs, as the last `Generated` said
        self.hedge: str | None = None  # the backend of its second attempt while it is hedged
        self.first = False  # its first content came
        self.migrations = 0  # continued on another backend after its own died or stalled mid-answer
        self.avoid: set[str] = set()  # backends it failed on, skipped while it waits for another
        self.must_continue = False  # waiting to be continued: only a kind that can continue takes it
        # How it starts again once it waits (suspended, or its retry or continuation waits), and
        # the failure that made it wait: what its next `Start` says.
        self.again: tuple[StartMode, FailureKind | None, str | None] = (StartMode.CONTINUE, None, None)
        self.held = 0  # tokens reserved against its caller's tpm_limit, settled once as it leaves
        self.body_bytes = 0  # its body's size while it waits for its first start (`max_queued_body_bytes`)
        self.x: Features | None = None  # what its first start looked like to the TTFT fit (`front.latency`)


@dataclass(frozen=True, slots=True)
class BackendView:
    """What a driver may read of one backend (for /health and gauges)."""

    name: str
    healthy: bool  # takes requests (a backend starts healthy, so none waits for a probe to serve)
    retiring: bool
    in_flight: int
    max_concurrency: int
    reserved_slots: int
    probed: bool = False  # a probe has answered or failed: its health is known, not assumed
    failures: int = 0  # failed probes and connections in a row
    ejected: bool = False  # out for a while after failed requests in a row (`front.ejection`)
    pool: str = "default"
    models: tuple[str, ...] | None = None  # what it serves, configured or listed (None: not known)
    cap: int = 0  # the in-flight cap in force: `max_concurrency`, or the adaptive one
    stale: bool = False  # its probes or engine metrics have gone stale: routing counts it as saturated

    @property
    def takes_requests(self) -> bool:
        """Healthy by its probes, not ejected for failing requests, not retiring."""
        return self.healthy and not self.ejected and not self.retiring

    @property
    def state(self) -> str:
        """What /health says of it: `unknown` until a probe has answered, `failing` while probes
        fail but fewer than `unhealthy_after` in a row (it still takes requests), `unhealthy`,
        or `healthy`."""
        if not self.healthy:
            return "unhealthy"
        if self.ejected:
            return "ejected"
        if self.failures:
            return "failing"
        return "healthy" if self.probed else "unknown"
