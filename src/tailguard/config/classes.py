"""The `classes` section of the gateway's config: `ClassConfig` (one request class: rank, caps,
queue budgets, shares, preemptible) and `default_classes()`. Apart from the other sections because
a class is what the gateway's scheduling is about and it has the most settings and checks."""

from __future__ import annotations

import re
from dataclasses import asdict

from pydantic import Field, field_validator, model_validator

from tailguard.front import params as fp
from tailguard.front.params import CapMode
from tailguard.config.base import _CLS, _Model

_CLASS_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class SloConfig(_Model):
    """A class's service-level objective: what admission, the order and the metrics hold it to."""

    ttft_s: float | None = Field(
        default=None, gt=0,
        description="First token within this many seconds of arrival. The gateway predicts each request's TTFT "
        "(each backend's latency fitted online) and orders its class's queue by deadline; a request predicted to "
        "miss it is refused at once (503 `deadline`, with Retry-After from the prediction), or served late if "
        "`shed` is false. `tailguard_slo_total{class,slo,result}` counts met and missed.",
    )
    tpot_s: float | None = Field(
        default=None, gt=0,
        description="Seconds per output token after the first (measured and counted, met or missed; not admitted by).",
    )
    e2e_s: float | None = Field(
        default=None, gt=0,
        description="The whole answer within this many seconds of arrival (a completion deadline; measured and "
        "counted, not admitted by).",
    )
    shed: bool = Field(
        default=True,
        description="A request predicted to miss `ttft_s` is refused at once (true), a queued one leaves (503 "
        "`late`) once it can no longer make it, and under overload the queued requests that cost most per target "
        "met (the most uncached tokens, or already late) are shed for cheaper ones; false: it is admitted, served "
        "after those that can still make theirs, counted missed.",
    )
    min_ttft_s: float | None = Field(
        default=None, gt=0,
        description="The tightest TTFT target a request may ask for with `x-tailguard-ttft-slo-ms` (a tighter "
        "ask is raised to it; an API key's `min_ttft_slo_ms` may allow tighter). None: no request may ask for "
        "a tighter target than `ttft_s`.",
    )

    def spec(self) -> fp.Slo:
        return fp.Slo(**self.model_dump())

    @model_validator(mode="after")
    def _floor_within_target(self) -> SloConfig:
        if self.min_ttft_s is not None and self.ttft_s is not None and self.min_ttft_s > self.ttft_s:
            raise ValueError(f"min_ttft_s ({self.min_ttft_s}) is above ttft_s ({self.ttft_s})")
        return self


class ClassConfig(_Model):
    """A named request class: its rank, caps and queue budgets."""

    name: str = Field(description="Class name, used in `X-Tailguard-Class`, metrics labels and logs.")
    rank: int = Field(
        default=_CLS.rank,
        description="Priority between classes: a lower rank is served first (strict priority, except while a "
        "later-ranked class is below its `min_share`).",
    )
    default_max_tokens: int | None = Field(
        default=_CLS.default_max_tokens, ge=1,
        description="`max_tokens` set on requests that carry none. When unset, `max_tokens_cap` (if any) "
        "is used instead, so a cap cannot be bypassed by leaving `max_tokens` out.",
    )
    max_tokens_cap: int | None = Field(
        default=_CLS.max_tokens_cap, ge=1,
        description="Largest `max_tokens` (or `max_completion_tokens`) a request of this class may ask for.",
    )
    cap_mode: CapMode = Field(
        default=_CLS.cap_mode,
        description="What happens to a request over `max_tokens_cap`: `clamp` lowers it to the cap, "
        "`reject` answers 400.",
    )
    max_prompt_tokens: int | None = Field(
        default=_CLS.max_prompt_tokens, ge=1,
        description="Largest estimated prompt (UTF-8 bytes / 4, or exact token ids) accepted; larger is a 400.",
    )
    max_queue_len: int = Field(
        default=_CLS.max_queue_len, ge=1,
        description="Requests of this class that may wait in the gateway at once; more are rejected "
        "with 503 `queue_full`. Bounds the gateway's memory.",
    )
    max_queue_wait_s: float = Field(
        default=_CLS.max_queue_wait_s, gt=0,
        description="Longest a request may wait in the gateway's queue. A request expected to wait longer "
        "is rejected on arrival (503 `wait_bound`); one that does wait this long leaves with 503 `queue_timeout`.",
    )
    max_share: float = Field(
        default=_CLS.max_share, gt=0, le=1,
        description="Fraction of each backend's `max_concurrency` that this class and every class ranked "
        "after it may occupy together (rounded down, at least one slot); the rest is kept for "
        "higher-ranked classes.",
    )
    min_share: float = Field(
        default=_CLS.min_share, ge=0, lt=1,
        description="Guaranteed fraction of the slots in use (rounded down) for this class while it has "
        "requests queued: when a slot frees and the class holds fewer, its next request goes before those "
        "of higher ranks, so a flood of higher-ranked work cannot starve it. 0 = no guarantee (strict "
        "priority). Used by `ranked-sjf`; at most `max_share`.",
    )
    preemptible: bool = Field(
        default=_CLS.preemptible,
        description="A running request of this class may be suspended to free its slot for a queued request "
        "of a lower rank (with `scheduler.fair_share`, also of another caller far below its share: "
        "`fair_preempt_gap`), and resumed later where it stopped (the client's connection stays open). Only on "
        "backends whose kind can continue a generation (`vllm`, `llamacpp`, `sim`).",
    )
    start_interval_s: float = Field(
        default=_CLS.start_interval_s, ge=0,
        description="At most one request of this class starts (or resumes) on a backend per this many "
        "seconds, so their prefills land in different engine steps instead of one long step a chat waits "
        "behind (docs/batch.md). About one engine step (`tailguard bench`: the decode step time). 0 = unpaced.",
    )

    pools: list[str] = Field(
        default_factory=list,
        description="Backend pools its requests may use, tried in order (the first with a backend that has "
        "room wins), e.g. `[chat, shared]`. Empty: every pool.",
    )
    slo: SloConfig | None = Field(
        default=None,
        description="Its service-level objective (docs/slo.md): `ttft_s`, `tpot_s`, `e2e_s`, `shed`, `min_ttft_s`. "
        "`interactive` has `ttft_s: 2.0` by default; null: no target (ordered and refused by `max_queue_wait_s` "
        "alone, as before targets existed).",
    )

    def spec(self) -> fp.ClassSpec:
        """The same fields: a class is the front's to interpret."""
        return fp.ClassSpec(**{**self.model_dump(exclude={"slo"}), "pools": tuple(self.pools),
                               "slo": None if self.slo is None else self.slo.spec()})

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _CLASS_NAME.match(v):
            raise ValueError(f"class name {v!r} may only hold letters, digits, '_', '.' and '-'")
        return v

    @model_validator(mode="after")
    def _min_within_max_share(self) -> ClassConfig:
        if self.min_share > self.max_share:
            raise ValueError(f"min_share ({self.min_share}) is above max_share ({self.max_share})")
        return self

    @model_validator(mode="after")
    def _default_within_cap(self) -> ClassConfig:
        if (
            self.default_max_tokens is not None
            and self.max_tokens_cap is not None
            and self.default_max_tokens > self.max_tokens_cap
        ):
            raise ValueError(
                f"default_max_tokens ({self.default_max_tokens}) is above max_tokens_cap ({self.max_tokens_cap})"
            )
        return self


def default_classes() -> list[ClassConfig]:
    """`interactive` first; `batch` capped and preemptible, with every slot open to it; then
    `embeddings`, the pooling routes' class (`POOLING_CLASS`).

    Without preemption a burst of long batch jobs fills every slot and a chat waits for one of
    them to finish (seconds): the tail this gateway exists to remove. Reserving slots for chats
    trades that against batch throughput and latency, and no share meets both on the seed mix
    (docs/configuration.md). Suspending a batch job for a waiting chat and resuming it later costs
    one re-prefill instead, so batch may use the whole engine (benchmarks/results/seed_des.md).
    """
    return [*(ClassConfig(**asdict(c)) for c in fp.default_classes()),
            ClassConfig(name=POOLING_CLASS, rank=2, max_queue_len=10000, max_queue_wait_s=600.0, max_share=0.5,
                        min_share=0.25)]


# The class of the pooling and tokenizer routes (`GatewayConfig.pooling_class`): ranked after
# batch (a rank of its own, so its share bounds it alone and batch's slots are as they were), on
# at most half of each backend's slots and sure of a quarter of those in use while it waits, so a
# retrieval batch neither crowds out chat nor starves behind batch.
POOLING_CLASS = "embeddings"
