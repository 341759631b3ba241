"""What the servers' own `/metrics` said during a run, reduced to the few numbers the rules read
(pure, no I/O). Samples are `{(name, sorted labels): value}` maps, one per snapshot, oldest first;
`doctor/metrics.py` parses them from Prometheus text. Counters are read as last minus first
snapshot (what happened during the run), gauges as their mean and max over the snapshots.

Engine names are vLLM's (the simulator exports the same); gateway names are `tailguard_*`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


def _total(s: Samples, name: str, **match: str) -> float | None:
    """Sum of every sample named `name` whose labels include `match`; None if there is none."""
    vals = [v for (n, labels), v in s.items() if n == name and all((k, m) in labels for k, m in match.items())]
    return sum(vals) if vals else None


def delta(snaps: Sequence[Samples], name: str, **match: str) -> float | None:
    first, last = _total(snaps[0], name, **match), _total(snaps[-1], name, **match)
    if last is None:
        return None
    return last - (first or 0.0) if len(snaps) > 1 else last


def gauge(snaps: Sequence[Samples], name: str, **match: str) -> list[float]:
    return [v for v in (_total(s, name, **match) for s in snaps) if v is not None]


def _mean_of_hist(snaps: Sequence[Samples], name: str) -> float | None:
    total, count = delta(snaps, f"{name}_sum"), delta(snaps, f"{name}_count")
    return total / count if total is not None and count else None


def _label_deltas(snaps: Sequence[Samples], name: str, label: str) -> dict[str, float]:
    values = {dict(labels).get(label, "") for (n, labels) in snaps[-1] if n == name}
    out = {v: delta(snaps, name, **{label: v}) or 0.0 for v in values}
    return {k: v for k, v in out.items() if v}


@dataclass(frozen=True)
class EngineEvidence:
    snapshots: int
    running_max: float | None
    waiting_mean: float | None
    waiting_max: float | None
    kv_usage_max: float | None
    preemptions: float | None
    prefix_queried_tokens: float | None
    prefix_hit_tokens: float | None
    queue_time_mean_s: float | None
    prefill_time_mean_s: float | None
    successes: float | None

    @property
    def prefix_hit_rate(self) -> float | None:
        q, h = self.prefix_queried_tokens, self.prefix_hit_tokens
        return h / q if q and h is not None else None


@dataclass(frozen=True)
class GatewayEvidence:
    snapshots: int
    outcomes: dict[str, float]  # requests ended during the run, by outcome
    rejected: dict[str, float]  # by reason
    preemptions: float | None
    engine_waiting_max: float | None  # the engine's own queue, as the gateway's health probes read it


def is_engine(s: Samples) -> bool:
    return any(n == "vllm:num_requests_running" for n, _ in s)


def is_gateway(s: Samples) -> bool:
    return any(n.startswith("tailguard_requests") for n, _ in s)


def engine_evidence(snaps: Sequence[Samples]) -> EngineEvidence | None:
    """What an engine's `/metrics` snapshots taken during a run show (None without any); a DES
    run models the same from its own record (`sweep.virtual.modelled_engine_evidence`)."""
    if not snaps:
        return None
    running, waiting = gauge(snaps, "vllm:num_requests_running"), gauge(snaps, "vllm:num_requests_waiting")
    kv = gauge(snaps, "vllm:kv_cache_usage_perc") or gauge(snaps, "vllm:gpu_cache_usage_perc")
    return EngineEvidence(
        snapshots=len(snaps),
        running_max=max(running) if running else None,
        waiting_mean=sum(waiting) / len(waiting) if waiting else None,
        waiting_max=max(waiting) if waiting else None,
        kv_usage_max=max(kv) if kv else None,
        preemptions=delta(snaps, "vllm:num_preemptions_total"),
        prefix_queried_tokens=delta(snaps, "vllm:prefix_cache_queries_total"),
        prefix_hit_tokens=delta(snaps, "vllm:prefix_cache_hits_total"),
        queue_time_mean_s=_mean_of_hist(snaps, "vllm:request_queue_time_seconds"),
        prefill_time_mean_s=_mean_of_hist(snaps, "vllm:request_prefill_time_seconds"),
        successes=delta(snaps, "vllm:request_success_total"),
    )


def gateway_evidence(snaps: Sequence[Samples]) -> GatewayEvidence | None:
    if not snaps:
        return None
    return GatewayEvidence(
        snapshots=len(snaps),
        outcomes=_label_deltas(snaps, "tailguard_requests_total", "outcome"),
        rejected=_label_deltas(snaps, "tailguard_rejected_total", "reason"),
        preemptions=delta(snaps, "tailguard_preemptions_total"),
        engine_waiting_max=max(waiting) if (waiting := gauge(snaps, "tailguard_backend_engine_requests",
                                                                 state="waiting")) else None,
    )
