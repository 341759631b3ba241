"""One bench run's settings (`BenchConfig`) and what makes a run unmeasurable as asked (`check`:
a `ConfigError` naming the flags).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tailguard.bench.sender import Timeouts
from tailguard.bench.trace.plan import TraceSpec
from tailguard.bench.validity import DEFAULT_MAX_DISPATCH_LAG_S
from tailguard.bench.workload import ArrivalProcess, Distribution, Endpoint, Workload
from tailguard.errors import ConfigError


@dataclass(frozen=True)
class BenchConfig:
    """One run. Give `concurrency` (closed loop) or `rate` (open loop), and `requests` or
    `duration_s`; warm-up requests come on top of `requests` and are excluded from statistics.

        result = await run_bench(BenchConfig(url="http://127.0.0.1:8000", workload="seed-mixed",
                                             concurrency=16, requests=400))
    """

    url: str
    workload: str | Path | Workload = "seed-mixed"
    concurrency: int | None = None
    rate: float | None = None
    arrival: ArrivalProcess = "poisson"
    burstiness: float = 1.0
    requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    warmup_s: float = 0.0
    seed: int = 0
    model: str | None = None
    api_key: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    max_dispatch_lag_s: float = DEFAULT_MAX_DISPATCH_LAG_S
    max_connections: int = 10_000
    # Against the simulator run at --time-scale X, pass X: recorded times are divided by it, so
    # every latency reads in simulated seconds (what the modelled GPU would deliver). Validity
    # keeps its wall-clock meaning: the threshold is converted the same way. None: not given,
    # the scale the target announces, else 1 (`target.time_scale_for`).
    time_scale: float | None = None
    # Wall seconds requests in flight may take to finish after `stop` is set.
    interrupt_grace_s: float = 5.0
    # Open loop over this many processes (`bench.workers`): one schedule, worker `worker` sends
    # the requests whose index is `worker` modulo `workers`.
    workers: int = 1
    worker: int = 0
    # The route every class without its own is sent to (`tailguard bench --endpoint`); None: the workload's.
    endpoint: Endpoint | None = None
    # Replay a trace's arrivals and sizes instead of a workload (`bench --trace`): open loop, the
    # run as long as the trace (`TraceSpec.window`, `limit`).
    trace: TraceSpec | None = None
    # More servers to spread the requests over, round-robin by request index with `url` (AIPerf's
    # repeated --url): a fleet measured without a gateway in front.
    extra_urls: tuple[str, ...] = ()
    # Every class's prompt and answer lengths (`--input-tokens`, `--output-tokens`), and vLLM's
    # ignore_eos on every request (`--ignore-eos`; on by default with output_tokens and for a trace).
    input_tokens: Distribution | None = None
    output_tokens: Distribution | None = None
    ignore_eos: bool | None = None

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url, *self.extra_urls)

    def check(self, workload: Workload) -> None:
        """Raises `ConfigError` for a run that cannot be measured as asked."""
        if self.trace is not None:
            self._check_trace()
        else:
            self._check_workload(workload)
        self._check_common()

    def _check_trace(self) -> None:
        given = [flag for flag, v in (("--concurrency", self.concurrency), ("--rate", self.rate),
                                      ("--requests", self.requests), ("--duration", self.duration_s),
                                      ("--input-tokens", self.input_tokens), ("--output-tokens", self.output_tokens))
                 if v is not None]
        if given:
            raise ConfigError(f"a trace sets its own arrivals and length: {', '.join(given)} do not apply "
                              "(--speed, --window and --limit do)")

    def _check_workload(self, workload: Workload) -> None:
        own_arrivals = any(c.arrival is not None for c in workload.classes)
        if self.concurrency is not None and self.rate is not None:
            raise ConfigError("give --concurrency N (closed loop) or --rate R (open loop), not both")
        if self.concurrency is None and self.rate is None and not own_arrivals:
            raise ConfigError("give --concurrency N (closed loop) or --rate R (open loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError("--concurrency must be at least 1")
        if self.rate is not None and self.rate <= 0:
            raise ConfigError("--rate must be > 0")
        if self.burstiness <= 0:
            raise ConfigError("--burstiness must be > 0")
        if (self.requests is None) == (self.duration_s is None):
            raise ConfigError("give exactly one of --requests N or --duration S")
        if self.requests is not None and self.requests < 1:
            raise ConfigError("--requests must be at least 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ConfigError("--duration must be > 0")
        if self.workers > 1 and self.concurrency is not None:
            raise ConfigError("--workers spreads an open loop: give --rate, not --concurrency")

    def _check_common(self) -> None:
        if self.warmup_requests < 0 or self.warmup_s < 0:
            raise ConfigError("--warmup must be >= 0")
        t = self.timeouts
        if min(t.connect_s, t.first_token_s, t.total_s) <= 0:
            raise ConfigError("timeouts must be > 0")
        if self.max_connections < 1:
            raise ConfigError("max_connections must be at least 1")
        if self.time_scale is not None and self.time_scale <= 0:
            raise ConfigError("--time-scale must be > 0")
        if self.interrupt_grace_s < 0:
            raise ConfigError("--interrupt-grace must be >= 0")
        if self.workers < 1 or not 0 <= self.worker < self.workers:
            raise ConfigError("--workers must be at least 1")
