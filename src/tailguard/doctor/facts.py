"""The numbers doctor's rules read, computed once from a run's records and summary (pure, no I/O).

Per class: sizes, failures by kind, the slowest 1%'s attribution, and the median request's share
of time spent queued; for the run: the pooled median ITL, whether a gateway was in front and what
it was told (its recorded settings), what the workload declared (shared system prompts), and
where the run is, so the commands doctor proposes name it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from tailguard.bench.attribution import mean_parts, slowest
from tailguard.bench.configs import run_config
from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import measured

QUEUE_PARTS = ("gateway_queue_s", "engine_queue_s")
TTFT_PARTS = ("dispatch_s", "gateway_queue_s", "engine_queue_s", "prefill_s")


def share(parts: dict[str, float], keys: Sequence[str], of: Sequence[str] | None = None) -> float:
    """Fraction of `of` (default: all parts) spent in `keys`."""
    total = sum(parts[k] for k in of) if of is not None else sum(parts.values())
    return sum(parts[k] for k in keys) / total if total > 0 else 0.0


@dataclass(frozen=True)
class ClassFacts:
    name: str
    count: int
    ok: int
    timeouts: int
    rejected: int  # 429 and 503 answers
    e2e_p50: float | None
    e2e_p99: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    itl_p50: float | None
    itl_p99: float | None
    tpot_p50: float | None
    tpot_p99: float | None
    max_tokens: float  # median asked
    tail: dict[str, float]  # mean attribution of the slowest 1% by E2E
    ttft_tail: dict[str, float]  # mean attribution of the slowest 1% by TTFT (streams that got a token)
    median_queue_share: float  # of the median request's E2E spent queued (gateway + engine)
    median_gateway_share: float
    median_gateway_s: float  # the median request's wait in the gateway
    others_in_flight_at_tail: float  # other classes' requests in flight when the slowest 1% were sent
    records: tuple[RequestRecord, ...]
    server_class: str | None = None  # the gateway's class for it (X-Tailguard-Class), most often seen

    def ratio(self, metric: str) -> float | None:
        p50, p99 = getattr(self, f"{metric}_p50"), getattr(self, f"{metric}_p99")
        return p99 / p50 if p50 and p99 is not None else None


@dataclass(frozen=True)
class Backend:
    name: str
    url: str
    kind: str
    max_concurrency: int


@dataclass(frozen=True)
class GatewayView:
    """What the run's gateway was told, from the settings the bench recorded (`GET /config`):
    read before proposing a change, so doctor does not propose what is on already and fills its
    commands with the values that ran."""

    ranks: dict[str, int]  # gateway class -> rank (lower is served first)
    preemptible: frozenset[str]
    preemption: bool
    policy: str
    backends: tuple[Backend, ...]

    @classmethod
    def of(cls, settings: dict[str, Any] | None) -> GatewayView | None:
        if not settings:
            return None
        sched = settings.get("scheduler") or {}
        classes = settings.get("classes") or []
        return cls(
            ranks={c["name"]: int(c.get("rank", 0)) for c in classes},
            preemptible=frozenset(c["name"] for c in classes if c.get("preemptible")),
            preemption=bool(sched.get("preemption")), policy=str(sched.get("policy", "ranked-sjf")),
            backends=tuple(Backend(b["name"], b["url"], b.get("kind") or "auto", int(b.get("max_concurrency") or 0))
                           for b in settings.get("backends") or []))

    def waits_by_design(self, low: ClassFacts, high: ClassFacts) -> bool:
        """`low` is a class the gateway was told to serve after `high` (a higher rank)."""
        if low.server_class is None or high.server_class is None:
            return False
        ranks = self.ranks
        return low.server_class in ranks and high.server_class in ranks and ranks[low.server_class] > ranks[high.server_class]


@dataclass(frozen=True)
class RunFacts:
    classes: dict[str, ClassFacts]
    itl_p50: float | None  # pooled over every class
    behind_gateway: bool
    valid: bool
    validity_reason: str | None
    meta: dict[str, Any]
    summary: dict[str, Any]
    gateway: GatewayView | None = None
    run_dir: str = "."  # the run's folder, as the user named it

    @property
    def requests(self) -> int:
        return sum(c.count for c in self.classes.values())


def _p(group: dict[str, Any], metric: str, q: str) -> float | None:
    v = group.get(metric, {}).get(q)
    return float(v) if isinstance(v, (int, float)) else None


def _in_flight_at(t: float, others: Sequence[RequestRecord]) -> int:
    return sum(1 for r in others if r.sent_at <= t < r.ended_at)


def _median_share(recs: Sequence[RequestRecord], keys: Sequence[str]) -> float:
    shares = [share(r.attribution or {}, keys) for r in recs if r.attribution and r.e2e_s > 0]
    return median(shares) if shares else 0.0


def class_facts(name: str, recs: list[RequestRecord], everyone: Sequence[RequestRecord],
                group: dict[str, Any]) -> ClassFacts:
    tail = slowest(recs)
    streams = [r for r in recs if r.stream and r.first_token_at is not None]
    ttft_tail = sorted(streams, key=lambda r: r.first_token_at - r.scheduled_at, reverse=True)  # type: ignore[operator]
    others = [r for r in everyone if r.cls != name]
    return ClassFacts(
        name=name, count=len(recs), ok=sum(r.ok for r in recs),
        timeouts=sum(r.timed_out for r in recs),
        rejected=sum(r.status in (429, 503) for r in recs),
        e2e_p50=_p(group, "e2e_s", "p50"), e2e_p99=_p(group, "e2e_s", "p99"),
        ttft_p50=_p(group, "ttft_s", "p50"), ttft_p99=_p(group, "ttft_s", "p99"),
        itl_p50=_p(group, "itl_s", "p50"), itl_p99=_p(group, "itl_s", "p99"),
        tpot_p50=_p(group, "tpot_s", "p50"), tpot_p99=_p(group, "tpot_s", "p99"),
        max_tokens=median([r.max_tokens for r in recs]) if recs else 0.0,
        tail=mean_parts(tail), ttft_tail=mean_parts(ttft_tail[:len(slowest(streams))]),
        median_queue_share=_median_share([r for r in recs if r.ok], QUEUE_PARTS),
        median_gateway_share=_median_share([r for r in recs if r.ok], ("gateway_queue_s",)),
        median_gateway_s=median([(r.attribution or {}).get("gateway_queue_s", 0.0) for r in recs]) if recs else 0.0,
        others_in_flight_at_tail=(sum(_in_flight_at(r.sent_at, others) for r in tail) / len(tail)) if tail else 0.0,
        records=tuple(recs),
        server_class=next(iter(Counter(r.server_class for r in recs if r.server_class).most_common(1)), (None,))[0],
    )


def run_facts(records: Sequence[RequestRecord], meta: dict[str, Any], summary: dict[str, Any],
              run_dir: str = ".") -> RunFacts:
    """`records` carry their attribution (`bench.attribution.attribute_all`)."""
    rec = measured(records)
    classes = {name: class_facts(name, [r for r in rec if r.cls == name], rec, group)
               for name, group in summary["classes"].items()}
    gaps = [b - a for r in rec for a, b in zip(r.chunk_at, r.chunk_at[1:])]
    v = summary.get("validity", {})
    return RunFacts(
        classes=classes, itl_p50=median(gaps) if gaps else None,
        behind_gateway=sum(r.queue_ms is not None or bool(r.server_timing_s) for r in rec) > len(rec) / 2,
        valid=bool(v.get("valid", True)), validity_reason=v.get("reason"), meta=meta, summary=summary,
        gateway=GatewayView.of((run_config(rec, meta) or {}).get("settings")), run_dir=run_dir,
    )


def shared_prefix_share(meta: dict[str, Any]) -> dict[str, float]:
    """Per workload class with a shared system prompt, the prompt fraction it makes up (its tokens
    over the class's typical prompt size, as the workload declared them)."""
    out: dict[str, float] = {}
    for c in (meta.get("workload") or {}).get("classes", []):
        sp = c.get("system_prompt") or {}
        if sp.get("shared") and sp.get("tokens"):
            pt = c.get("prompt_tokens")
            size = pt if isinstance(pt, (int, float)) else (pt or {}).get("median") or (pt or {}).get("value") \
                or (((pt or {}).get("low", 0) + (pt or {}).get("high", 0)) / 2) or sp["tokens"]
            out[c["name"]] = min(1.0, sp["tokens"] / max(float(size), float(sp["tokens"])))
    return out
