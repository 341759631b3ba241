"""What the gateway tells operators on `/metrics`: `tailguard_*` Prometheus collectors on a
per-app registry, registered from the one table of metrics (`gateway.ops.catalog`), and what a
request's end adds to them (`record_finish`). The response headers are `gateway.ops.headers`',
the access log `gateway.ops.access`', the lock-free histograms `gateway.ops.histograms`'.

The registry is per app so two gateways in one process (tests, benchmarks) never share counters;
it carries the standard process, platform and GC collectors too, so memory and CPU are there.
Per-chunk work is one histogram observation through a label child fetched once per request.
"""

from __future__ import annotations

import logging
import platform
from typing import Any

import prometheus_client
from prometheus_client import (
    CollectorRegistry, Counter, Gauge, GCCollector, PlatformCollector, ProcessCollector, generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tailguard import __version__
from tailguard.front.capacity import Capacity
from tailguard.front.front import Front
from tailguard.front.intake import NO_CLASS
from tailguard.front.retry import Again, continues_after, hurts_health, retry_of
from tailguard.gateway.ops.catalog import METRICS, MetricSpec
from tailguard.gateway.ops.histograms import ChunkHistograms
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.metering import CallerLabels
from tailguard.gateway.request import Ended, Request
from tailguard.slo import judge
from tailguard.types import FailureKind, Outcome, RejectReason

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
# gen_ai.token.modality of a request's prompt and of its output. Engines give one usage count, not
# one per modality: a chat prompt may hold images, so its modality is not known (the conventions'
# `unknown`); a completions prompt and every answer of these routes are text.
INPUT_MODALITY = {"completions": "text"}
UNKNOWN_PROVIDER = "unknown"  # gen_ai.provider.name is required: a backend whose kind is not known yet
# gen_ai.operation.name of each endpoint (OpenTelemetry GenAI conventions).
GENAI_OPERATION = {"chat": "chat", "completions": "text_completion", "responses": "chat", "messages": "chat",
                   "embeddings": "embeddings", "rerank": "rerank", "score": "score", "tokenize": "tokenize",
                   "detokenize": "detokenize"}
# Failure kinds the front may send again (of an attempt that delivered nothing and was never
# answered): the retry counters' label values.
RETRYABLE = tuple(k for k in FailureKind if retry_of(k, delivered=False, answered=False) is not Again.NO)
MIGRATING = tuple(k for k in FailureKind if continues_after(k, answered=True))  # a stream moved mid-answer
EJECTING = tuple(k for k in FailureKind if hurts_health(k, answered=False))  # failures that count to eject
CONNECTION_CLOSES = ("header_timeout", "evicted_idle", "over_cap")  # tailguard_connections_closed{reason}
HEDGE_OUTCOMES = ("sent", "won", "lost", "failed")  # tailguard_hedges{outcome}
HEALTH_CHANGES = ("unhealthy", "healthy", "ejected", "readmitted")  # tailguard_backend_health_changes{to}

# A `_created` series beside every counter is prometheus_client's default and nobody's habit: it
# doubles the series and Prometheus ignores it. The switch is process-wide; the gateway's process
# (and the simulator's, which serves the same habits) wants it off.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

log = logging.getLogger("tailguard.gateway")


class GenAIUsage:
    """One (operation, provider)'s token children of the GenAI families, bound once: a request
    that ends makes one dict lookup for them all (`GatewayMetrics.genai_usage`)."""

    __slots__ = ("input", "output", "usage_input", "usage_output", "spent_input", "spent_output")

    def __init__(self, m: GatewayMetrics, op: str, provider: str, input_modality: str) -> None:
        f = m.families
        self.input = f["gen_ai_client_inference_usage_input_tokens"].labels(op, provider)
        self.output = f["gen_ai_client_inference_usage_output_tokens"].labels(op, provider)
        self.usage_input = m.genai_tokens.labels(op, provider, "input")
        self.usage_output = m.genai_tokens.labels(op, provider, "output")
        self.spent_input = f["gen_ai_client_inference_usage_detailed_input_tokens"].labels(op, provider,
                                                                                            input_modality)
        self.spent_output = f["gen_ai_client_inference_usage_detailed_output_tokens"].labels(op, provider, "text")

    def record(self, prompt_tokens: int, output_tokens: int) -> None:
        """The tokens of one request an engine answered: its prompt, and its output if it made any."""
        if prompt_tokens:
            self.input.observe(prompt_tokens)
            self.usage_input.observe(prompt_tokens)
            self.spent_input.inc(prompt_tokens)
        if output_tokens:
            self.output.observe(output_tokens)
            self.usage_output.observe(output_tokens)
            self.spent_output.inc(output_tokens)


class ClassMetrics:
    """One class's label children, bound once so the request path skips `labels()` lookups."""

    __slots__ = ("queue_length", "queue_wait", "ttft", "itl", "e2e", "prompt_tokens", "output_tokens",
                 "_requests", "_parent", "_name")

    def __init__(self, m: GatewayMetrics, name: str) -> None:
        self._parent = m
        self._name = name
        self.queue_length = m.queue_length.labels(name)
        self.queue_wait = m.queue_wait.labels(name)
        self.ttft = m.ttft.labels(name)
        self.itl = m.itl.labels(name)
        self.e2e = m.e2e.labels(name)
        self.prompt_tokens = m.prompt_tokens.labels(name)
        self.output_tokens = m.output_tokens.labels(name)
        self._requests: dict[Outcome, Any] = {}

    def requests(self, outcome: Outcome) -> Any:
        c = self._requests.get(outcome)
        if c is None:
            c = self._requests[outcome] = self._parent.requests.labels(self._name, outcome.value)
        return c


def _collector(spec: MetricSpec, registry: CollectorRegistry) -> Any:
    """The collector `spec` describes. Histograms are lock-free (`ChunkHistograms`):
    prometheus_client's takes a lock per bucket and per sum, a share of a request's fixed cost."""
    if spec.kind == "histogram":
        return ChunkHistograms(spec, registry)
    make = Counter if spec.kind == "counter" else Gauge
    return make(spec.name, spec.help, list(spec.labels), registry=registry)


class GatewayMetrics:
    """All `tailguard_*` collectors of one gateway app, one per `catalog.METRICS` entry.

        m = GatewayMetrics()
        m.cls("interactive").requests(Outcome.SUCCESS).inc()
        body = m.render()      # the /metrics payload
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.families: dict[str, Any] = {spec.name: _collector(spec, r) for spec in METRICS}
        f = self.families
        self._bind_requests(f)
        self._bind_backends(f)
        self._bind_usage(f)
        f["tailguard_build_info"].labels(__version__, platform.python_version()).set(1)
        for reason in CONNECTION_CLOSES:  # at 0 from the start, so rate() sees the first one
            self.connections_closed.labels(reason)
        # The capacity signal per pool (`front.capacity`, the same code the DES's autoscaler reads).
        self.capacity = Capacity()
        self._pools: set[str] = set()  # pools whose capacity gauges are set
        self._class_counters = ((self.requests, tuple(Outcome)), (self.rejected, tuple(RejectReason)),
                                (self.migrations, MIGRATING), (self.hedges, HEDGE_OUTCOMES))
        self._backend_counters = ((self.upstream_errors, tuple(FailureKind)), (self.retries, RETRYABLE),
                                  (self.retries_denied, RETRYABLE), (self.health_changes, HEALTH_CHANGES),
                                  (self.ejections, EJECTING))
        self._zeroed_classes: set[str] = set()
        self._zeroed_backends: set[str] = set()
        self._bounded: set[str] = set()  # classes whose bound and limit gauges are set
        self._config: tuple[str, str] | None = None
        self._classes: dict[str, ClassMetrics] = {}
        self._inflight: dict[str, Any] = {}
        self._kinds: dict[str, str] = {}
        self._genai: dict[tuple[str, str], GenAIUsage] = {}
        self._guard_seconds: dict[tuple[str, str], Any] = {}
        self._guard_checks: dict[tuple[str, str, str], Any] = {}

    def _bind_requests(self, f: dict[str, Any]) -> None:
        """The families of requests by class: queues, latencies, sizes, outcomes and refusals."""
        self.queue_length = f["tailguard_queue_length"]
        self.queue_wait: ChunkHistograms = f["tailguard_queue_wait_seconds"]
        self.ttft: ChunkHistograms = f["tailguard_ttft_seconds"]
        self.itl: ChunkHistograms = f["tailguard_itl_seconds"]
        self.e2e: ChunkHistograms = f["tailguard_e2e_seconds"]
        self.prompt_tokens = f["tailguard_prompt_tokens"]
        self.output_tokens = f["tailguard_output_tokens"]
        self.rejected = f["tailguard_rejected"]
        self.slo = f["tailguard_slo"]
        self.requests = f["tailguard_requests"]
        self.unclassified = f["tailguard_unclassified_requests"]
        self.preemptions = f["tailguard_preemptions"]
        self.migrations = f["tailguard_migrations"]
        self.hedges = f["tailguard_hedges"]

    def _bind_backends(self, f: dict[str, Any]) -> None:
        """The families of backends and connections: load, caps, failures, retries, health."""
        self.inflight = f["tailguard_inflight"]
        self.concurrency_limit = f["tailguard_backend_concurrency_limit"]
        self.connections_closed = f["tailguard_connections_closed"]
        self.upstream_errors = f["tailguard_upstream_errors"]
        self.overrun_tokens = f["tailguard_upstream_overrun_tokens"]
        self._overran: set[str] = set()  # backends whose overrun was logged (once each)
        self.retries = f["tailguard_retries"]
        self.retries_denied = f["tailguard_retries_denied"]
        self.health_changes = f["tailguard_backend_health_changes"]
        self.ejections = f["tailguard_backend_ejections"]
        self.backend_healthy = f["tailguard_backend_healthy"]
        self.engine_requests = f["tailguard_backend_engine_requests"]
        self.backend_kind = f["tailguard_backend_kind"]

    def _bind_usage(self, f: dict[str, Any]) -> None:
        """The families of usage: by caller, by agent program, and the GenAI conventions' own."""
        self.caller_requests = f["tailguard_caller_requests"]
        self.caller_tokens = f["tailguard_caller_tokens"]
        self.caller_label = CallerLabels()
        self.program_calls = f["tailguard_program_calls"]
        self.programs = f["tailguard_programs"]
        self.genai_ttft: ChunkHistograms = f["gen_ai_server_time_to_first_token_seconds"]
        self.genai_tpot: ChunkHistograms = f["gen_ai_server_time_per_output_token_seconds"]
        self.genai_duration: ChunkHistograms = f["gen_ai_server_request_duration_seconds"]
        self.genai_tokens: ChunkHistograms = f["gen_ai_client_token_usage"]

    def observe(self, guard: str, stage: str, seconds: float, verdict: str) -> None:
        """One guard check's time and verdict (the guards' `Stats`)."""
        h = self._guard_seconds.get((guard, stage))
        if h is None:
            h = self._guard_seconds[guard, stage] = self.families["tailguard_guard_seconds"].labels(guard, stage)
        h.observe(seconds)
        c = self._guard_checks.get((guard, stage, verdict))
        if c is None:
            c = self._guard_checks[guard, stage, verdict] = self.families["tailguard_guard_checks"].labels(
                guard, stage, verdict)
        c.inc()

    def genai_usage(self, endpoint: str, backend: str) -> GenAIUsage:
        """The GenAI token children of a request by its route and the kind of its backend."""
        op = GENAI_OPERATION[endpoint]
        provider = self._kinds.get(backend, UNKNOWN_PROVIDER)
        u = self._genai.get((op, provider))
        if u is None:
            u = self._genai[op, provider] = GenAIUsage(self, op, provider, INPUT_MODALITY.get(endpoint, "unknown"))
        return u

    def overran(self, t: Request) -> None:
        """A request's backend sent or counted tokens past what it asked (`Tally`): counted, and
        said once per backend (a broken backend repeats itself; the counter counts each)."""
        self.overrun_tokens.labels(t.backend).inc(t.overrun_tokens)
        if t.backend not in self._overran:
            self._overran.add(t.backend)
            log.warning("backend %s generated %d tokens past what request %s asked; its caller was charged the "
                        "request's max_tokens (said once; tailguard_upstream_overrun_tokens_total counts each)",
                        t.backend, t.overrun_tokens, t.request_id)

    def cls(self, name: str) -> ClassMetrics:
        c = self._classes.get(name)
        if c is None:
            c = self._classes[name] = ClassMetrics(self, name)
        return c

    def inflight_of(self, backend: str) -> Any:
        g = self._inflight.get(backend)
        if g is None:
            g = self._inflight[backend] = self.inflight.labels(backend)
        return g

    def ended(self, e: Ended) -> None:
        """A request's one end (`gateway.lifecycle`): everything observed of it, counted once."""
        record_finish(self, e.request)

    def set_kind(self, backend: str, kind: str) -> None:
        old = self._kinds.get(backend)
        if old is not None and old != kind:
            self.backend_kind.remove(backend, old)
        self._kinds[backend] = kind
        self.backend_kind.labels(backend, kind).set(1)

    def add_backend(self, backend: str, kind: str, healthy: bool = True) -> None:
        """A backend the gateway serves from now on (at start, or added by a reload)."""
        self.backend_healthy.labels(backend).set(1 if healthy else 0)
        self.overrun_tokens.labels(backend)  # at 0 from the start: rate() sees the first overrun
        self.set_kind(backend, kind)

    def forget_backend(self, backend: str) -> None:
        """A removed backend has left: its gauges go (its counters stay, as history)."""
        self._inflight.pop(backend, None)
        kind = self._kinds.pop(backend, None)
        for gauge, labels in ((self.backend_healthy, (backend,)), (self.inflight, (backend,)),
                              (self.concurrency_limit, (backend,)),
                              (self.engine_requests, (backend, "running")), (self.engine_requests, (backend, "waiting")),
                              (self.backend_kind, (backend, kind or "")),
                              (self.families["tailguard_backend_stale"], (backend,))):
            try:
                gauge.remove(*labels)
            except KeyError:  # never set
                pass

    def export_state(self, front: Front, live: Live, now: float) -> None:
        """What a scrape reads from the front and the running config rather than counting as it
        happens: caps, class bounds, the config's identity and the capacity signal."""
        f = self.families
        views = [b for b in front.backends() if not b.retiring]
        for b in views:
            self._zeros(b.name, self._zeroed_backends, self._backend_counters)
        bound, limit = f["tailguard_class_queue_bound_seconds"], f["tailguard_class_queue_limit"]
        names = {spec.name for spec in front.params.classes}
        for gone in self._bounded - names:  # a reload removed the class: its bounds no longer hold
            bound.remove(gone)
            limit.remove(gone)
        self._bounded = names
        for spec in front.params.classes:
            self._zeros(spec.name, self._zeroed_classes, self._class_counters)
            bound.labels(spec.name).set(spec.max_queue_wait_s)
            limit.labels(spec.name).set(spec.max_queue_len)
            if spec.slo is not None:  # each target's series at 0 from the first scrape, as `_zeros` does
                for target in ("ttft", "tpot", "e2e"):
                    if getattr(spec.slo, f"{target}_s") is not None:
                        self.slo.labels(spec.name, target, "met")
                        self.slo.labels(spec.name, target, "missed")
        stale = f["tailguard_backend_stale"]
        for b in views:
            stale.labels(b.name).set(1 if b.stale else 0)
        self._export_capacity(front, now)
        config = (str(live.n) if live.n is not None else "", live.hash)
        if config != self._config:
            if self._config is not None:
                f["tailguard_config_info"].remove(*self._config)
            f["tailguard_config_info"].labels(*config).set(1)
            self._config = config

    def _export_capacity(self, front: Front, now: float) -> None:
        """The capacity signal's reading of each pool; a pool a reload emptied loses its gauges."""
        f = self.families
        needed, ready = f["tailguard_capacity_needed"], f["tailguard_capacity_ready"]
        readings = self.capacity.measure(front, now)
        for gone in self._pools - set(readings):
            needed.remove(gone)
            ready.remove(gone)
        self._pools = set(readings)
        for pool, r in readings.items():
            needed.labels(pool).set(r.needed)
            ready.labels(pool).set(r.ready)

    def _zeros(self, name: str, done: set[str], counters: tuple[tuple[Any, tuple[str, ...]], ...]) -> None:
        """A class's or backend's counters, at 0 from its first scrape: `rate()` and `increase()`
        then count its first refusal, retry or failure, which a series born at 1 would hide."""
        if name in done:
            return
        done.add(name)
        for counter, values in counters:
            for value in values:
                counter.labels(name, value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def record_finish(m: GatewayMetrics, t: Request) -> None:
    """Everything observed once when a request ends (its one outcome, tokens, TTFT, E2E). A
    request refused before it had a class is counted by status alone: no placeholder class."""
    if t.cls == NO_CLASS:
        m.unclassified.labels(str(t.status)).inc()
        return
    c = m.cls(t.cls)
    c.requests(t.outcome).inc()
    end = t.finished_at if t.finished_at is not None else t.arrived_at
    _record_latencies(m, c, t, end)
    m.capacity.ended(t.backend, t.cls, end, None if t.bound_at is None else end - t.bound_at)
    _record_usage(m, c, t)


def _record_latencies(m: GatewayMetrics, c: ClassMetrics, t: Request, end: float) -> None:
    """Its E2E, its TTFT and (of a success) time per output token, and each SLO target met or missed."""
    outcome = t.outcome
    op = GENAI_OPERATION[t.endpoint]
    c.e2e.observe(end - t.arrived_at)
    m.genai_duration.labels(op, t.cls).observe(end - t.arrived_at)
    if t.first_content_at is not None:
        ttft_s = t.first_content_at - t.arrived_at
        c.ttft.observe(ttft_s)
        if outcome is Outcome.SUCCESS:
            m.genai_ttft.labels(op, t.cls).observe(ttft_s)
            if t.output_tokens > 1:
                m.genai_tpot.labels(op, t.cls).observe((end - t.first_content_at) / (t.output_tokens - 1))
    if t.slo is not None:
        for target, met in judge(t.slo, outcome, end - t.arrived_at, t.ttft_s, t.output_tokens).items():
            m.slo.labels(t.cls, target, "met" if met else "missed").inc()


def _record_usage(m: GatewayMetrics, c: ClassMetrics, t: Request) -> None:
    """Its tokens, by class, by its program and by its caller; an overrun said."""
    prompt = t.prompt_tokens if t.answered else 0  # no engine took it: its prompt cost nothing
    if t.answered:  # the GenAI conventions count usage of operations that ran
        m.genai_usage(t.endpoint, t.backend).record(prompt, t.output_tokens)
    if prompt:
        c.prompt_tokens.inc(prompt)
    if t.output_tokens:
        c.output_tokens.inc(t.output_tokens)
    program = t.program
    if program is not None:
        m.program_calls.labels(t.cls, program.source).inc()
        if program.call == 1:
            m.programs.labels(t.cls, program.source).inc()
    if t.overrun_tokens:
        m.overran(t)
    if t.caller is not None:
        caller = m.caller_label(t.caller)  # `other` past the first callers seen: bounded series
        m.caller_requests.labels(caller, t.outcome.value).inc()
        if prompt:
            m.caller_tokens.labels(caller, "prompt").inc(prompt)
        if t.output_tokens:
            m.caller_tokens.labels(caller, "output").inc(t.output_tokens)
