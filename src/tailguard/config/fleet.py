"""The sections of the gateway's config on how requests spread over a fleet: `RoutingConfig`
(which backend of a pool takes a request), `EjectionConfig` (passive health: backends taken
out after failing requests in a row) and `HedgingConfig` (a second attempt for a slow start). Apart from the backends themselves (backends.py) because
they apply to every pool alike."""

from __future__ import annotations

from pydantic import Field

from tailguard.front import params as fp
from tailguard.config.base import _Model

_ROUTING = fp.RoutingParams()
_EJECTION = fp.EjectionParams()
_HEDGING = fp.HedgeParams()


class RoutingConfig(_Model):
    """Where a request goes among the backends that serve its model in its class's pools."""

    policy: fp.RoutingPolicy = Field(
        default=_ROUTING.policy,
        description="`prefix-affinity` (the default): requests that share a leading prompt (a system prompt, "
        "a conversation so far) go to the instance that served it, whose prefix cache holds it, unless it is "
        "loaded past the balance bound; a prompt no instance holds goes to the least loaded, so a workload "
        "with no shared prefixes is routed as `least-tokens`. `least-tokens`: the least estimated tokens in "
        "flight per unit of capacity (plus what the engine itself reports running and waiting beyond the "
        "gateway's own requests). `predicted-ttft`: the backend where the request's first token is predicted "
        "soonest (each backend's TTFT fitted online from its prefill, running requests and their tokens, a "
        "prefix hit priced as the prompt tokens it saves; docs/slo.md), as `prefix-affinity` until every "
        "backend's fit predicts. `p2c`: the lesser of two drawn at random. `round-robin`.",
    )
    min_prefix_share: float = Field(
        default=_ROUTING.min_prefix_share, gt=0, le=1,
        description="Share of a prompt's blocks an instance must have served for affinity to count.",
    )
    balance_factor: float = Field(
        default=_ROUTING.balance_factor, ge=1,
        description="Affinity holds while the instance's load is at most this times the least loaded's "
        "(plus `balance_slack`); past it, the least loaded takes the request.",
    )
    balance_slack: float = Field(
        default=_ROUTING.balance_slack, ge=0,
        description="Requests' worth of load (at the fleet's mean request size) allowed above the bound.",
    )
    index_blocks: int = Field(
        default=_ROUTING.index_blocks, ge=1,
        description="Prompt blocks (256 characters each) the prefix index remembers, least recently used "
        "dropped first: about 24 bytes each.",
    )
    engine_load_ttl_s: float = Field(
        default=_ROUTING.engine_load_ttl_s, gt=0,
        description="An engine's own load reading (read with the health probes) older than this counts as none.",
    )
    stale_after_s: float = Field(
        default=_ROUTING.stale_after_s, gt=0,
        description="A backend whose probes (or engine metrics) answered once and not since within this long "
        "counts as saturated: it gets a request only when no other backend may take it "
        "(`tailguard_backend_stale`).",
    )

    slow_factor: float = Field(
        default=_ROUTING.slow_factor, gt=1,
        description="A backend whose requests take more than this times its peers' median per token (over "
        "at least 3 requests, the latest within a minute) counts only a matching fraction of its slots: "
        "a slow host gets less work, never none.",
    )

    def params(self) -> fp.RoutingParams:
        return fp.RoutingParams(**self.model_dump())


class EjectionConfig(_Model):
    """Passive health, Envoy's outlier detection: backends whose requests fail in a row are taken
    out for a while, longer each time."""

    enabled: bool = Field(default=_EJECTION.enabled, description="Eject backends whose requests fail in a row.")
    consecutive_failures: int = Field(
        default=_EJECTION.consecutive_failures, ge=1,
        description="Failed attempts in a row that eject a backend: refused or timed-out connections, 5xx "
        "before streaming, a response head that never came (`timeouts.header_s`). An answered request resets "
        "the count. (Envoy's `consecutive_5xx` is 5; a fleet of a few engines cannot spare as many.)",
    )
    base_s: float = Field(
        default=_EJECTION.base_s, gt=0,
        description="Ejection time, multiplied by the times the backend has been ejected (Envoy's "
        "`base_ejection_time`).",
    )
    max_s: float = Field(default=_EJECTION.max_s, gt=0, description="Longest ejection.")
    max_ejected_share: float = Field(
        default=_EJECTION.max_ejected_share, gt=0, le=1,
        description="Share of a pool that may be ejected at once (one backend always may be).",
    )
    panic_threshold: float = Field(
        default=_EJECTION.panic_threshold, ge=0, le=1,
        description="When fewer than this share of the healthy backends a request may use are left in, "
        "ejections are ignored for it (Envoy's panic threshold): better a struggling host than none.",
    )

    def params(self) -> fp.EjectionParams:
        return fp.EjectionParams(**self.model_dump())


class HedgingConfig(_Model):
    """Hedged requests ("The Tail at Scale"): a request of a hedged class with no first token after
    its class's recent TTFT quantile goes to a second backend too; the first to stream wins."""

    enabled: bool = Field(default=_HEDGING.enabled, description="Hedge requests of `classes` (off by default).")
    classes: list[str] = Field(default_factory=lambda: list(_HEDGING.classes),
                               description="The classes whose requests are hedged.")
    quantile: float = Field(
        default=_HEDGING.quantile, gt=0, lt=1,
        description="The quantile of the class's recent TTFTs on their backends (from the start upstream to "
        "the first content) after which a request with no content is hedged.",
    )
    factor: float = Field(default=_HEDGING.factor, gt=0, description="Times the quantile: the hedge delay.")
    min_delay_s: float = Field(default=_HEDGING.min_delay_s, ge=0, description="The hedge delay's floor.")
    min_samples: int = Field(
        default=_HEDGING.min_samples, ge=1,
        description="TTFTs the class must have before any of its requests is hedged.",
    )
    max_share: float = Field(
        default=_HEDGING.max_share, gt=0, le=1,
        description="Hedges may be at most this share of the class's requests of the last 10 s: a fleet slow "
        "everywhere is not sent twice its load.",
    )

    def params(self) -> fp.HedgeParams:
        return fp.HedgeParams(enabled=self.enabled, classes=tuple(self.classes), quantile=self.quantile,
                              factor=self.factor, min_delay_s=self.min_delay_s, min_samples=self.min_samples,
                              max_share=self.max_share)
