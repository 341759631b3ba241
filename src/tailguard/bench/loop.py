"""One bench run's loop in this process: the connections warmed, the clock started, requests
sent in a closed loop (each client's next as its last ends) or an open loop (each at its due
time), the event loop's lag watched, an interrupt honoured with a grace, and the run described
(`run.json`'s meta). One request's own way on the wire is `sender.py`'s.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import gc
import time
from dataclasses import asdict, dataclass
from typing import Any, Awaitable, Callable, Iterator

import aiohttp

from tailguard import __version__
from tailguard.bench.config import BenchConfig
from tailguard.bench.recorder import RequestRecord
from tailguard.bench.sender import Sender
from tailguard.bench.stalls import SchedClock, Stalls, host
from tailguard.bench.target import base_url
from tailguard.bench.trace.plan import TraceFactory
from tailguard.bench.stream import PlannedRequest, RequestFactory, schedule
from tailguard.bench.workload import Workload

LOOP_TICK_S = 0.01
_START_LEAD_S = 0.05
# Connections opened before an open-loop run; a closed loop opens one per client.
_WARM_CONNECTIONS_OPEN = 16
_WARM_CONNECTIONS_MAX = 64


@dataclass(frozen=True, slots=True)
class LoadProgress:
    """What the progress callback is told, about four times a second."""

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



class Loop:
    """One run's state and its loops; `bench.programs.ProgramRun` starts programs on it instead of requests."""

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
