"""What a discrete-event run (`sim.des`) keeps of each host, each front-dispatched request and its
autoscaler while it goes; pure, no I/O."""

from __future__ import annotations

from tailguard.front.capacity import Capacity
from tailguard.sim.engine import RequestFinished, Step
from tailguard.sim.fault import ErrorSpread
from tailguard.sim.scenario import Arrival, Host, Scaling


class LiveHost:
    """A host while the run goes: its engine, the step in flight, whether it is dead."""

    __slots__ = ("name", "engine", "models", "faults", "errors", "dead", "step", "cut")

    def __init__(self, h: Host) -> None:
        self.name = h.name
        self.engine = h.engine
        self.models = frozenset(h.models)
        self.faults = h.faults
        self.errors = ErrorSpread(h.faults)
        self.dead = False
        self.step: Step | None = None  # in flight until its end is popped from the agenda
        self.cut: set[str] = set()  # aborted mid-step: the step in flight delivers nothing to them

    def produced(self, req_id: str) -> int:
        """Tokens `req_id` has received from this engine: its count there, less the token of the
        step in flight (not delivered before the step ends; a request that finishes in it has
        left the engine already, and counts from its finish)."""
        n = self.engine.output_tokens(req_id)
        step = self.step
        if step is not None and req_id in step.emitted:
            if n == 0:
                n = next(ev.output_tokens for ev in step.events
                         if isinstance(ev, RequestFinished) and ev.req_id == req_id)
            n -= 1
        return n


class LiveRequest:
    """A front-dispatched request from its first `Start` to its end: where it runs (and, while
    hedged, where its second attempt runs) and what earlier runs generated."""

    __slots__ = ("arrival", "kv_key", "base_tokens", "host", "attempt", "hedge", "hedge_attempt", "tries")

    def __init__(self, arrival: Arrival, kv_key: int | None) -> None:
        self.arrival = arrival
        # The engine's name for its content (preemptible requests only): each run finds what the
        # last left cached.
        self.kv_key = kv_key
        self.base_tokens = 0  # generated in earlier runs (suspended, or failed after producing)
        self.host: LiveHost | None = None  # None while queued again (suspended, or being retried)
        self.hedge: LiveHost | None = None  # its second attempt's, while hedged
        # Attempts are numbered (`tries` so far), so a header deadline of one that ended finds
        # the request moved on.
        self.attempt = self.hedge_attempt = self.tries = 0

    def promote_hedge(self) -> None:
        """The first attempt is gone: the hedge is the request's attempt from now on."""
        self.host, self.attempt, self.hedge = self.hedge, self.hedge_attempt, None


class Autoscaler:
    """The autoscaler's state in a run: the capacity signal, the engines on their way."""

    __slots__ = ("scaling", "capacity", "hosts", "coming")

    def __init__(self, scaling: Scaling, hosts: int) -> None:
        self.scaling = scaling
        self.capacity = Capacity(scaling.window_s)
        self.hosts = hosts  # in the fleet or on their way
        self.coming = 0  # asked for, not up yet
