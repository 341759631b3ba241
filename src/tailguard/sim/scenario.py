"""What a discrete-event run is given and what it gives back: timed requests (`Arrival`), the
engines of a fleet with their faults (`Host`), the gateway's probes (`Probing`), an autoscaler
(`Scaling`, `Scaled`), what stands before the front (`Gate`), what a run tells its callers as it
goes (`FollowUp`, `Tap`), and what happened to each request (`Timeline`); pure data, apart from the driver (`sim.des`) so the modules that plan a run or read
its results (the sweep, the replicas run, the benchmarks) do not take the driver with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tailguard.front.counts import Counts
from tailguard.front.events import Arrive, Decision, Event
from tailguard.front.intake import Accepted
from tailguard.sim.engine import Engine
from tailguard.sim.fault import Faults
from tailguard.types import Outcome
from tailguard.wire.prefix import BLOCK_CHARS, MAX_BLOCKS

# The gateway hashes a prompt in blocks of BLOCK_CHARS characters (`wire.prefix`), about a quarter
# as many tokens by its estimate; an arrival's keys are the engine's 16-token blocks, so every
# fourth of them is the chain the gateway's router sees.
_PREFIX_STRIDE = BLOCK_CHARS // 4 // 16


@dataclass(slots=True, frozen=True)
class Probing:
    """The gateway's active health probes (its `health.interval_s` and `timeout_s`): each host
    is probed at once and then every `interval_s`."""

    interval_s: float = 5.0
    timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and self.timeout_s > 0):
            raise ValueError(f"probe interval and timeout must be > 0, got {self.interval_s}, {self.timeout_s}")
@dataclass(slots=True, frozen=True)
class Arrival:
    """A timed request. `cls` matters only with a front (whose class table gives its rank and
    queue bound); `priority` is vLLM's (lower first, with the engine's "priority" policy);
    `max_tokens` is what the engine may generate for it. `accepted` is what the gateway's intake
    made of it (`tailguard.front.intake`: the front's job size, the limit it was sent with, whether
    it can be continued); `refused` the code of the client error it got instead, `refused_status`
    its HTTP status (400, or 403 when its key may not have the class or model it asked for)."""

    id: str
    at: float
    prompt_tokens: int
    max_tokens: int
    cls: str = "interactive"
    priority: int = 0
    block_hashes: tuple[int, ...] = ()  # prefix-cache keys of the prompt's leading blocks (sim.kv)
    caller: str | None = None  # whose request (the front's limits per caller), as an API key names it
    accepted: Accepted | None = None
    refused: str | None = None
    refused_status: int = 400
    model: str | None = None  # the model it asks for (an alias resolved); a host that does not serve it answers 404
    program: str | None = None  # the agent program it is a call of (`Arrive.program`)

    @property
    def resumable(self) -> bool:
        return self.accepted is None or self.accepted.resumable

    def arrive(self) -> Arrive:
        """What the front is told: the request as the intake accepted it or, made by hand, sized
        by its own `max_tokens` (a plain text generation); with its model and its prompt's
        chained block hashes as the gateway would hash them, and its program."""
        prefix = self.block_hashes[_PREFIX_STRIDE - 1::_PREFIX_STRIDE][:MAX_BLOCKS]
        acc = self.accepted
        if acc is None:
            return Arrive(self.id, self.cls, self.prompt_tokens + self.max_tokens, True, self.max_tokens, self.caller,
                          self.model, prefix, program=self.program, prompt_tokens=self.prompt_tokens)
        return Arrive(self.id, self.cls, acc.est_tokens, acc.resumable, acc.max_tokens, self.caller, self.model,
                      prefix, program=self.program, prompt_tokens=self.prompt_tokens, ttft_slo_s=acc.ttft_slo_s)


class Gate(Protocol):
    """What stands before the front: the gateway's intake as a run's driver applies it."""

    def admit(self, a: Arrival) -> Arrival:
        """`a` as the front gets it, decided as it arrives (class, limits, size; or `refused`)."""
        ...

    def finished(self, tl: Timeline) -> None:
        """`tl`'s request ended well (its output tokens are known)."""
        ...


@dataclass(slots=True)
class Timeline:
    """What happened to one request, in simulated seconds.

    `queue_s` runs from arrival to the engine first scheduling the request (the front queue plus
    the engine's own queue); `front_queue_s` is the part spent in the front scheduler.
    `token_times` is filled only when `run(..., record_tokens=True)`. `backend` is the host of its
    last attempt (a hedge's winner); `failures` counts its attempts that failed (a dead, hung or
    failing host); `counts` is what the front's decisions say of it (`front.counts`: attempts,
    retries, migrations, suspensions, hedges), counted as the gateway counts them.
    """

    id: str
    cls: str
    arrived_at: float
    prompt_tokens: int
    max_tokens: int
    outcome: Outcome | None = None
    reject_reason: str | None = None  # a RejectReason (refused by the front), or a 4xx code (the intake, the engine)
    status: int | None = None  # a client error's HTTP status (400, or 403 when forbidden); None otherwise
    retry_after_s: float | None = None  # what a refusal told the client (a follow-up comes no sooner)
    finish_reason: str | None = None
    dispatched_at: float | None = None
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    preemptions: int = 0  # by the engine (KV pressure)
    token_times: list[float] | None = None
    backend: str | None = None
    failures: int = 0
    counts: Counts = field(default_factory=Counts)

    @property
    def suspensions(self) -> int:
        """Suspended by the front (the gateway's preemption)."""
        return self.counts.preemptions

    @property
    def hedges(self) -> int:
        """Second attempts the front sent beside its first."""
        return self.counts.hedges

    @property
    def queue_s(self) -> float | None:
        return None if self.admitted_at is None else self.admitted_at - self.arrived_at

    @property
    def front_queue_s(self) -> float | None:
        return None if self.dispatched_at is None else self.dispatched_at - self.arrived_at

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrived_at

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.arrived_at

    @property
    def tpot_s(self) -> float | None:
        if self.finished_at is None or self.first_token_at is None or self.output_tokens < 2:
            return None
        return (self.finished_at - self.first_token_at) / (self.output_tokens - 1)


@dataclass(slots=True, frozen=True)
class Host:
    """One engine of a fleet, named as the front names the backend it stands for.

        hosts = [Host("a", Engine(cfg)), Host("slow", Engine(cfg.slowed(5))),
                 Host("b", Engine(cfg), dies_at=7.0, revives_at=30.0),
                 Host("hung", Engine(cfg), faults=Faults(fault="hang"))]

    `models`: what it serves (empty: whatever is asked); `faults`: what `tailguard sim` would do
    wrong with the same options (hang, or hang on completions only; a share of 500s); `dies_at`:
    the instant its process dies (SIGKILL: what it holds fails, and its KV and prefix cache are
    lost; every later connection is refused) and `revives_at` when it is back, empty."""

    name: str
    engine: Engine
    models: tuple[str, ...] = ()
    faults: Faults = Faults()
    dies_at: float | None = None
    revives_at: float | None = None


@dataclass(frozen=True, slots=True)
class Scaled:
    """One engine an autoscaler asked for: when, what the signal said then, when it took requests."""

    name: str
    asked_at: float
    needed: int
    ready_at: float


@dataclass(slots=True)
class Scaling:
    """Engines added mid-run as `tailguard_capacity_needed` asks, as a KEDA or HPA autoscaler on
    it would (deploy/keda/scaledobject.yaml): every `interval_s` the signal of the first backend's
    pool is read (`front.capacity`, the gateway's own code and window), and when it needs more
    engines than are ready or on their way, the missing ones are asked for; each takes requests
    `provision_s` later (a pod scheduled, an engine loading its weights), configured as the
    first backend is. It only scales up, to at most `max_hosts`; `added` says what it did.

        scaling = Scaling(lambda name: Host(name, Engine(cfg)), interval_s=15.0, provision_s=30.0)
        run_fleet(hosts, arrivals, clock, front, scaling=scaling); scaling.added
    """

    make: Callable[[str], Host]
    interval_s: float = 15.0
    provision_s: float = 30.0
    max_hosts: int = 64
    window_s: float = 60.0  # the signal's window (the gateway's default)
    added: list[Scaled] = field(default_factory=list)


# Told each event the front was handed, at what instant, whether it could preempt, and what it
# decided: what the gateway's recorder writes (`gateway.ops.recorder.Recorder.event`).
Tap = Callable[[Event, float, bool, Sequence[Decision]], None]
# Told each request's end and its instant: the next arrival (or several, or none) it sends.
FollowUp = Callable[[Timeline, float], Arrival | Sequence[Arrival] | None]
