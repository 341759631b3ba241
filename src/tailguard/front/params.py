"""The front's parameters as plain frozen dataclasses; pure, no I/O.

The policies are configured with these, never with the gateway's YAML models, so the
discrete-event simulator, the benchmarks and the tests build a front without importing the
gateway. `tailguard.config` turns a validated `tailguard.yaml` into them (`*.spec()`),
and its field defaults are read from here, so every default lives in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tailguard.front.adaptive import AdaptiveParams

CapMode = Literal["clamp", "reject"]
RoutingPolicy = Literal["prefix-affinity", "predicted-ttft", "least-tokens", "p2c", "round-robin"]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]  # OpenAI's


@dataclass(frozen=True, slots=True)
class Slo:
    """A class's service-level objective (docs/slo.md): a first token within `ttft_s` of arrival,
    output at `tpot_s` per token after it, the whole answer within `e2e_s` (None: no such target).
    The front admits and orders by the TTFT target (`front.latency` predicts it); every target is
    measured, each request's record saying whether it met them. `shed`: a request predicted to miss
    its TTFT target is refused at once with a Retry-After (else it is served late, counted missed).
    `min_ttft_s`: the tightest TTFT a request may ask for (`x-tailguard-ttft-slo-ms`; None: none
    tighter than `ttft_s`, unless its API key's `min_ttft_slo_s` lets it)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    shed: bool = True
    min_ttft_s: float | None = None


@dataclass(frozen=True, slots=True)
class ClassSpec:
    """A request class as the front sees it: its rank, queue bounds and slot shares, and what
    its requests may ask for (`tailguard.front.intake`)."""

    name: str
    rank: int = 0  # lower is served first
    max_queue_len: int = 1000
    # Longest wait in the queue: a request expected to wait longer is refused on arrival, one
    # that does wait this long leaves with a 503. What a chat user will wait for a first token.
    max_queue_wait_s: float = 30.0
    max_share: float = 1.0  # of each backend's slots, together with every class ranked after it
    min_share: float = 0.0  # guaranteed fraction of the slots in use while it has requests queued
    preemptible: bool = False  # a running request may be suspended and continued later
    default_max_tokens: int | None = None  # set on a request that asks for no limit (else the cap)
    max_tokens_cap: int | None = None  # the largest output limit a request may ask for
    cap_mode: CapMode = "clamp"  # over the cap: lowered to it, or refused with a 400
    max_prompt_tokens: int | None = None  # a larger (estimated) prompt is refused with a 400
    pools: tuple[str, ...] = ()  # backend pools its requests may use, tried in order (empty: every pool)
    start_interval_s: float = 0.0  # at most one start of the class per backend per interval (0: unpaced)
    slo: Slo | None = None  # its service-level objective (None: none; it is ordered and refused as before)


@dataclass(frozen=True, slots=True)
class QueueParams:
    """Who goes next (`tailguard.front.queue`) and when a refused client may retry
    (`tailguard.front.admission`)."""

    policy: str = "ranked-sjf"
    aging_s: float = 10.0
    sjf_size_ratio: float = 4.0
    drain_ewma_weight: float = 0.1
    retry_after_min_s: float = 1.0
    retry_after_max_s: float = 300.0
    # The request bodies that may wait for their first start at once (None: no bound): a queue's
    # length alone lets a few thousand large bodies fill the host (`limits.max_queued_body_bytes`).
    max_queued_body_bytes: int | None = None
    fair_share: bool = False  # callers share each rank by tokens served (`front.fairshare`, VTC)
    fair_input_price: float = 1.0  # a prompt token's weight in a caller's virtual counter
    fair_output_price: float = 2.0  # a generated token's (VTC's default prices)
    # How far below the least backlogged counter a caller back from idle may start (VTC: 0), so a
    # caller under its share gets its bursts through ahead of one that floods.
    fair_credit: float = 8192.0
    # A waiting caller this far below a running request's caller, once charged for its own request,
    # suspends that request (in a preemptible class; None: never). `front.fairqueue`.
    fair_preempt_gap: float | None = 0.0
    # A request with a TTFT target is refused (or, in a class that does not shed, counted late) when
    # its predicted TTFT passes this share of its target: a prediction is a mean, and without a
    # margin about half of those admitted near the target would miss it (docs/slo.md).
    slo_margin: float = 0.8


@dataclass(frozen=True, slots=True)
class PreemptionParams:
    """When a running request of a preemptible class may be suspended for a waiting one."""

    enabled: bool = True
    max_preemptions_per_request: int = 16
    min_run_s: float = 0.0


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend's slots. `continues` says whether its kind can resume a generation from its
    text (then preemption protects higher ranks); `reserved_slots` is how many slots only the
    top rank may take (None: none where `continues`, else a quarter of the slots, at least one,
    so that a burst of long jobs can never hold every slot of an engine nobody can preempt).
    `adaptive`: the cap moves between its bounds from the backend's latency (`front.adaptive`),
    starting at `max_concurrency` unless it names its own start."""

    name: str
    max_concurrency: int = 8
    weight: float = 1.0
    continues: bool = False
    reserved_slots: int | None = None
    adaptive: AdaptiveParams | None = None
    models: tuple[str, ...] = ()  # the models it serves as configured (empty: as its /v1/models says, or any)
    pool: str = "default"

    def reserve(self, cap: int | None = None) -> int:
        """Slots kept for the top rank out of `cap` in flight (default `max_concurrency`; an
        adaptive backend's reservation follows its cap)."""
        cap = self.max_concurrency if cap is None else cap
        if self.reserved_slots is not None:
            return min(self.reserved_slots, cap - 1)
        if self.continues or cap < 2:
            return 0
        return max(1, cap // 4)


@dataclass(frozen=True, slots=True)
class HealthParams:
    """How many consecutive failures make a backend unhealthy, and successes healthy again."""

    unhealthy_after: int = 3
    healthy_after: int = 1


@dataclass(frozen=True, slots=True)
class RoutingParams:
    """Where a request goes among the backends that may take it (`tailguard.front.router`).

    `prefix-affinity` sends requests that share a leading prompt to the instance that served it
    last (its prefix cache holds it), as long as that instance is not loaded past
    `balance_factor` x the least loaded plus `balance_slack` requests' worth; a prompt of which no
    instance holds `min_prefix_share` is routed as `least-tokens` would (SGLang's `cache_aware`
    does alike, with a radix tree per worker). `least-tokens`: the least outstanding estimated
    tokens per unit of capacity; `p2c`: the lesser of two drawn at random; `round-robin`."""

    policy: RoutingPolicy = "prefix-affinity"
    min_prefix_share: float = 0.5
    balance_factor: float = 1.5
    balance_slack: float = 2.0
    index_blocks: int = 1 << 16  # prefix blocks remembered, least recently used dropped first
    engine_load_ttl_s: float = 15.0  # an engine's own load reading older than this counts as none
    # A backend probed once and not since within this long counts as saturated by `predicted-ttft`
    # routing (llm-d's choice: a backend nobody can read is not the one to send more to).
    stale_after_s: float = 30.0
    slow_factor: float = 2.0  # a backend this much slower per token than its peers' median gets less work
    slow_min_samples: int = 3  # requests its speed must be measured over first
    slow_ttl_s: float = 60.0  # a speed not measured again within this is forgotten (tried afresh)
    seed: int = 0  # of p2c's draws: the same events give the same choices


@dataclass(frozen=True, slots=True)
class EjectionParams:
    """Passive health (Envoy's outlier detection): `consecutive_failures` failed attempts in a row
    on one backend (refused or timed-out connections, 5xx, a response head that never came) eject
    it for `base_s` x the times it was ejected (at most `max_s`); at most `max_ejected_share` of a
    pool is out at once (one always may be), and when fewer than `panic_threshold` of the healthy
    backends a request may use are left, ejections are ignored for it (Envoy's panic mode)."""

    enabled: bool = True
    consecutive_failures: int = 3
    base_s: float = 30.0
    max_s: float = 300.0
    max_ejected_share: float = 0.5
    panic_threshold: float = 0.5


@dataclass(frozen=True, slots=True)
class HedgeParams:
    """Hedged requests (`tailguard.front.hedging`), off by default: a request of one of `classes`
    with no first content after `factor` x the `quantile` of the class's recent TTFTs (over the
    last `samples`, once `min_samples` are known; at least `min_delay_s`) is sent to a second
    backend too; the first to stream content wins. At most `max_share` of the class's requests of
    the last `window_s` are hedged."""

    enabled: bool = False
    classes: tuple[str, ...] = ("interactive",)
    quantile: float = 0.95
    factor: float = 1.0
    min_delay_s: float = 0.05
    samples: int = 256
    min_samples: int = 20
    max_share: float = 0.1
    window_s: float = 10.0


@dataclass(frozen=True, slots=True)
class RetryParams:
    """Retries of a request that failed before any byte reached its client, and continuations
    of one whose backend died or stalled after (`max_migrations`).

    A budget like Envoy's `retry_budget` and Finagle's `RetryBudget`: within any `window_s`,
    retries are at most `budget_ratio` of the requests that arrived plus `min_retries_per_s`
    per second, so a failing backend cannot make the gateway multiply its own load."""

    max_attempts: int = 3
    # Continuations of a stream whose backend died or stalled after bytes reached its client
    # (`front.retry`, Again.CONTINUE); counted apart from `max_attempts`, within the same budget.
    max_migrations: int = 2
    budget_ratio: float = 0.2
    min_retries_per_s: float = 5.0
    window_s: float = 10.0


@dataclass(frozen=True, slots=True)
class CallerSpec:
    """One caller's limits (an API key's name): requests and tokens (prompt and generated) per
    minute, requests queued or running at once (None: no limit), and its weight when callers
    share a class fairly (`front.fairshare`)."""

    name: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_parallel: int | None = None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class ProgramParams:
    """Agent programs: a session's calls known as one program (`front.identity`), ordered inside
    their rank by what the program has received so far (`front.plas`, PLAS), and kept on the
    backend that served its last call (`front.programs`, affinity). Memory is bounded: at most
    `max_programs` programs are remembered, and one not heard from for `ttl_s` is forgotten."""

    plas: bool = True  # order a rank's (a caller's) calls by their program's attained service
    # Attained service below this many tokens is level 0 (new programs first); each level above
    # covers twice the last, and within one the oldest program goes first (`front.plas`).
    quantum_tokens: int = 12288
    levels: int = 2
    half_life_s: float = 60.0  # a program's attained service halves over this long (llm-d's)
    affinity: bool = True  # a program's call goes where its last one went, while that is not loaded past the bound
    affinity_ttl_s: float = 120.0  # how long after its last call a program's KV is trusted to be in that cache
    infer: bool = True  # a prompt that continues a recent request's prompt is the same program's next call
    max_programs: int = 65536
    ttl_s: float = 600.0


@dataclass(frozen=True, slots=True)
class FrontParams:
    """Everything a `Front` is built from."""

    classes: Sequence[ClassSpec]
    backends: Sequence[BackendSpec]
    queue: QueueParams = field(default_factory=QueueParams)
    preemption: PreemptionParams = field(default_factory=PreemptionParams)
    health: HealthParams = field(default_factory=HealthParams)
    retry: RetryParams = field(default_factory=RetryParams)
    callers: Sequence[CallerSpec] = ()
    routing: RoutingParams = field(default_factory=RoutingParams)
    ejection: EjectionParams = field(default_factory=EjectionParams)
    hedging: HedgeParams = field(default_factory=HedgeParams)
    programs: ProgramParams = field(default_factory=ProgramParams)


@dataclass(frozen=True, slots=True)
class KeySpec:
    """What a client API key says about its requests: whose they are (`caller`), their class
    when neither header nor `service_tier` names one (`default_class`), the classes and models
    it may use (None: any), whether a class it may not use is lowered to its best allowed
    one (`lower`) or refused, how many tokens its batches in progress may hold together
    (`batch_enqueued_tokens`, None: no limit), whether its requests may set an engine's
    `priority` themselves (`set_priority`; else the field is the class's to set), and the tightest
    TTFT target its requests may ask for (`min_ttft_slo_s`, below their class's own floor; None:
    the class's floor)."""

    caller: str
    default_class: str | None = None
    allowed_classes: tuple[str, ...] | None = None
    lower: bool = False
    allowed_models: frozenset[str] | None = None
    batch_enqueued_tokens: int | None = None
    set_priority: bool = False
    min_ttft_slo_s: float | None = None


@dataclass(frozen=True, slots=True)
class IntakeParams:
    """How a request becomes a job (`tailguard.front.intake`): the classes with their caps, the
    class of a request nothing else classifies, the overrides of OpenAI's `service_tier` -> class
    mapping, the client API keys and the model aliases."""

    classes: Sequence[ClassSpec]
    default_class: str = "interactive"
    service_tier_map: Mapping[ServiceTier, str] = field(default_factory=dict)
    keys: Mapping[str, KeySpec] = field(default_factory=dict)  # by the key's SHA-256 hex digest (`intake.key_id`)
    aliases: Mapping[str, str] = field(default_factory=dict)  # model name a client uses -> the served one
    route_classes: Mapping[str, str] = field(default_factory=dict)  # route (`Endpoint`) -> its class by default


@dataclass(frozen=True, slots=True)
class OutputEstimateParams:
    """The job size of a request with no output limit: a running average of its class's real
    output lengths (`tailguard.front.intake.OutputEstimator`)."""

    initial_tokens: int = 256  # assumed before any request of the class has finished
    ewma_weight: float = 0.05  # of each finished request's output length


def default_classes() -> list[ClassSpec]:
    """`interactive` first, with a first token due within `INTERACTIVE_TTFT_S` (refused at once
    when it is predicted to miss that) and waiting at most what a chat user waits for one;
    `batch` preemptible, with every slot open to it, ten minutes of patience (docs/tuning.md), its
    output capped at 4096 tokens and no target."""
    return [
        ClassSpec(name="interactive", rank=0, max_queue_len=1000, max_queue_wait_s=INTERACTIVE_WAIT_S,
                  slo=Slo(ttft_s=INTERACTIVE_TTFT_S)),
        ClassSpec(name="batch", rank=1, max_queue_len=10000, max_queue_wait_s=600.0, preemptible=True,
                  max_tokens_cap=4096),
    ]


# A chat user's patience for a first token: the article's first-token timeout is 15-30 s, and an
# admitted chat must be answered well within it even under sustained overload.
INTERACTIVE_WAIT_S = 10.0
# What a chat user tolerates for a first token before the wait is felt (2-3 s; operators state 1 s
# for a chat product): the default target, which admission and the order keep admitted chats inside.
INTERACTIVE_TTFT_S = 2.0
