"""A bench run on virtual time: a workload's seeded requests through the discrete-event simulator,
straight to the engine or behind the gateway's own policies, returned as the bench's records so
every statistic, attribution and doctor rule reads it exactly as it reads an HTTP run.

`simulate` is the one call into the DES (and the only place that builds the gateway's policies
for it); `IntakeGate` lets each request in as the gateway's intake would, so a run models the
gateway its config describes: the same classes, refusals, caps and job sizes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from tailguard.bench.recorder import RequestRecord
from tailguard.bench.trace.plan import Replay, TraceFactory
from tailguard.bench.stream import request_fields
from tailguard.bench.workload import DEFAULT_MAX_TOKENS, RequestClass, Workload
from tailguard.doctor.evidence import EngineEvidence
from tailguard.errors import BadRequest
from tailguard.front.identity import ProgramFinder
from tailguard.front.intake import NO_CLASS, Asked, Intake, OutputEstimator, Refused
from tailguard.gateway.classes import answer
from tailguard.wire.headers import agent_session, bearer_key, class_header, session_header, ttft_slo_header
from tailguard.front.params import OutputEstimateParams
from tailguard.config import GatewayConfig
from tailguard.sim.cost import EngineConfig
from tailguard.sim.request import block_keys, output_budget
from tailguard.types import Outcome
from tailguard.wire.openai import Endpoint, ParsedRequest, parse_request, validate_body

if TYPE_CHECKING:
    from tailguard.sim.scenario import Arrival, Timeline
    from tailguard.sim.engine import Engine

ENGINE = "engine"  # the one engine's name when no gateway names it
DES_URL = f"des://{ENGINE}"


@dataclass(frozen=True)
class VirtualRun:
    """One run: `concurrency` clients (closed loop) or Poisson arrivals at `rate` (open loop), for
    `requests` requests, or a trace's own arrivals and sizes (`trace`: its workload and length are
    the trace's); `gateway` None sends them straight to the engine."""

    engine: EngineConfig
    workload: Workload
    requests: int
    gateway: GatewayConfig | None = None
    concurrency: int | None = None
    rate: float | None = None
    seed: int = 0
    trace: Replay | None = None

    @classmethod
    def of_trace(cls, engine: EngineConfig, replay: Replay, gateway: GatewayConfig | None = None,
                 seed: int = 0) -> VirtualRun:
        return cls(engine, TraceFactory(replay).workload, len(replay.requests), gateway, seed=seed, trace=replay)


@dataclass(frozen=True, slots=True)
class Planned:
    """One request as the workload draws it: what the bench sends (`body` holds all of it but the
    prompt's text, which is empty: only its size, `prompt_tokens`, matters here)."""

    id: str
    at: float
    endpoint: Endpoint
    body: dict[str, Any]
    headers: Mapping[str, str]
    prompt_tokens: int
    max_tokens: int  # as drawn (what the bench records it asked for)
    block_hashes: tuple[int, ...] = ()  # its prompt's prefix-cache keys, where its text is shared (a trace's blocks)


def plan(rid: str, at: float, endpoint: Endpoint, wc: RequestClass, prompt_tokens: int, max_tokens: int) -> Planned:
    """The request the bench sends for a draw of workload class `wc`, but for its prompt's text."""
    prompt: dict[str, Any] = {"messages": [{"role": "user", "content": ""}]} if endpoint == "chat" else {"prompt": ""}
    return Planned(rid, at, endpoint, {**prompt, **request_fields(wc, max_tokens)}, wc.headers, prompt_tokens,
                   max_tokens)


class IntakeGate:
    """What stands before the DES's front (`sim.scenario.Gate`): each planned request read as the
    gateway of `gateway` reads it (body validated, then its intake: class, caller, caps, job size
    with the output estimate of that instant, resumable) and as the simulator would take it (its
    output budget, its refusals). Without a gateway, only the simulator's part. Each request that
    ends well feeds the output estimate, as in `tailguard serve`.

        gate = IntakeGate(engine_cfg, gateway)
        timelines = run(engine, [gate.arrival(p) for p in planned], clock, front, gate=gate)
    """

    def __init__(self, engine: EngineConfig, gateway: GatewayConfig | None) -> None:
        self.engine = engine
        self.intake = Intake(gateway.intake_params()) if gateway is not None else None
        # Programs as the gateway names them (a session header, a body field); the DES's bodies carry
        # no prompt text, so nothing is inferred from one.
        self.programs = None if gateway is None else ProgramFinder(replace(gateway.programs.params(), infer=False))
        self.estimator = OutputEstimator(
            gateway.scheduler.output_estimate.params() if gateway is not None else OutputEstimateParams())
        self._planned: dict[str, Planned] = {}

    def arrival(self, p: Planned, at: float | None = None) -> Arrival:
        """`p` as the DES's arrival: what it asks of the front is decided when it comes (`admit`)."""
        from tailguard.sim.scenario import Arrival

        self._planned[p.id] = p
        return Arrival(p.id, p.at if at is None else at, p.prompt_tokens, p.max_tokens, cls=NO_CLASS,
                       block_hashes=p.block_hashes)

    def admit(self, a: Arrival) -> Arrival:
        p = self._planned.pop(a.id)
        try:
            sent = replace(validate_body(p.body, p.endpoint), prompt_tokens=p.prompt_tokens)
            if self.intake is not None:
                asked = Asked.of(sent, class_header(p.headers), bearer_key(p.headers), ttft_slo_header(p.headers))
                cls = self.intake.classify(asked)
                a = replace(a, cls=cls.name, caller=self.intake.caller(asked.api_key))
                accepted = self.intake.accept(asked, cls, self.estimator.estimate(cls.name))
                a = replace(a, accepted=accepted, model=accepted.model, program=self._program(sent, p, a))
                sent = replace(sent, body=accepted.body, max_tokens=accepted.max_tokens)
            return replace(a, max_tokens=output_budget(self.engine, sent))
        except Refused as r:  # refused by the gateway's intake: a 400, or a 403 (a key asking for a
            return replace(a, refused=r.code, refused_status=answer(r).status)  # class or model it may not have)
        except BadRequest as e:  # refused by the gateway's parser or, later, by the engine: a 400 either way
            return replace(a, refused=e.code or e.type)

    def _program(self, sent: ParsedRequest, p: Planned, a: Arrival) -> str | None:
        """The program the gateway would find for `p` (`front.identity`), or None."""
        assert self.programs is not None
        found = self.programs.find(sent, a.caller, session_header(p.headers), agent_session(p.headers), a.at)
        return None if found is None else found.id

    def finished(self, tl: Timeline) -> None:
        self.estimator.observe(tl.cls, tl.output_tokens)


def simulate(engine_cfg: EngineConfig, gateway: GatewayConfig | None, planned: list[Planned],
             follow_up: Callable[[str, float], Planned | None] | None) -> tuple[list[Timeline], list[Engine]]:
    """The one call into the DES: the gateway's intake and front (queue, slot shares,
    preemption, routing, retries, as `tailguard serve` builds them from `gateway`) in front of
    one engine per backend the config names, each taken as one that can continue a generation (the
    simulator can). `follow_up(ended_id, now)` may send the next request of a closed loop; a
    client whose request was refused sends it when the `Retry-After` it was given has passed."""
    from tailguard.clock import VirtualClock
    from tailguard.front.front import Front
    from tailguard.sim.des import run_fleet
    from tailguard.sim.scenario import Host, Timeline
    from tailguard.sim.engine import Engine

    gate = IntakeGate(engine_cfg, gateway)

    def follow(tl: Timeline, now: float) -> Arrival | None:
        assert follow_up is not None
        nxt = follow_up(tl.id, now)
        if nxt is None:
            return None
        wait = tl.retry_after_s if tl.outcome is Outcome.REJECTED else None
        return gate.arrival(nxt, None if wait is None else now + wait)

    backends = gateway.backends if gateway is not None else []
    hosts = ([Host(b.name, Engine(engine_cfg), models=tuple(b.models or ())) for b in backends]
             or [Host(ENGINE, Engine(engine_cfg))])
    front = Front(gateway.front_params({h.name: True for h in hosts})) if gateway is not None else None
    timelines = run_fleet(hosts, [gate.arrival(p) for p in planned], VirtualClock(), front, record_tokens=True,
                          follow_up=follow if follow_up is not None else None, gate=gate)
    return timelines, [h.engine for h in hosts]


class _Source:
    """The workload's requests as the bench would send them: class picked by weight, sizes drawn."""

    def __init__(self, vr: VirtualRun) -> None:
        self.vr = vr
        self.rng = random.Random(vr.seed)
        self.wl = vr.workload.classes
        self.weights = [c.weight for c in self.wl]
        self.wl_class: dict[str, str] = {}
        self.sent = 0

    def next(self, at: float) -> Planned:
        wc = self.rng.choices(self.wl, self.weights)[0]
        max_tokens = wc.max_tokens.sample(self.rng) if wc.max_tokens is not None else DEFAULT_MAX_TOKENS
        rid = f"{wc.name}-{self.sent}"
        self.wl_class[rid] = wc.name
        self.sent += 1
        return plan(rid, at, self.vr.workload.endpoint, wc, wc.prompt_tokens.sample(self.rng), max_tokens)


def _planned(vr: VirtualRun, src: _Source) -> tuple[list[Planned], Callable[[str, float], Planned | None] | None]:
    if vr.concurrency is not None:
        def follow(_ended: str, now: float) -> Planned | None:
            return src.next(now) if src.sent < vr.requests else None
        return [src.next(0.0) for _ in range(min(vr.concurrency, vr.requests))], follow
    assert vr.rate is not None
    t, out = 0.0, []
    for _ in range(vr.requests):
        t += src.rng.expovariate(vr.rate)
        out.append(src.next(t))
    return out, None


def trace_planned(replay: Replay, engine: EngineConfig, seed: int = 0) -> list[Planned]:
    """A trace's requests as the bench would send them (`TraceFactory`: the same classes,
    headers, body fields and sizes), with the prefix-cache keys the simulator would compute from
    their text where the trace shares blocks and the engine caches prefixes; the text itself is
    dropped once keyed (a long trace's prompts never all in memory)."""
    factory = TraceFactory(replay, seed=seed)
    keyed = engine.enable_prefix_caching and replay.trace.block_tokens > 0
    out = []
    for i, r in enumerate(replay.requests):
        req = factory.make(i)
        hashes: tuple[int, ...] = ()
        if keyed and r.hash_ids:
            hashes = block_keys(engine, parse_request(req.body, req.endpoint), req.max_tokens)
        body = orjson.loads(req.body)
        if "messages" in body:
            body["messages"] = [{"role": "user", "content": ""}]
        else:
            body["prompt"] = ""
        out.append(Planned(f"{req.cls}-{i}", r.at, req.endpoint, body, dict(req.headers), req.prompt_tokens,
                           req.max_tokens, hashes))
    return out


def record_of(i: int, tl: Timeline, cls: str, behind_gateway: bool) -> RequestRecord:
    """A DES timeline as the bench would have recorded it (times from the arrival, which is the
    scheduled send: the DES has no generator lag)."""
    ok = tl.outcome is Outcome.SUCCESS
    end = tl.finished_at if tl.finished_at is not None else tl.arrived_at
    queue_ms = None
    if behind_gateway:
        queue_ms = 1000.0 * ((tl.dispatched_at if tl.dispatched_at is not None else end) - tl.arrived_at)
    return RequestRecord(
        index=i, cls=cls, warmup=False, scheduled_at=tl.arrived_at, sent_at=tl.arrived_at, ended_at=end,
        status=200 if ok else tl.status or 503, ok=ok,  # a client error's own (400, 403); else the front's 503
        error_kind=None if ok else "http", error=None if ok else tl.reject_reason,
        first_token_at=tl.first_token_at, chunk_at=list(tl.token_times or []), output_tokens=tl.output_tokens,
        usage_output_tokens=tl.output_tokens, prompt_tokens=tl.prompt_tokens, max_tokens=tl.max_tokens,
        queue_ms=queue_ms, backend=tl.backend if behind_gateway else None,
        server_class=tl.cls if behind_gateway and tl.cls != NO_CLASS else None,  # its X-Tailguard-Class
    )


def modelled_engine_evidence(timelines: list[Timeline], engines: list[Engine]) -> EngineEvidence:
    """What the engines' /metrics would have shown over the run, summed over a fleet, modelled
    from the DES's own record (`doctor.evidence.engine_evidence` reads it from a real engine's
    pages): the engines' queue is each request's wait from dispatch to admission (Little's law
    gives its time-average length)."""
    waits = [(tl.dispatched_at if tl.dispatched_at is not None else tl.arrived_at, tl.admitted_at)
             for tl in timelines if tl.admitted_at is not None]
    span = max((tl.finished_at or 0.0) for tl in timelines) - min(tl.arrived_at for tl in timelines)
    events = sorted([(a, 1) for a, _ in waits] + [(b, -1) for _, b in waits])
    depth = peak = 0
    for _, d in events:
        depth += d
        peak = max(peak, depth)
    queued = sum(b - a for a, b in waits)
    return EngineEvidence(
        snapshots=len(timelines), running_max=float(sum(e.config.max_num_seqs for e in engines)),
        waiting_mean=queued / span if span > 0 else 0.0, waiting_max=float(peak), kv_usage_max=None,
        preemptions=float(sum(e.preemptions_total for e in engines)),
        prefix_queried_tokens=float(sum(e.prefix_queried_tokens_total for e in engines)),
        prefix_hit_tokens=float(sum(e.prefix_hit_tokens_total for e in engines)),
        queue_time_mean_s=queued / len(waits) if waits else None, prefill_time_mean_s=None,
        successes=float(sum(tl.outcome is Outcome.SUCCESS for tl in timelines)),
    )


def run_virtual(vr: VirtualRun) -> tuple[list[RequestRecord], dict[str, Any], EngineEvidence]:
    """Run `vr` on virtual time: the bench's records, a run.json-like description, and the
    engine's evidence for `tailguard doctor`."""
    follow: Callable[[str, float], Planned | None] | None = None
    if vr.trace is not None:
        planned = trace_planned(vr.trace, vr.engine, vr.seed)
        wl_class = {p.id: c.name for p, c in zip(planned, vr.trace.classes)}
    else:
        src = _Source(vr)
        planned, follow = _planned(vr, src)
        wl_class = src.wl_class
    timelines, engines = simulate(vr.engine, vr.gateway, planned, follow)
    records = [record_of(i, tl, wl_class[tl.id], vr.gateway is not None) for i, tl in enumerate(timelines)]
    meta: dict[str, Any] = {
        "url": DES_URL, "mode": "closed" if vr.concurrency is not None else "open",
        "concurrency": vr.concurrency, "rate": vr.rate, "requests": vr.requests, "seed": vr.seed,
        "workload": vr.workload.model_dump(mode="json"), "slo": vr.workload.slos(), "time_scale": 1.0,
        "max_dispatch_lag_s": 0.005, "loop_lag_s": {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0},
        "times_in": "simulated seconds (discrete-event run)",
        # what a bench run records from the gateway's /config, so doctor reads what the front was told
        "gateway_config": None if vr.gateway is None else {
            "hash": vr.gateway.digest(), "n": None, "settings": vr.gateway.settings()},
    }
    if vr.trace is not None:
        meta["trace"] = TraceFactory(vr.trace).describe()
    return records, meta, modelled_engine_evidence(timelines, engines)
