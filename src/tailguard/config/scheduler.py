"""The `scheduler` section of the gateway's config: who goes next when a slot frees
(`SchedulerConfig`: policy, aging, shortest-first, drain rate, preemption, Retry-After) and the
output-size estimate it uses as job size (`OutputEstimateConfig`). Its own module because it is
the one section that becomes the front's queue and preemption parameters."""

from __future__ import annotations

from typing import Literal, cast

from pydantic import Field, model_validator

from tailguard.front import params as fp
from tailguard.config.base import _OUTPUT, _PREEMPT, _QUEUE, _Model

SchedulerPolicy = Literal["ranked-sjf", "fcfs"]


class OutputEstimateConfig(_Model):
    """How big a request without `max_tokens` is assumed to be, for shortest-job-first."""

    initial_tokens: int = Field(
        default=_OUTPUT.initial_tokens, ge=1,
        description="Output tokens assumed for a class before any of its requests has finished.",
    )
    ewma_weight: float = Field(
        default=_OUTPUT.ewma_weight, gt=0, le=1,
        description="Weight of each finished request's real output length in the class's running average.",
    )

    def params(self) -> fp.OutputEstimateParams:
        return fp.OutputEstimateParams(initial_tokens=self.initial_tokens, ewma_weight=self.ewma_weight)


class SchedulerConfig(_Model):
    """Who goes next when a slot frees."""

    policy: SchedulerPolicy = Field(
        default=cast(SchedulerPolicy, _QUEUE.policy),
        description="`ranked-sjf`: priority by class rank (with `min_share` guarantees), shortest estimated job "
        "first within a rank (see `sjf_size_ratio`), with aging. `fcfs`: arrival order, for comparison.",
    )
    aging_s: float = Field(
        default=_QUEUE.aging_s, gt=0,
        description="Starvation bound of `ranked-sjf`: once a request has waited this long, no younger request "
        "of its rank is dispatched before it (aged requests go oldest first).",
    )
    sjf_size_ratio: float = Field(
        default=_QUEUE.sjf_size_ratio, ge=1,
        description="Within a class, shortest-first needs a real gap: the oldest queued request goes next "
        "unless another is at least this many times smaller (then the smallest goes). Job sizes are rough "
        "(a prompt token costs far less time than an output token), so near-equal sizes keep arrival order "
        "instead of starving the slightly larger ones. 1 = strict shortest first.",
    )
    output_estimate: OutputEstimateConfig = Field(
        default_factory=OutputEstimateConfig,
        description="Running per-class estimate of output length, used as job size when `max_tokens` is absent.",
    )
    drain_ewma_weight: float = Field(
        default=_QUEUE.drain_ewma_weight, gt=0, le=1,
        description="The drain rate (used for `wait_bound` rejections and `Retry-After`) is counted over the "
        "last `4 / drain_ewma_weight` completions that happened while requests were queued.",
    )
    preemption: bool = Field(
        default=_PREEMPT.enabled,
        description="Suspend a running request of a `preemptible` class when a request of a higher priority (lower rank) is "
        "queued and no backend has a slot for it; the suspended one is resumed where it stopped. "
        "Not done by the `fcfs` policy (the baseline).",
    )
    max_preemptions_per_request: int = Field(
        default=_PREEMPT.max_preemptions_per_request, ge=0,
        description="How often one request may be suspended; after that it runs to its end.",
    )
    min_run_s: float = Field(
        default=_PREEMPT.min_run_s, ge=0,
        description="A request (re)started less than this long ago is not suspended, so a burst of "
        "arrivals cannot suspend the same work over and over before it makes progress.",
    )
    retry_after_min_s: float = Field(default=_QUEUE.retry_after_min_s, gt=0, description="Smallest `Retry-After` ever sent.")
    retry_after_max_s: float = Field(default=_QUEUE.retry_after_max_s, gt=0, description="Largest `Retry-After` ever sent.")

    fair_share: bool | None = Field(
        default=None,
        description="Callers waiting in one rank are served in proportion to their `weight` by tokens consumed "
        "(a virtual token counter per caller, VTC), shortest job first within each caller's own requests. "
        "Unset: on whenever `auth.api_keys` names two or more callers and the policy is `ranked-sjf`, so one "
        "caller's flood cannot take the others' share; `false` turns it off, `true` needs the `ranked-sjf` policy.",
    )
    fair_input_price: float = Field(
        default=_QUEUE.fair_input_price, gt=0, description="What a prompt token adds to its caller's counter.")
    fair_output_price: float = Field(
        default=_QUEUE.fair_output_price, gt=0, description="What a generated token adds to its caller's counter.")
    fair_credit: float = Field(
        default=_QUEUE.fair_credit, ge=0,
        description="How far below the least counter of the callers waiting a caller back from idle may start "
        "(VTC lifts it to that counter: 0), in counter units (prompt tokens x fair_input_price + output tokens x "
        "fair_output_price, over the weight): a caller under its share gets a burst through ahead of one that floods.",
    )
    fair_preempt_gap: float | None = Field(
        default=_QUEUE.fair_preempt_gap, ge=0,
        description="A caller waiting in a `preemptible` class suspends a running request of another caller of its "
        "rank when, even once charged for its own request, its counter is more than this below that caller's "
        "(null: never). At most one suspension per arrival; the two can never suspend each other in turn.",
    )

    slo_margin: float = Field(
        default=_QUEUE.slo_margin, gt=0, le=1,
        description="A request whose class has a TTFT target (`classes[].slo.ttft_s`) is refused (or, in a class "
        "with `slo.shed: false`, counted late) when its predicted TTFT passes this share of its target: a "
        "prediction is a mean, and without a margin about half of those admitted near the target would miss it.",
    )

    def fair_share_on(self, callers: int) -> bool:
        """Whether callers share each rank, with `callers` named: as set, else when two or more can."""
        if self.fair_share is not None:
            return self.fair_share
        return callers >= 2 and self.policy == "ranked-sjf"

    def queue_params(self, callers: int = 0) -> fp.QueueParams:
        """The queue's parameters, with `callers` callers named (`auth.api_keys`)."""
        return fp.QueueParams(policy=self.policy, aging_s=self.aging_s, sjf_size_ratio=self.sjf_size_ratio,
                              drain_ewma_weight=self.drain_ewma_weight, retry_after_min_s=self.retry_after_min_s,
                              retry_after_max_s=self.retry_after_max_s, fair_share=self.fair_share_on(callers),
                              fair_input_price=self.fair_input_price, fair_output_price=self.fair_output_price,
                              fair_credit=self.fair_credit, fair_preempt_gap=self.fair_preempt_gap,
                              slo_margin=self.slo_margin)

    def preemption_params(self) -> fp.PreemptionParams:
        return fp.PreemptionParams(enabled=self.preemption, min_run_s=self.min_run_s,
                                   max_preemptions_per_request=self.max_preemptions_per_request)

    @model_validator(mode="after")
    def _retry_bounds(self) -> SchedulerConfig:
        if self.retry_after_min_s > self.retry_after_max_s:
            raise ValueError("retry_after_min_s is above retry_after_max_s")
        if self.fair_share and self.policy != "ranked-sjf":
            raise ValueError(f"fair_share needs the ranked-sjf policy, not {self.policy!r}")
        return self
