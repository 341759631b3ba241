"""The load generator: sends a workload's requests in a closed or open loop over one aiohttp session
and records each request's timeline in one process (`run_load`); `bench.run.run_bench` is the entrypoint,
which spreads a run over processes (`bench.workers`) when asked.

Honesty rules: in open loop every request has a due time fixed in advance, and latencies are
measured from it, so a slow generator cannot hide queueing; the gap between due and actual send
(dispatch lag) and the event loop's own lag are recorded, and `stats.validity` marks a run whose
dispatch lag P99 is above the threshold as invalid. One request's own way on the wire is
`sender.py`.

Before the clock starts, the target is checked (`target.probe`: one line and no load if it cannot
be measured) and the connections the first requests need are opened, so the first dispatch
measures the generator's pace, not its start-up. A `stop` event ends a run early: nothing more is
sent, requests in flight get `interrupt_grace_s` to finish, and those still running then are cut
and recorded as `interrupted`.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import gc
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import aiohttp

from tailguard import __version__
from tailguard.bench.agents import agent_workload
from tailguard.bench.sender import Sender
from tailguard.bench.sender import Timeouts as Timeouts  # part of BenchConfig, so importable here too
from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stalls import SchedClock, Stalls, host
from tailguard.bench.trace.plan import Replay, TraceFactory, TraceSpec, load_replay
from tailguard.bench.workload import (
    ArrivalProcess, Distribution, Endpoint, PlannedRequest, RequestFactory, Workload, load_workload, schedule,
    with_lengths,
)
from tailguard.bench.target import base_url, engine_name, gateway_config, probe, time_scale_for
from tailguard.bench.validity import DEFAULT_MAX_DISPATCH_LAG_S
from tailguard.errors import ConfigError

LOOP_TICK_S = 0.01
_START_LEAD_S = 0.05
# Connections opened before an open-loop run; a closed loop opens one per client.
_WARM_CONNECTIONS_OPEN = 16
_WARM_CONNECTIONS_MAX = 64


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


@dataclass(frozen=True, slots=True)
class LoadProgress:
    done: int
    total: int | None
    elapsed_s: float
    horizon_s: float | None
    in_flight: int
    failed: int


@dataclass(slots=True)
class RunResult:
    """Every request's record (warm-up included, flagged) and the run's description (`run.json`)."""

    records: list[RequestRecord]
    meta: dict[str, Any]


async def run_load(config: BenchConfig, progress: Callable[[LoadProgress], None] | None = None,
                   stop: asyncio.Event | None = None, origin: Callable[[], Awaitable[float]] | None = None,
                   ) -> RunResult:
    """Run one benchmark in this process; `progress` is called about four times a second from
    the event loop. Setting `stop` interrupts the run (`meta["interrupted"]` says when and how
    many were cut). A worker of a spread run (`bench.workers`) passes `origin`, which says when
    its clock starts (the same instant for all)."""
    replay: Replay | None = None
    base_dir: Path | None = None
    agents = None if config.trace is not None else agent_workload(config.workload)  # programs of calls
    if config.trace is not None:  # read and checked before anything connects
        replay = load_replay(config.trace)
        workload = TraceFactory(replay).workload
    elif agents is not None:  # programs of calls (`bench.programs`), else requests
        workload = agents.as_workload()
    elif isinstance(config.workload, Workload):
        workload = config.workload
    else:
        workload, base_dir = load_workload(config.workload)
    if replay is None:
        workload = with_lengths(workload, config.input_tokens, config.output_tokens, config.ignore_eos)
    if config.endpoint is not None:
        workload = workload.model_copy(update={"endpoint": config.endpoint})
    config.check(workload)
    connector = aiohttp.TCPConnector(limit=config.max_connections, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=None, connect=config.timeouts.connect_s)
    url = base_url(config.url)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        probe_s = config.timeouts.connect_s + 5.0
        target = await probe(session, url, api_key=config.api_key, timeout_s=probe_s, model=config.model)
        for extra in config.extra_urls:  # every server of a spread run must answer before the clock starts
            await probe(session, base_url(extra), api_key=config.api_key, timeout_s=probe_s, model=target.model)
        time_scale = time_scale_for(config.time_scale, target.time_scale, url)
        gateway = await gateway_config(session, url, api_key=config.api_key, timeout_s=probe_s)
        engine = None if gateway is not None else await engine_name(session, url, timeout_s=probe_s)
        factory: RequestFactory | TraceFactory
        if replay is not None:
            factory = TraceFactory(replay, seed=config.seed, model=target.model, endpoint=config.endpoint)
        else:
            factory = RequestFactory(workload, seed=config.seed, model=target.model, base_dir=base_dir)
        if agents is None:
            run = _Run(config, workload, factory, session, target.model, progress, stop, origin, time_scale)
        else:
            from tailguard.bench.programs import ProgramRun  # built on _Run: imported here, not at the top

            run = ProgramRun(agents, config, workload, factory, session, target.model, progress, stop, origin,
                             time_scale)
        result = await run.go()
    if isinstance(factory, TraceFactory):
        result.meta["trace"] = factory.describe()
    result.meta["gateway_config"] = gateway
    result.meta["target_time_scale"] = target.time_scale  # announced by a simulator (or a gateway before one)
    result.meta["engine"] = engine  # what the target says it is at /version, when no gateway was in front
    if time_scale != 1.0:
        rescale(result, time_scale)
    return result


def rescale(result: RunResult, time_scale: float) -> None:
    """Divide every recorded time by `time_scale` (wall seconds per simulated second)."""
    k = 1.0 / time_scale
    for r in result.records:
        r.scheduled_at *= k
        r.sent_at *= k
        r.ended_at *= k
        if r.first_token_at is not None:
            r.first_token_at *= k
        r.chunk_at = [t * k for t in r.chunk_at]
        if r.queue_ms is not None:
            r.queue_ms *= k
        if r.server_timing_s is not None:
            r.server_timing_s = {name: v * k for name, v in r.server_timing_s.items()}
    m = result.meta
    m["time_scale"] = time_scale
    m["times_in"] = "simulated seconds (wall seconds / time_scale)"
    m["max_dispatch_lag_s"] = m["max_dispatch_lag_s"] * k
    m["loop_lag_s"] = {key: (v * k if key != "samples" else v) for key, v in m["loop_lag_s"].items()}
    if m.get("interrupted"):
        m["interrupted"]["after_s"] *= k


class _Run:
    def __init__(self, config: BenchConfig, workload: Workload, factory: RequestFactory | TraceFactory,
                 session: aiohttp.ClientSession, model: str, progress: Callable[[LoadProgress], None] | None,
                 stop: asyncio.Event | None, origin: Callable[[], Awaitable[float]] | None = None,
                 time_scale: float = 1.0) -> None:
        self.config = config
        self.time_scale = time_scale
        self.origin = origin
        self.workload = workload
        self.factory = factory
        self.session = session
        self.model = model
        self.progress = progress
        self.stop = stop
        self.url = base_url(config.url)
        self.headers = {"Content-Type": "application/json"}
        if config.api_key:
            self.headers["Authorization"] = f"Bearer {config.api_key}"
        self.sender = Sender(session, tuple(base_url(u) for u in config.urls), self.headers, config.timeouts)
        self.records: list[RequestRecord] = []
        self.loop_lag_s: list[float] = []
        self.stalls = Stalls()
        self.in_flight = 0
        self.failed = 0
        self.total = len(factory) if isinstance(factory, TraceFactory) else (
            None if config.requests is None else config.requests + config.warmup_requests)
        self.horizon_s = None if config.duration_s is None else config.duration_s + config.warmup_s
        self.t0 = 0.0
        self._issued = 0
        self._stopping = False
        self._interrupted_after_s: float | None = None
        self._send_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def go(self) -> RunResult:
        started = _dt.datetime.now(_dt.timezone.utc)
        await self._warm()
        # A full collection over everything imported so far takes tens of milliseconds: long
        # enough to make the generator late. Freezing moves those objects out of the collector's
        # sight for the run, so only objects made during the run are ever scanned.
        gc.collect()
        gc.freeze()
        # perf_counter is the system's monotonic clock: one origin means the same for every worker.
        self.t0 = await self.origin() if self.origin is not None else time.perf_counter() + _START_LEAD_S
        self.sender.t0 = self.t0
        ticker = asyncio.create_task(self._tick())
        driver = asyncio.create_task(self._closed_loop() if self.config.concurrency is not None else self._open_loop())
        try:
            await self._until_done_or_stopped(driver)
        finally:
            gc.unfreeze()
            for task in (driver, ticker):
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        wall_s = time.perf_counter() - self.t0
        self._report_progress()
        self.records.sort(key=lambda r: r.index)
        return RunResult(self.records, self._meta(started, wall_s))

    async def _warm(self) -> None:
        """Open the connections the first requests will use, before the clock starts. The probe
        already ran the request path once; a cold connect per client would otherwise land in
        the first requests' latencies."""
        n = min(self.config.concurrency or _WARM_CONNECTIONS_OPEN, _WARM_CONNECTIONS_MAX)

        urls = self.sender.urls

        async def one(url: str) -> None:
            async with self.session.get(url + "/v1/models", headers=self.headers) as resp:
                await resp.read()

        try:
            async with asyncio.timeout(self.config.timeouts.connect_s + 5.0):
                await asyncio.gather(*(one(urls[i % len(urls)]) for i in range(n * len(urls))))
        except (aiohttp.ClientError, TimeoutError):
            pass  # the probe showed the target answers; a slow warm-up only costs the first requests

    async def _until_done_or_stopped(self, driver: asyncio.Task[None]) -> None:
        """Wait for the run's end or `stop`; then stop sending, give requests in flight the grace
        period, and cut those still running (each records itself as `interrupted`)."""
        if self.stop is None:
            await driver
            return
        stopped = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait({driver, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not driver.done():
            self._interrupted_after_s = max(0.0, time.perf_counter() - self.t0)  # may come before the clock starts
            self._stopping = True
            if self._send_task is not None:
                self._send_task.cancel()
            if not (await asyncio.wait({driver}, timeout=self.config.interrupt_grace_s))[0]:
                driver.cancel()
                await asyncio.wait({driver})
        if not driver.cancelled():
            driver.result()

    # --- the two loops ---

    def _more(self, due_s: float) -> bool:
        if self._stopping:
            return False
        if self.total is not None:
            return self._issued < self.total
        assert self.horizon_s is not None
        return due_s < self.horizon_s

    def _is_warmup(self, index: int, due_s: float) -> bool:
        return index < self.config.warmup_requests or due_s < self.config.warmup_s

    async def _closed_loop(self) -> None:
        await asyncio.gather(*(self._client() for _ in range(self.config.concurrency or 0)))

    async def _open_loop(self) -> None:
        # The sender is a task of its own so that an interrupt can cut its sleep until the next
        # due time without cutting the requests in flight.
        self._send_task = asyncio.create_task(self._send_open())
        await asyncio.wait({self._send_task})
        if not self._send_task.cancelled():
            self._send_task.result()
        while self._tasks:
            await asyncio.gather(*self._tasks)

    async def _send_open(self) -> None:
        c = self.config
        tasks = self._tasks
        for due_s, cls in self._arrivals():
            if not self._more(due_s):
                break
            req = self.factory.next(cls)  # built before its due time, off the clock
            self._issued += 1
            if req.index % c.workers != c.worker:
                continue  # another worker's: planned here too, so every worker's schedule is the one
            due_at = self.t0 + due_s
            while (delay := due_at - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self._one(req, due_s, self._is_warmup(req.index, due_s)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    def _arrivals(self) -> Iterator[tuple[float, str]]:
        """(due offset, class) in order: the trace's own instants, or the workload's open-loop schedule."""
        if isinstance(self.factory, TraceFactory):
            # A trace's seconds are the served model's: against a simulator at time scale X they
            # pass X times as fast on the wall, so its modelled engine sees the trace's own rate.
            scale = self.time_scale
            return ((at * scale, cls) for at, cls in self.factory.schedule())
        c = self.config
        return schedule(self.factory, rate=c.rate, process=c.arrival, burstiness=c.burstiness, seed=c.seed)

    async def _client(self) -> None:
        # Closed loop: a client is due again the moment its previous request ends (no think time).
        delay = self.t0 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        ready_s = max(0.0, time.perf_counter() - self.t0)
        assert isinstance(self.factory, RequestFactory)  # a trace is an open loop (BenchConfig.check)
        while self._more(ready_s):
            req = self.factory.next()
            self._issued += 1
            await self._one(req, ready_s, self._is_warmup(req.index, ready_s))
            ready_s = time.perf_counter() - self.t0

    # --- one request ---

    async def _one(self, req: PlannedRequest, due_s: float, warmup: bool, answer: list[str] | None = None,
                   ) -> RequestRecord:
        rec = RequestRecord(index=req.index, cls=req.cls, warmup=warmup, scheduled_at=due_s,
                            prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens, stream=req.stream,
                            session=req.session)
        self.records.append(rec)
        self.in_flight += 1
        try:
            await self.sender.send(req, rec, answer)
        finally:
            self.in_flight -= 1
            if not rec.ok and rec.error_kind != "interrupted":
                self.failed += 1
        return rec

    # --- bookkeeping ---

    async def _tick(self) -> None:
        """Event-loop lag: how late a 10 ms ticker wakes up, and where a tick later than the
        dispatch-lag threshold spent its time (`bench.stalls`). Also drives the progress callback."""
        perf = time.perf_counter
        stall_s = self.config.max_dispatch_lag_s  # wall seconds, as the ticker's
        clock = SchedClock()
        expected = perf() + LOOP_TICK_S
        next_report = woke = perf()
        sched = clock.read()
        self.stalls.measured = sched is not None
        try:
            while True:
                await asyncio.sleep(max(0.0, expected - perf()))
                now, before, sched = perf(), sched, clock.read()
                lag = max(0.0, now - expected)
                self.loop_lag_s.append(lag)
                if lag > stall_s:
                    self.stalls.add(now - woke, lag, before, sched)
                woke = now
                expected = max(expected + LOOP_TICK_S, now)
                if self.progress is not None and now >= next_report:
                    self._report_progress()
                    next_report = now + 0.25
        finally:
            clock.close()

    def _report_progress(self) -> None:
        if self.progress is not None:
            done = len(self.records) - self.in_flight
            self.progress(LoadProgress(done, self.total, max(0.0, time.perf_counter() - self.t0),
                                   self.horizon_s, self.in_flight, self.failed))

    def _meta(self, started: _dt.datetime, wall_s: float) -> dict[str, Any]:
        c = self.config
        lag = sorted(self.loop_lag_s)
        return {
            "tailguard_version": __version__,
            "started_at": started.isoformat(),
            "wall_s": round(wall_s, 6),
            "url": self.url,
            "urls": list(c.urls) if c.extra_urls else None,
            "model": self.model,
            "mode": "closed" if c.concurrency is not None else "open",
            "concurrency": c.concurrency,
            "rate": c.rate,
            "arrival": c.arrival if c.concurrency is None else None,
            "burstiness": c.burstiness if c.concurrency is None else None,
            "requests": c.requests,
            "duration_s": c.duration_s,
            "warmup_requests": c.warmup_requests,
            "warmup_s": c.warmup_s,
            "seed": c.seed,
            "timeouts": asdict(c.timeouts),
            "max_dispatch_lag_s": c.max_dispatch_lag_s,
            "time_scale": 1.0,
            "workers": c.workers,
            "interrupted": None if self._interrupted_after_s is None else {
                "after_s": round(self._interrupted_after_s, 6),
                "grace_s": c.interrupt_grace_s,
            },
            "workload": self.workload.model_dump(mode="json"),
            "slo": self.workload.slos(),
            "loop_lag_s": {
                "p50": lag[len(lag) // 2] if lag else 0.0,
                "p99": lag[min(len(lag) - 1, int(len(lag) * 0.99))] if lag else 0.0,
                "max": lag[-1] if lag else 0.0,
                "samples": len(lag),
            },
            "loop_stalls": self.stalls.as_dict() if self.stalls.measured else None,
            "host": host(),
        }
