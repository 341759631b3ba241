"""What the gateway tells operators: `tailguard_*` Prometheus collectors on a per-app registry,
the `Server-Timing` and `X-Tailguard-*` response headers, and one JSON access-log line per request.

The registry is per app so two gateways in one process (tests, benchmarks) never share counters.
Per-chunk work is one histogram observation through a label child fetched once per request.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from typing import Any, Iterator

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from tailguard.gateway.ops.log_buffer import BufferedLineHandler
from tailguard.gateway.request import Request
from tailguard.types import Outcome

ACCESS_LOGGER = "tailguard.access"
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds. Latency buckets span a loopback relay (ms) to a long generation (minutes).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5.0)

_access_log = logging.getLogger(ACCESS_LOGGER)


class ChunkHistogram:
    """A lock-free histogram for per-chunk (and per-request) observations: one bisect and two adds.

    prometheus_client's Histogram takes a lock per bucket increment; at tens of thousands of
    chunks a second that is most of the relay's own CPU. The event loop is single-threaded, so
    plain integers are safe; `ChunkHistograms` exports them at scrape time.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_zeros(self, n: int) -> None:
        """`n` chunks that arrived in the same read as the previous one: no gap."""
        self.counts[0] += n


class ChunkHistograms:
    """A labelled family of `ChunkHistogram`s, collected as a Prometheus histogram."""

    def __init__(self, name: str, doc: str, label: str, bounds: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.name, self.doc, self.label, self.bounds = name, doc, label, bounds
        self._children: dict[str, ChunkHistogram] = {}
        registry.register(self)

    def labels(self, value: str) -> ChunkHistogram:
        h = self._children.get(value)
        if h is None:
            h = self._children[value] = ChunkHistogram(self.bounds)
        return h

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.doc, labels=[self.label])]

    def collect(self) -> Iterator[Metric]:
        fam = HistogramMetricFamily(self.name, self.doc, labels=[self.label])
        for value, h in self._children.items():
            buckets: list[tuple[str, float]] = []
            acc = 0
            for bound, c in zip(self.bounds, h.counts):
                acc += c
                buckets.append((repr(float(bound)), acc))
            buckets.append(("+Inf", acc + h.counts[-1]))
            fam.add_metric([value], buckets, h.sum)
        yield fam


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


class GatewayMetrics:
    """All `tailguard_*` collectors of one gateway app.

        m = GatewayMetrics()
        m.cls("interactive").requests(Outcome.SUCCESS).inc()
        body = m.render()      # the /metrics payload
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queue_length = Gauge(
            "tailguard_queue_length", "Requests waiting in the gateway queue.", ["class"], registry=r)
        # The per-request histograms are lock-free too: prometheus_client's takes a lock per
        # bucket and per sum, and three of them per request are a share of its fixed cost.
        self.queue_wait = ChunkHistograms(
            "tailguard_queue_wait_seconds", "Time from arrival to being bound to a backend.", "class",
            LATENCY_BUCKETS, r)
        self.ttft = ChunkHistograms(
            "tailguard_ttft_seconds", "Arrival to the first chunk carrying generated content.", "class",
            LATENCY_BUCKETS, r)
        self.itl = ChunkHistograms(
            "tailguard_itl_seconds", "Gaps between content chunks, per chunk.", "class", ITL_BUCKETS, r)
        self.e2e = ChunkHistograms(
            "tailguard_e2e_seconds", "Arrival to the last byte sent to the client.", "class", LATENCY_BUCKETS, r)
        self.prompt_tokens = Counter(
            "tailguard_prompt_tokens", "Prompt tokens (from upstream usage, else the estimate).", ["class"],
            registry=r)
        self.output_tokens = Counter(
            "tailguard_output_tokens", "Generated tokens (from upstream usage, else content chunks).", ["class"],
            registry=r)
        self.inflight = Gauge(
            "tailguard_inflight", "Requests bound to a backend and not yet finished.", ["backend"], registry=r)
        self.concurrency_limit = Gauge(
            "tailguard_backend_concurrency_limit", "The in-flight cap in force on a backend: its "
            "`max_concurrency`, or where it is `adaptive`, the cap its latency has set.", ["backend"], registry=r)
        self.rejected = Counter(
            "tailguard_rejected", "Requests refused by admission or expired in the queue.", ["class", "reason"],
            registry=r)
        self.upstream_errors = Counter(
            "tailguard_upstream_errors", "Failed upstream attempts by kind (connect, status, timeout, ...).",
            ["backend", "kind"], registry=r)
        self.requests = Counter(
            "tailguard_requests", "Requests by terminal outcome; each request is counted once.",
            ["class", "outcome"], registry=r)
        self.connections_closed = Counter(
            "tailguard_connections_closed", "Client connections the gateway closed on its own: header_timeout "
            "(no whole request head in time), evicted_idle (an idle one closed at the cap for a new one), "
            "over_cap (refused: every connection busy and the reserve taken).", ["reason"], registry=r)
        self.preemptions = Counter(
            "tailguard_preemptions", "Running requests suspended to free a slot for higher-priority work "
            "(each is resumed later where it stopped).", ["class"], registry=r)
        self.migrations = Counter(
            "tailguard_migrations", "Streams continued on another backend after theirs died or stalled "
            "mid-answer, by the failure that moved them (reset, disconnect, timeout_idle); a client's own "
            "cancel is never one.", ["class", "reason"], registry=r)
        self.backend_healthy = Gauge(
            "tailguard_backend_healthy", "1 if a backend takes requests: its health probes succeed and it is "
            "not ejected.", ["backend"], registry=r)
        self.hedges = Counter(
            "tailguard_hedges", "Hedged requests' second attempts: `sent`, then `won` (its content came first), "
            "`lost` (the first attempt's did) or `failed`.", ["class", "outcome"], registry=r)
        self.health_changes = Counter(
            "tailguard_backend_health_changes", "Changes of a backend's health, each once: `unhealthy` and `healthy` "
            "(active probes), `ejected` and `readmitted` (passive).", ["backend", "to"], registry=r)
        self.ejections = Counter(
            "tailguard_backend_ejections", "Backends taken out for a while after failing requests in a row "
            "(passive health), by the kind of the last failure.", ["backend", "kind"], registry=r)
        self.engine_requests = Gauge(
            "tailguard_backend_engine_requests", "Requests the engine itself reports running and waiting "
            "(its own load page, read with each health probe); waiting above 0 means the gateway's cap is "
            "above the engine's slots.", ["backend", "state"], registry=r)
        self.backend_kind = Gauge(
            "tailguard_backend_kind", "1 for the kind each backend is treated as (named in the config, or "
            "detected when `auto`).", ["backend", "kind"], registry=r)
        # Metering by caller (an API key's name), only when keys are configured: a bounded label.
        self.caller_requests = Counter(
            "tailguard_caller_requests", "Requests by caller and terminal outcome.", ["caller", "outcome"], registry=r)
        self.caller_tokens = Counter(
            "tailguard_caller_tokens", "Tokens by caller: prompt and output (from upstream usage, else the "
            "estimate and content chunks).", ["caller", "kind"], registry=r)
        self._classes: dict[str, ClassMetrics] = {}
        self._inflight: dict[str, Any] = {}
        self._kinds: dict[str, str] = {}

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

    def set_kind(self, backend: str, kind: str) -> None:
        old = self._kinds.get(backend)
        if old is not None and old != kind:
            self.backend_kind.remove(backend, old)
        self._kinds[backend] = kind
        self.backend_kind.labels(backend, kind).set(1)

    def add_backend(self, backend: str, kind: str, healthy: bool = True) -> None:
        """A backend the gateway serves from now on (at start, or added by a reload)."""
        self.backend_healthy.labels(backend).set(1 if healthy else 0)
        self.set_kind(backend, kind)

    def forget_backend(self, backend: str) -> None:
        """A removed backend has left: its gauges go (its counters stay, as history)."""
        self._inflight.pop(backend, None)
        kind = self._kinds.pop(backend, None)
        for gauge, labels in ((self.backend_healthy, (backend,)), (self.inflight, (backend,)),
                              (self.concurrency_limit, (backend,)),
                              (self.engine_requests, (backend, "running")), (self.engine_requests, (backend, "waiting")),
                              (self.backend_kind, (backend, kind or ""))):
            try:
                gauge.remove(*labels)
            except KeyError:  # never set
                pass

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
    """Everything observed once when a request ends (its one outcome, tokens, TTFT, E2E)."""
    outcome = t.outcome
    c = m.cls(t.cls)
    c.requests(outcome).inc()
    if t.finished_at is not None:
        c.e2e.observe(t.finished_at - t.arrived_at)
    if t.first_content_at is not None:
        c.ttft.observe(t.first_content_at - t.arrived_at)
    prompt = t.prompt_tokens if t.answered else 0  # no engine took it: its prompt cost nothing
    if prompt:
        c.prompt_tokens.inc(prompt)
    if t.output_tokens:
        c.output_tokens.inc(t.output_tokens)
    if t.caller is not None:
        m.caller_requests.labels(t.caller, outcome.value).inc()
        if prompt:
            m.caller_tokens.labels(t.caller, "prompt").inc(prompt)
        if t.output_tokens:
            m.caller_tokens.labels(t.caller, "output").inc(t.output_tokens)


def access_log(t: Request, *, method: str, path: str, logged_text: bool = False) -> None:
    """One JSON line per request on logger `tailguard.access`; its prompt and completion text
    only with `logged_text` (the app passes it only with `log_prompts: true`)."""
    if not _access_log.isEnabledFor(logging.INFO):
        return
    end = t.finished_at if t.finished_at is not None else t.arrived_at
    # `outcome` goes in as it is: orjson writes an enum member as its value, without the lookup.
    rec: dict[str, Any] = {
        "id": t.id, "method": method, "path": path, "status": t.status, "outcome": t.outcome,
        "class": t.cls, "backend": t.backend, "attempts": t.attempts,
        "queue_ms": None if t.bound_at is None else round((t.bound_at - t.arrived_at) * 1000.0, 3),
        "ttft_ms": None if t.first_content_at is None else round((t.first_content_at - t.arrived_at) * 1000.0, 3),
        "e2e_ms": round((end - t.arrived_at) * 1000.0, 3),
        "prompt_tokens": t.prompt_tokens, "output_tokens": t.output_tokens, "preemptions": t.preemptions,
    }
    if t.reason is not None:
        rec["reason"] = t.reason
    if t.migrations:
        rec["migrations"] = t.migrations
    if t.caller is not None:
        rec["caller"] = t.caller
    if t.output_estimated:
        rec["output_tokens_estimated"] = True
    if logged_text:
        if t.prompt_text is not None:
            rec["prompt"] = t.prompt_text
        if t.completion is not None:
            rec["completion"] = t.completion
    line = orjson.dumps(rec).decode()
    handlers = _access_log.handlers
    if len(handlers) == 1 and type(handlers[0]) is BufferedLineHandler and not _access_log.filters:
        handlers[0].add(line)  # the default handler (see `BufferedLineHandler.add`)
        return
    # The record made and handled directly: `Logger.info` would first walk the stack for the
    # caller's file and line (`findCaller`), which an access line never shows.
    _access_log.handle(_access_log.makeRecord(ACCESS_LOGGER, logging.INFO, "", 0, line, (), None))
