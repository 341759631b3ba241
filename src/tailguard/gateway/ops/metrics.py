"""What the gateway tells operators: `tailguard_*` Prometheus collectors on a per-app registry,
registered from the one table of metrics (`gateway.ops.catalog`), the `Server-Timing` and
`X-Tailguard-*` response headers, and one JSON access-log line per request.

The registry is per app so two gateways in one process (tests, benchmarks) never share counters;
it carries the standard process, platform and GC collectors too, so memory and CPU are there.
Per-chunk work is one histogram observation through a label child fetched once per request.
"""

from __future__ import annotations

import logging
import math
import platform
from datetime import datetime, timezone
from bisect import bisect_left
from typing import Any, Callable, Iterator

import orjson
import prometheus_client
from prometheus_client import (
    CollectorRegistry, Counter, Gauge, GCCollector, PlatformCollector, ProcessCollector, generate_latest,
)
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from tailguard import __version__
from tailguard.front.capacity import Capacity
from tailguard.front.front import Front
from tailguard.front.intake import NO_CLASS
from tailguard.front.retry import Again, continues_after, hurts_health, retry_of
from tailguard.gateway.ops.catalog import METRICS, MetricSpec
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.log_buffer import BufferedLineHandler
from tailguard.gateway.ops.metering import CallerLabels
from tailguard.gateway.request import Ended, Request
from tailguard.slo import judge
from tailguard.types import FailureKind, Outcome, RejectReason

ACCESS_LOGGER = "tailguard.access"
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
# gen_ai.operation.name of each endpoint (OpenTelemetry GenAI conventions).
# gen_ai.token.modality of a request's prompt and of its output. Engines give one usage count, not
# one per modality: a chat prompt may hold images, so its modality is not known (the conventions'
# `unknown`); a completions prompt and every answer of these routes are text.
INPUT_MODALITY = {"completions": "text"}
UNKNOWN_PROVIDER = "unknown"  # gen_ai.provider.name is required: a backend whose kind is not known yet
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

_access_log = logging.getLogger(ACCESS_LOGGER)
log = logging.getLogger("tailguard.gateway")


class ChunkHistogram:
    """A lock-free histogram for per-chunk (and per-request) observations: one bisect and two adds.

    prometheus_client's Histogram takes a lock per bucket increment; at tens of thousands of
    chunks a second that is most of the relay's own CPU. The event loop is single-threaded, so
    plain integers are safe; `ChunkHistograms` exports them at scrape time.
    """

    __slots__ = ("bounds", "counts", "sum", "_i", "_lo", "_hi")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        # The bucket the last value fell in, (_lo, _hi]: a stream's gaps mostly fall in one
        # bucket, and two comparisons cost a third of a `bisect` call.
        self._i = 0
        self._lo = self._hi = -math.inf

    def observe(self, value: float) -> None:
        if self._lo < value <= self._hi:
            self.counts[self._i] += 1
        else:
            b = self.bounds
            self._i = i = bisect_left(b, value)
            self._lo = b[i - 1] if i else -math.inf
            self._hi = b[i] if i < len(b) else math.inf
            self.counts[i] += 1
        self.sum += value

    def observe_zeros(self, n: int) -> None:
        """`n` chunks that arrived in the same read as the previous one: no gap."""
        self.counts[0] += n


class ChunkHistograms:
    """A labelled family of `ChunkHistogram`s, collected as a Prometheus histogram."""

    def __init__(self, spec: MetricSpec, registry: CollectorRegistry) -> None:
        self.spec = spec
        self._children: dict[tuple[str, ...], ChunkHistogram] = {}
        registry.register(self)

    def labels(self, *values: str) -> ChunkHistogram:
        h = self._children.get(values)
        if h is None:
            h = self._children[values] = ChunkHistogram(self.spec.buckets)
        return h

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.spec.name, self.spec.help, labels=list(self.spec.labels))]

    def collect(self) -> Iterator[Metric]:
        spec = self.spec
        fam = HistogramMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        for values, h in self._children.items():
            buckets: list[tuple[str, float]] = []
            acc = 0
            for bound, c in zip(spec.buckets, h.counts):
                acc += c
                buckets.append((repr(float(bound)), acc))
            buckets.append(("+Inf", acc + h.counts[-1]))
            fam.add_metric(list(values), buckets, h.sum)
        yield fam


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
        self.queue_length = f["tailguard_queue_length"]
        self.queue_wait: ChunkHistograms = f["tailguard_queue_wait_seconds"]
        self.ttft: ChunkHistograms = f["tailguard_ttft_seconds"]
        self.itl: ChunkHistograms = f["tailguard_itl_seconds"]
        self.e2e: ChunkHistograms = f["tailguard_e2e_seconds"]
        self.prompt_tokens = f["tailguard_prompt_tokens"]
        self.output_tokens = f["tailguard_output_tokens"]
        self.inflight = f["tailguard_inflight"]
        self.concurrency_limit = f["tailguard_backend_concurrency_limit"]
        self.connections_closed = f["tailguard_connections_closed"]
        self.rejected = f["tailguard_rejected"]
        self.slo = f["tailguard_slo"]
        self.upstream_errors = f["tailguard_upstream_errors"]
        self.overrun_tokens = f["tailguard_upstream_overrun_tokens"]
        self._overran: set[str] = set()  # backends whose overrun was logged (once each)
        self.retries = f["tailguard_retries"]
        self.retries_denied = f["tailguard_retries_denied"]
        self.requests = f["tailguard_requests"]
        self.unclassified = f["tailguard_unclassified_requests"]
        self.preemptions = f["tailguard_preemptions"]
        self.migrations = f["tailguard_migrations"]
        self.hedges = f["tailguard_hedges"]
        self.health_changes = f["tailguard_backend_health_changes"]
        self.ejections = f["tailguard_backend_ejections"]
        self.backend_healthy = f["tailguard_backend_healthy"]
        self.engine_requests = f["tailguard_backend_engine_requests"]
        self.backend_kind = f["tailguard_backend_kind"]
        self.caller_requests = f["tailguard_caller_requests"]
        self.caller_tokens = f["tailguard_caller_tokens"]
        self.caller_label = CallerLabels()
        self.program_calls = f["tailguard_program_calls"]
        self.programs = f["tailguard_programs"]
        self.genai_ttft: ChunkHistograms = f["gen_ai_server_time_to_first_token_seconds"]
        self.genai_tpot: ChunkHistograms = f["gen_ai_server_time_per_output_token_seconds"]
        self.genai_duration: ChunkHistograms = f["gen_ai_server_request_duration_seconds"]
        self.genai_tokens: ChunkHistograms = f["gen_ai_client_token_usage"]
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


def _ms(v: float) -> str:
    return f"{v * 1000.0:.3f}"


def server_timing(t: Request) -> str:
    """`Server-Timing` value: queue, connect (bind to upstream headers) and ttft, in ms."""
    parts: list[str] = []
    if t.bound_at is not None:
        parts.append(f"queue;dur={_ms(t.bound_at - t.arrived_at)}")
        if t.upstream_headers_at is not None:
            parts.append(f"connect;dur={_ms(t.upstream_headers_at - t.bound_at)}")
    if t.first_content_at is not None:
        parts.append(f"ttft;dur={_ms(t.first_content_at - t.arrived_at)}")
    return ", ".join(parts)


def response_headers(t: Request) -> dict[str, str]:
    """The `X-Tailguard-*` and `Server-Timing` headers for a response that has been bound."""
    h = {"X-Tailguard-Class": t.cls, "X-Tailguard-Backend": t.backend}
    if t.bound_at is not None:
        h["X-Tailguard-Queue-Ms"] = f"{(t.bound_at - t.arrived_at) * 1000.0:.1f}"
    st = server_timing(t)
    if st:
        h["Server-Timing"] = st
    if t.rate_headers is not None:
        h.update(t.rate_headers)
    return h


def record_finish(m: GatewayMetrics, t: Request) -> None:
    """Everything observed once when a request ends (its one outcome, tokens, TTFT, E2E). A
    request refused before it had a class is counted by status alone: no placeholder class."""
    if t.cls == NO_CLASS:
        m.unclassified.labels(str(t.status)).inc()
        return
    outcome = t.outcome
    c = m.cls(t.cls)
    c.requests(outcome).inc()
    op = GENAI_OPERATION[t.endpoint]
    end = t.finished_at if t.finished_at is not None else t.arrived_at
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
        for target, met in judge(t.slo, outcome, end - t.arrived_at, _ttft_s(t), t.output_tokens).items():
            m.slo.labels(t.cls, target, "met" if met else "missed").inc()
    m.capacity.ended(t.backend, t.cls, end, None if t.bound_at is None else end - t.bound_at)
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
        m.caller_requests.labels(caller, outcome.value).inc()
        if prompt:
            m.caller_tokens.labels(caller, "prompt").inc(prompt)
        if t.output_tokens:
            m.caller_tokens.labels(caller, "output").inc(t.output_tokens)


def _ttft_s(t: Request) -> float | None:
    return None if t.first_content_at is None else t.first_content_at - t.arrived_at


def _now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def access_log(t: Request, *, method: str, path: str, text: Callable[[str], str] | None = None) -> None:
    """One JSON line per request on logger `tailguard.access`; its prompt and completion text
    only with `text`, written through it (the lifecycle passes the redaction of `redaction:`, and
    only with `log_prompts: true`). The guards' verdicts other than pass, when there were any."""
    if not _access_log.isEnabledFor(logging.INFO):
        return
    end = t.finished_at if t.finished_at is not None else t.arrived_at
    # `outcome` goes in as it is: orjson writes an enum member as its value, without the lookup.
    rec: dict[str, Any] = {
        "ts": _now_rfc3339(), "level": "info", "event": "access",
        "id": t.id, "request_id": t.request_id, "method": method, "path": path, "status": t.status,
        "outcome": t.outcome, "class": None if t.cls == NO_CLASS else t.cls, "model": t.model,
        "backend": t.backend, "attempts": t.counts.attempts,
        "queue_ms": None if t.bound_at is None else round((t.bound_at - t.arrived_at) * 1000.0, 3),
        "ttft_ms": None if t.first_content_at is None else round((t.first_content_at - t.arrived_at) * 1000.0, 3),
        "e2e_ms": round((end - t.arrived_at) * 1000.0, 3),
        "prompt_tokens": t.prompt_tokens, "output_tokens": t.output_tokens, "preemptions": t.counts.preemptions,
        "client": t.client, "user_agent": t.user_agent,
    }
    if t.reason is not None:
        rec["reason"] = t.reason
    counts = t.counts
    if counts.retries:
        rec["retries"] = counts.retries
    if counts.migrations:
        rec["migrations"] = counts.migrations
    if counts.hedges:
        rec["hedges"] = counts.hedges
    if t.caller is not None:
        rec["caller"] = t.caller
    if t.program is not None:  # its program by a digest (never the session or user id itself), and which call
        rec["program"], rec["program_call"], rec["program_source"] = t.program.id, t.program.call, t.program.source
    if t.slo is not None:  # each target: met or missed (`tailguard.slo`)
        rec["slo"] = judge(t.slo, t.outcome, end - t.arrived_at, _ttft_s(t), t.output_tokens)
        if t.slo.ttft_s is not None:
            rec["ttft_slo_ms"] = round(t.slo.ttft_s * 1000.0, 3)
    if t.output_estimated:
        rec["output_tokens_estimated"] = True
    if t.overrun_tokens:
        rec["overrun_tokens"] = t.overrun_tokens
    if t.verdicts:
        rec["guards"] = t.verdicts
    if text is not None:
        if t.prompt_text is not None:
            rec["prompt"] = text(t.prompt_text)
        if t.completion is not None:
            rec["completion"] = text(t.completion)
    _write_access(rec)


def route_access_log(*, request_id: str, method: str, path: str, status: int, reason: str | None,
                     client: str | None, user_agent: str | None) -> None:
    """The access line of a request no generation route took (a 404, a 405, a body too large
    for the route): so every status the gateway answers is in the log."""
    if _access_log.isEnabledFor(logging.INFO):
        _write_access({"ts": _now_rfc3339(), "level": "info", "event": "access", "request_id": request_id,
                       "method": method, "path": path, "status": status, "reason": reason, "client": client,
                       "user_agent": user_agent})


def _write_access(rec: dict[str, Any]) -> None:
    line = orjson.dumps(rec).decode()
    handlers = _access_log.handlers
    if len(handlers) == 1 and type(handlers[0]) is BufferedLineHandler and not _access_log.filters:
        handlers[0].add(line)  # the default handler (see `BufferedLineHandler.add`)
        return
    # The record made and handled directly: `Logger.info` would first walk the stack for the
    # caller's file and line (`findCaller`), which an access line never shows.
    _access_log.handle(_access_log.makeRecord(ACCESS_LOGGER, logging.INFO, "", 0, line, (), None))
