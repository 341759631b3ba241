"""The simulator's `/metrics` in vLLM's own names (`vllm:*`), so anything that reads vLLM reads it,
and its GPU's in the DCGM exporter's (`DCGM_FI_*`, modelled by `sim.gpu`; `wire.dcgm` has the names),
so a page from `tailguard sim` is an engine's page and a GPU's at once.

Gauges and counters are read from the engine's counters when scraped, so stepping the engine costs
nothing extra. Latency histograms are in simulated seconds (what a real engine of the configured
kind would report, whatever the `time_scale`), with vLLM's bucket bounds. Each app has its own
`CollectorRegistry`, so several simulators can run in one process.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from tailguard.sim.engine import Engine
from tailguard.sim.gpu import GpuMeter, GpuReading
from tailguard.wire import dcgm

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Bucket bounds as vLLM defines them (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)


class Histogram:
    """A histogram that takes a count with each value: all decode tokens of one step share one
    inter-token latency, so a step records them in one call instead of one per token."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        if n <= 0:
            return
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, c in zip(self.bounds, self.counts):
            acc += c
            out.append((repr(float(bound)), acc))
        out.append(("+Inf", self.count))
        return out


class SimMetrics:
    """Latency histograms fed by the server's engine loop, plus a collector over the engine."""

    def __init__(self, engine: Engine, model_name: str, now: Callable[[], float]) -> None:
        self.engine = engine
        self.model_name = model_name
        self.now = now  # simulated seconds, for the GPU's window
        spec = engine.config.gpu
        self.gpu = GpuMeter(spec) if spec is not None else None
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_BUCKETS)
        self.queue = Histogram(REQUEST_BUCKETS)
        self.prefill = Histogram(REQUEST_BUCKETS)  # first scheduled to first token, as vLLM's
        self.decode = Histogram(REQUEST_BUCKETS)  # first token to last
        self.behind_s = 0.0  # how late the server's loop woke for its last step (simulated seconds)
        self.token_id_prompts = 0  # requests whose prompt came as token ids (a continuation by ids)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        labels = ["model_name"]
        values = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        def hist(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
            f = HistogramMetricFamily(name, doc, labels=labels)
            f.add_metric(values, h.buckets(), h.sum)
            return f

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", e.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", e.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv.usage())
        yield counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.",
                      e.preemptions_total)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", e.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", e.generation_tokens_total)
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                      e.prefix_queried_tokens_total)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                      e.prefix_hit_tokens_total)
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=["model_name", "finished_reason"])
        for reason, n in e.finished_total.items():
            success.add_metric([self.model_name, reason], n)
        yield success
        yield hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft)
        yield hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl)
        yield hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.e2e)
        yield hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                   self.queue)
        yield hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
                   self.prefill)
        yield hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                   self.decode)
        yield counter("tailguard_sim_token_id_prompts", "Requests whose prompt came as token ids.",
                      self.token_id_prompts)
        yield gauge("tailguard_sim_behind_seconds",
                    "How late (simulated seconds) the simulator's loop woke for its last step; 0 when it keeps up.",
                    self.behind_s)
        if self.gpu is not None:
            e = self.engine
            reading = self.gpu.read(self.now(), e.kv.used_blocks * e.config.block_size, not e.idle())
            yield from gpu_families(reading, self.gpu.spec.model_name)


# The simulated card's labels, as dcgm-exporter labels GPU 0 of a node (`wire.dcgm.LABELS`).
GPU_LABELS = ("0", "GPU-00000000-0000-0000-0000-000000000000", "00000000:00:00.0", "nvidia0")


def gpu_families(r: GpuReading, model_name: str) -> Iterator[Metric]:
    """One reading as a DCGM exporter's gauges for one GPU."""
    values = {dcgm.GPU_UTIL: r.util_pct, dcgm.GR_ENGINE_ACTIVE: r.gr_engine_active, dcgm.SM_ACTIVE: r.sm_active,
              dcgm.FB_USED: r.fb_used_mib, dcgm.FB_FREE: r.fb_free_mib, dcgm.POWER_USAGE: r.power_w,
              dcgm.POWER_LIMIT: r.power_limit_w, dcgm.SM_CLOCK: r.sm_clock_mhz, dcgm.MAX_SM_CLOCK: r.max_sm_clock_mhz}
    labels = [*GPU_LABELS, model_name, "tailguard-sim"]
    for name, value in values.items():
        g = GaugeMetricFamily(name, dcgm.HELP[name], labels=list(dcgm.LABELS))
        g.add_metric(labels, value)
        yield g
